"""nereid.models.admin: the model-control operations' checks (version strings, control
mode, load parameters), each refusal worded with the model and what was wrong, before
the manager is asked anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nereid.errors import InvalidInputError, UnavailableError, UnsupportedError
from nereid.models import admin
from nereid.models.manager import ModelManager


@pytest.mark.parametrize(("given", "version"), [(None, None), ("", None), ("7", 7), (3, 3)])
def test_a_version_is_digits_or_absent(given: str | int | None, version: int | None) -> None:
    assert admin.parse_version(given) == version


@pytest.mark.parametrize("given", ["-1", "1.0", "latest", "\u0661", str(1 << 63)])
def test_anything_else_is_refused_as_triton_words_it(given: str) -> None:
    with pytest.raises(InvalidInputError, match=f"failed to get model version from specified version string '{given}'"):
        admin.parse_version(given)


def manager(tmp_path: Path, mode: str) -> ModelManager:
    return ModelManager(tmp_path, mode=mode)


def test_a_load_outside_explicit_mode_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="explicit model load / unload is not allowed"):
        asyncio.run(admin.load_model(manager(tmp_path, "none"), "m", {}))


def test_a_named_repository_is_unsupported(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="'repository_name' specification is not supported"):
        asyncio.run(admin.unload_model(manager(tmp_path, "explicit"), "m", {}, repository="other"))


def test_model_files_over_the_network_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="load of model 'm': parameter 'file:1/model.py' refused"):
        asyncio.run(admin.load_model(manager(tmp_path, "explicit"), "m", {"file:1/model.py": "AAAA"}))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{not json", "load request for 'm' \\(parameters.config\\): failed to parse the JSON text"),
        ("[1]", "load request for 'm' \\(parameters.config\\): expected a JSON object, got list"),
    ],
    ids=["not-json", "not-an-object"],
)
def test_a_config_parameter_must_be_a_json_object(tmp_path: Path, config: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        asyncio.run(admin.load_model(manager(tmp_path, "explicit"), "m", {"config": config}))


def test_unload_dependents_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="parameter 'unload_dependents': expected a boolean, got str"):
        asyncio.run(admin.unload_model(manager(tmp_path, "explicit"), "m", {"unload_dependents": "yes"}))
