"""Several model repositories (``--model-repository`` repeated): the scan of their union,
a name in two of them refused as Triton refuses it, the options that carry them, and the
manager loading, listing and polling over every folder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nereid.cli import build_parser, options_from_args, options_from_keywords
from nereid.errors import ModelLoadError
from nereid.models.manager import IndexEntry, ModelManager
from nereid.options import ServerOptions, repository_paths
from nereid.repository.scan import read_model_in, scan_repositories
from nereid.repository.watch import fingerprint_scan
from tests.conftest import IDENTITY_CONFIG, RepoBuilder


def repositories(tmp_path: Path, count: int = 2) -> list[RepoBuilder]:
    builders = []
    for number in range(count):
        root = tmp_path / f"repo{number}"
        root.mkdir()
        builders.append(RepoBuilder(root))
    return builders


def test_the_scan_is_the_union_and_a_name_in_two_repositories_is_a_duplicate(tmp_path: Path) -> None:
    a, b, c = repositories(tmp_path, 3)
    a.add("x", IDENTITY_CONFIG)
    a.add("both", IDENTITY_CONFIG)
    b.add("y", IDENTITY_CONFIG)
    b.add("_private", IDENTITY_CONFIG)
    c.add("both", IDENTITY_CONFIG)
    (c.root / "not_a_model").mkdir()
    scan = scan_repositories([a.root, b.root, c.root])
    assert scan.roots == {"x": a.root, "y": b.root}
    assert list(scan.roots) == ["x", "y"]
    assert scan.duplicates == {"both": (a.root, c.root)}
    assert fingerprint_scan(scan).keys() == {"x", "y"}  # a duplicate is no model


def test_a_missing_repository_adds_nothing_to_the_scan(tmp_path: Path) -> None:
    [a] = repositories(tmp_path, 1)
    a.add("x", IDENTITY_CONFIG)
    assert scan_repositories([tmp_path / "gone", a.root]).roots == {"x": a.root}


def test_a_model_is_read_from_the_repository_that_holds_it(tmp_path: Path) -> None:
    a, b = repositories(tmp_path)
    folder = b.add("y", IDENTITY_CONFIG)
    source = read_model_in([a.root, b.root], "y")
    assert (source.error, source.path) == (None, folder)


def test_reading_a_duplicate_names_both_folders(tmp_path: Path) -> None:
    a, b = repositories(tmp_path)
    a.add("both", IDENTITY_CONFIG)
    b.add("both", IDENTITY_CONFIG)
    source = read_model_in([a.root, b.root], "both")
    assert source.config is None
    assert source.error == (
        f"model 'both' is not unique across all model repositories: {a.root / 'both'} and {b.root / 'both'}"
    )


def test_a_name_in_no_repository_names_every_folder_searched(tmp_path: Path) -> None:
    a, b = repositories(tmp_path)
    assert read_model_in([a.root, b.root], "none").error == (
        f"no model folder 'none' in any model repository ({a.root}, {b.root})"
    )
    # one repository: read_model's own words, as before
    assert read_model_in([a.root], "none").error == f"{a.root / 'none'}: model folder not found"


def test_options_take_one_folder_or_several() -> None:
    assert ServerOptions(model_repository=Path("m")).model_repositories == (Path("m"),)
    assert ServerOptions(model_repository=(Path("a"), Path("b"), Path("a"))).model_repositories == (Path("a"), Path("b"))
    assert repository_paths("m") == Path("m")
    assert repository_paths(["m"]) == Path("m")
    assert repository_paths(["a", Path("b")]) == (Path("a"), Path("b"))
    with pytest.raises(ValueError, match="empty list"):
        repository_paths([])


def test_the_flag_repeats_and_the_keyword_takes_a_list() -> None:
    parse = build_parser().parse_args
    one = options_from_args(parse(["serve", "--model-repository", "a"]))
    assert one.model_repository == Path("a")  # one folder: exactly as before
    two = options_from_args(parse(["serve", "--model-repository", "a", "--model-repository", "b"]))
    assert two.model_repository == (Path("a"), Path("b"))
    assert options_from_keywords(["a", "b"], {}) == two
    assert options_from_keywords("a", {}) == one
    with pytest.raises(ValueError, match="empty list"):
        options_from_keywords([], {})


def run(roots: list[Path], scenario: Any, mode: str = "none") -> None:
    async def main() -> None:
        manager = ModelManager(roots, mode=mode, poll_secs=3600)  # the test polls by hand
        await manager.start()
        try:
            await scenario(manager)
        finally:
            await manager.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_manager_serves_both_and_shows_a_duplicate_unavailable_naming_both(tmp_path: Path) -> None:
    a, b = repositories(tmp_path)
    a.add("x", IDENTITY_CONFIG)
    b.add("y", IDENTITY_CONFIG)
    a.add("both", IDENTITY_CONFIG)
    b.add("both", IDENTITY_CONFIG)
    why = f"model 'both' is not unique across all model repositories: {a.root / 'both'} and {b.root / 'both'}"

    async def scenario(manager: ModelManager) -> None:
        assert manager.ready_models() == ["x", "y"]
        assert await manager.index() == [
            IndexEntry("both", state="UNAVAILABLE", reason=why),
            IndexEntry("x", 1, "READY"),
            IndexEntry("y", 1, "READY"),
        ]
        assert not manager.is_ready(strict=True)
        with pytest.raises(ModelLoadError) as caught:
            await manager.load("both")
        assert why in caught.value.message

    run([a.root, b.root], scenario)


def test_poll_loads_from_the_second_folder_and_unloads_a_name_that_becomes_a_duplicate(tmp_path: Path) -> None:
    a, b = repositories(tmp_path)
    a.add("x", IDENTITY_CONFIG)

    async def scenario(manager: ModelManager) -> None:
        b.add("y", IDENTITY_CONFIG)
        await manager.poll()  # seen
        changes = await manager.poll()  # held still: acted on
        assert changes.added == ("y",) and manager.ready_models() == ["x", "y"]
        b.add("x", IDENTITY_CONFIG)
        await manager.poll()
        changes = await manager.poll()
        assert changes.removed == ("x",) and manager.ready_models() == ["y"]
        why = f"model 'x' is not unique across all model repositories: {a.root / 'x'} and {b.root / 'x'}"
        assert [entry for entry in await manager.index() if entry.name == "x"] == [IndexEntry("x", 1, "UNAVAILABLE", why)]

    run([a.root, b.root], scenario, mode="poll")
