"""Scan a model repository folder: which models exist, their configs and their versions.

Owns the folder layout (config.toml, or Triton's config.pbtxt, or neither when the model
file's ``auto_complete_config`` supplies it) and the version policy. Runs no user code
except a TritonPythonModel's ``auto_complete_config`` (triton_python/auto_complete.py);
importing models is model_file.py's. Knows nothing about loading state or HTTP.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nereid.config import load_model_config
from nereid.config.pbtxt import PBTXT_FILE, load_pbtxt_config, read_pbtxt
from nereid.config.schema import ModelConfig, VersionPolicy
from nereid.errors import ConfigError, InvalidInputError, NereidError
from nereid.triton_python.auto_complete import auto_complete_config

__all__ = [
    "CONFIG_FILE",
    "PBTXT_FILE",
    "ModelSource",
    "VersionSource",
    "check_model_name",
    "is_model_folder",
    "Repositories",
    "RepositoryScan",
    "duplicate_model_message",
    "list_model_names",
    "scan_repositories",
    "read_model",
    "read_model_in",
    "select_versions",
]

_log = logging.getLogger("nereid")

CONFIG_FILE = "config.toml"
_MODEL_FILE = "model.py"
#: The longest folder name the filesystem takes, in bytes (NAME_MAX on Linux and macOS).
_NAME_MAX = 255


@dataclass(frozen=True, slots=True)
class VersionSource:
    """One version of a model: its folder and model file."""

    version: int
    path: Path
    model_file: Path


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model folder as found on disk.

    ``config`` is None and ``error`` says why when the folder cannot be served at all
    (missing or invalid config.toml, no version folder). ``versions`` are the versions the
    version policy selects, lowest first; ``missing_versions`` are versions a ``specific``
    policy names that have no folder.
    """

    name: str
    path: Path
    config: ModelConfig | None
    error: str | None
    versions: tuple[VersionSource, ...] = ()
    missing_versions: tuple[int, ...] = ()


def list_model_names(root: Path) -> list[str]:
    """Every direct subfolder of ``root`` that is a model folder (``is_model_folder``),
    sorted. Names starting with ``.`` or ``_`` are ignored, as are other folders."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    names = [
        entry.name
        for entry in entries
        if entry.is_dir() and not entry.name.startswith((".", "_")) and is_model_folder(Path(entry.path))
    ]
    return sorted(names)


@dataclass(frozen=True, slots=True)
class RepositoryScan:
    """The model folders of several repositories together (``--model-repository`` given
    more than once): ``roots`` maps each model name found in exactly one repository to
    that repository; ``duplicates`` maps a name found in several to all of them, in the
    order the repositories were given. As in Triton, a duplicated name is no model."""

    roots: dict[str, Path]
    duplicates: dict[str, tuple[Path, ...]]


class Repositories:
    """The repository folders one server serves (``--model-repository``, repeatable), read
    together. ``scan`` logs each name newly found in several of them (Triton logs it at
    every poll; once is enough to say why the model went)."""

    def __init__(self, folders: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
        paths = [folders] if isinstance(folders, (str, os.PathLike)) else list(folders)
        if not paths:
            raise ValueError("model repository: expected at least one folder")
        #: the folders, in the order given
        self.folders: tuple[Path, ...] = tuple(Path(path) for path in paths)
        self._duplicates: dict[str, tuple[Path, ...]] = {}  # at the last logged scan

    def __str__(self) -> str:
        return ", ".join(str(path) for path in self.folders)

    def scan(self, *, log_duplicates: bool = True) -> RepositoryScan:
        scan = scan_repositories(self.folders)
        if log_duplicates:
            for name, where in scan.duplicates.items():
                if self._duplicates.get(name) != where:
                    _log.error("%s (it is not loaded)", duplicate_model_message(name, where))
            self._duplicates = dict(scan.duplicates)
        return scan

    def read_model(self, name: str, config: ModelConfig | None = None) -> ModelSource:
        return read_model_in(self.folders, name, config)


def scan_repositories(repositories: Sequence[Path]) -> RepositoryScan:
    """Which repository holds each model folder (``list_model_names`` of each), names
    sorted; a name held by several goes to ``duplicates`` instead."""
    found: dict[str, list[Path]] = {}
    for root in repositories:
        for name in list_model_names(root):
            found.setdefault(name, []).append(root)
    roots = {name: where[0] for name, where in sorted(found.items()) if len(where) == 1}
    duplicates = {name: tuple(where) for name, where in sorted(found.items()) if len(where) > 1}
    return RepositoryScan(roots, duplicates)


def duplicate_model_message(name: str, repositories: Sequence[Path]) -> str:
    """Triton's words for a model name in several repositories, with the folders."""
    folders = " and ".join(str(root / name) for root in repositories)
    return f"model '{name}' is not unique across all model repositories: {folders}"


def is_model_folder(folder: Path) -> bool:
    """A folder with config.toml or config.pbtxt, or with a model file and no config (a
    Triton model whose ``auto_complete_config`` supplies it, or a mistake: listed either
    way, UNAVAILABLE with the reason when no config comes of it)."""
    try:
        if (folder / CONFIG_FILE).is_file() or (folder / PBTXT_FILE).is_file():
            return True
        return _model_file_without_config(folder) is not None
    except OSError:
        return False


def _model_file_without_config(folder: Path) -> Path | None:
    """The model.py of an unversioned folder, or of its lowest numbered version folder."""
    return _model_file_in(folder, _MODEL_FILE)


def _model_file_in(folder: Path, filename: str) -> Path | None:
    """``filename`` in the folder itself, else in its lowest numbered version folder that has it."""
    if (folder / filename).is_file():
        return folder / filename
    versions = sorted(int(e.name) for e in os.scandir(folder) if e.is_dir() and e.name.isdigit())
    for version in versions:
        candidate = folder / str(version) / filename
        if candidate.is_file():
            return candidate
    return None


def _read_config(folder: Path, name: str) -> ModelConfig:
    """The folder's config: config.toml, or config.pbtxt, completed by the model's
    ``auto_complete_config`` when it has one (as Triton does), or that alone. Raises
    ConfigError naming the file (or the folder)."""
    toml, pbtxt = folder / CONFIG_FILE, folder / PBTXT_FILE
    has_toml, has_pbtxt = toml.is_file(), pbtxt.is_file()
    if has_toml and has_pbtxt:
        raise ConfigError(
            str(folder), "", detail=f"holds both {CONFIG_FILE} and {PBTXT_FILE}: keep one of them (nereid reads either)"
        )
    if has_toml:
        return load_model_config(toml, name)
    data = read_pbtxt(pbtxt) if has_pbtxt else None
    model_file = _model_file_without_config(folder) if data is None else _model_file_of(folder, data)
    if model_file is not None:
        completed = auto_complete_config(model_file, data if data is not None else {"name": name, "backend": "python"})
        if completed is not None:
            return load_pbtxt_config(pbtxt, name, completed, source=f"{model_file} (auto_complete_config)")
    if data is None:
        raise ConfigError(
            str(folder), "",
            detail=f"no {CONFIG_FILE} or {PBTXT_FILE} (and no TritonPythonModel.auto_complete_config in the model "
            "file to supply one): add one of them",
        )
    return load_pbtxt_config(pbtxt, name, data)


def _model_file_of(folder: Path, data: dict[str, object]) -> Path | None:
    return _model_file_in(folder, str(data.get("default_model_filename") or _MODEL_FILE))


def check_model_name(name: str) -> None:
    """Refuse a model name that is not a plain folder name of the repository.

    A model name is the name of a direct subfolder: no path separator, no NUL, not empty,
    not longer than a folder name can be (NAME_MAX bytes), and not starting with ``.``
    (which also rules out ``.`` and ``..``) or ``_`` (such folders are ignored). Checked
    before any path is built from the name, so a request can never reach outside the
    repository, nor make the filesystem fail. Raises InvalidInputError naming the model.
    """
    problem = None
    size = len(name.encode("utf-8", "surrogatepass"))
    if not name:
        problem = "it is empty"
    elif size > _NAME_MAX:
        problem = f"it is {size} bytes long, and a folder name has at most {_NAME_MAX}"
    elif "/" in name or "\\" in name or (os.altsep and os.altsep in name):
        problem = "it contains a path separator"
    elif "\x00" in name:
        problem = "it contains a NUL character"
    elif name.startswith("."):
        problem = "it starts with '.'"
    elif name.startswith("_"):
        problem = "it starts with '_' (such folders are ignored in the repository)"
    if problem is not None:
        raise InvalidInputError(
            f"invalid model name '{name}': expected the name of a folder in the model "
            f"repository, but {problem}",
            model=name,
        )


def read_model(root: Path, name: str, config: ModelConfig | None = None) -> ModelSource:
    """Read one model folder. ``config`` (from a load request's override) replaces
    its config file when given. Never raises for a bad model: the reason goes to ``error``.
    Raises InvalidInputError for a name that is not a folder name (check_model_name)."""
    check_model_name(name)
    folder = root / name
    try:
        if not folder.is_dir():
            return ModelSource(name, folder, None, f"{folder}: model folder not found")
    except OSError as exc:  # not "no such folder" (is_dir says False for that): unreadable
        return ModelSource(name, folder, None, _unreadable(folder, exc))
    if config is None:
        try:
            config = _read_config(folder, name)
        except ConfigError as exc:
            return ModelSource(name, folder, None, exc.message)
        except NereidError as exc:  # pragma: no cover - the loader raises ConfigError only
            return ModelSource(name, folder, None, exc.message)
    try:
        available = _version_folders(folder)
    except OSError as exc:  # the folder went away (or lost permissions) mid-read
        return ModelSource(name, folder, None, _unreadable(folder, exc))
    if available:
        selected, missing = select_versions(sorted(available), config.version_policy)
        versions = tuple(
            VersionSource(v, available[v], available[v] / config.default_model_filename)
            for v in selected
        )
    else:
        # Unversioned layout: the model folder itself is version 1.
        selected, missing = select_versions([1], config.version_policy)
        versions = tuple(
            VersionSource(1, folder, folder / config.default_model_filename) for _ in selected
        )
    if not versions:
        return ModelSource(
            name,
            folder,
            config,
            f"{folder}: no version folder matches version_policy "
            f"(found {sorted(available) or [1]})",
            missing_versions=tuple(missing),
        )
    return ModelSource(name, folder, config, None, versions, tuple(missing))


def read_model_in(repositories: Sequence[Path], name: str, config: ModelConfig | None = None) -> ModelSource:
    """``read_model`` from whichever of ``repositories`` holds a folder ``name``. A name
    with a folder in several repositories is no model (Triton's rule): ``error`` names
    every folder. Raises InvalidInputError for a name that is not a folder name."""
    check_model_name(name)
    holders = [root for root in repositories if _has_folder(root, name)]
    if len(holders) > 1:
        return ModelSource(name, holders[0] / name, None, duplicate_model_message(name, holders))
    if not holders and len(repositories) > 1:
        searched = ", ".join(str(root) for root in repositories)
        return ModelSource(name, repositories[0] / name, None, f"no model folder '{name}' in any model repository ({searched})")
    return read_model(holders[0] if holders else repositories[0], name, config)


def _has_folder(root: Path, name: str) -> bool:
    try:
        return (root / name).is_dir()
    except OSError:  # there, but unreadable: read_model says why
        return True


def _unreadable(folder: Path, exc: OSError) -> str:
    """Why a model folder cannot be read: the folder and the OS error."""
    return f"{folder}: cannot read the model folder: {exc.strerror or exc}"


def select_versions(available: list[int], policy: VersionPolicy) -> tuple[list[int], list[int]]:
    """Apply a version policy to the sorted available versions.

    Returns (selected, missing): ``latest`` keeps the ``num_versions`` highest, ``all``
    keeps every one, ``specific`` keeps the listed ones that exist and reports the rest
    as missing.
    """
    if policy.kind == "all":
        return list(available), []
    if policy.kind == "specific":
        wanted = sorted(set(policy.versions))
        return [v for v in wanted if v in available], [v for v in wanted if v not in available]
    return list(available[-policy.num_versions :]), []


def _version_folders(folder: Path) -> dict[int, Path]:
    versions: dict[int, Path] = {}
    for entry in os.scandir(folder):
        if entry.is_dir() and entry.name.isdigit() and int(entry.name) > 0:
            versions[int(entry.name)] = Path(entry.path)
    return versions
