"""Scanning a repository: which folders are models, versions, version policy, reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from nereid.config.schema import VersionPolicy
from nereid.repository.scan import list_model_names, read_model, select_versions

CONFIG = """
max_batch_size = 0
[[input]]
name = "X"
data_type = "FP32"
dims = [1]
[[output]]
name = "Y"
data_type = "FP32"
dims = [1]
"""


def write(folder: Path, config: str = CONFIG, versions: tuple[int, ...] = ()) -> None:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(config)
    if not versions:
        (folder / "model.py").write_text("class Model:\n    def infer(self, inputs):\n        return {}\n")
    for v in versions:
        (folder / str(v)).mkdir()
        (folder / str(v) / "model.py").write_text("class Model:\n    def infer(self, inputs):\n        return {}\n")


def test_models_are_subfolders_with_config_toml_and_dot_or_underscore_folders_are_ignored(tmp_path: Path) -> None:
    write(tmp_path / "b")
    write(tmp_path / "a")
    write(tmp_path / ".hidden")
    write(tmp_path / "_private")
    (tmp_path / "no_config").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert list_model_names(tmp_path) == ["a", "b"]


def test_unversioned_folder_is_version_one(tmp_path: Path) -> None:
    write(tmp_path / "m")
    source = read_model(tmp_path, "m")
    assert source.error is None
    assert [v.version for v in source.versions] == [1]
    assert source.versions[0].model_file == tmp_path / "m" / "model.py"


def test_integer_subfolders_are_versions_and_latest_one_is_served_by_default(tmp_path: Path) -> None:
    write(tmp_path / "m", versions=(1, 3, 2))
    source = read_model(tmp_path, "m")
    assert [v.version for v in source.versions] == [3]
    assert source.versions[0].model_file == tmp_path / "m" / "3" / "model.py"


@pytest.mark.parametrize(
    ("policy", "selected", "missing"),
    [
        pytest.param(VersionPolicy("latest", num_versions=2), [2, 3], [], id="latest-2"),
        pytest.param(VersionPolicy("all"), [1, 2, 3], [], id="all"),
        pytest.param(VersionPolicy("specific", versions=(1, 3, 7)), [1, 3], [7], id="specific-with-missing"),
        pytest.param(VersionPolicy("latest", num_versions=9), [1, 2, 3], [], id="latest-more-than-exist"),
    ],
)
def test_version_policy_selects_versions(policy: VersionPolicy, selected: list[int], missing: list[int]) -> None:
    assert select_versions([1, 2, 3], policy) == (selected, missing)


def test_version_policy_from_config_toml(tmp_path: Path) -> None:
    write(tmp_path / "m", CONFIG + "\n[version_policy]\nall = {}\n", versions=(1, 2))
    assert [v.version for v in read_model(tmp_path, "m").versions] == [1, 2]


def test_invalid_config_gives_a_reason_naming_the_file_and_key(tmp_path: Path) -> None:
    write(tmp_path / "m", CONFIG.replace("max_batch_size = 0", 'max_batch_size = "4"'))
    source = read_model(tmp_path, "m")
    assert source.config is None
    assert source.error is not None
    assert source.error.startswith(f"{tmp_path / 'm' / 'config.toml'}: max_batch_size: expected")


def test_missing_model_folder_is_reported(tmp_path: Path) -> None:
    source = read_model(tmp_path, "ghost")
    assert source.error == f"{tmp_path / 'ghost'}: model folder not found"


def test_specific_policy_naming_no_existing_version_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "m", CONFIG + "\n[version_policy]\nspecific = { versions = [5] }\n", versions=(1,))
    source = read_model(tmp_path, "m")
    assert source.versions == ()
    assert source.error is not None and "no version folder matches version_policy" in source.error
    assert source.missing_versions == (5,)
