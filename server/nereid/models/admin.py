"""The admin requests of Triton's protocol, surface-neutral: readiness, server and model
metadata, configuration, statistics and the model repository (index, load, unload).

Owns what each answer holds and which error each failure is, in the JSON shapes of
Triton's HTTP protocol (gRPC builds its messages from the same dicts). Readiness, metadata
and config read a ``Lookup`` (the manager, or a front-end worker's ``Directory`` of it). Knows no HTTP and
no gRPC: ``nereid.http.endpoints`` and ``nereid.grpc.service`` are thin over it.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from nereid import __version__
from nereid.config import config_from_triton_json
from nereid.errors import InvalidInputError, ModelNotFoundError, UnavailableError, UnsupportedError
from nereid.models.directory import Counted, Lookup, StatsSource
from nereid.models.manager import ModelManager
from nereid.repository.scan import check_model_name

__all__ = [
    "EXTENSIONS", "load_model", "model_config", "model_metadata", "model_ready", "model_statistics", "parse_version",
    "repository_index", "server_metadata", "unload_model", "why_not_ready",
]

#: The protocol extensions nereid implements (server metadata lists them).
EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
)
# "trace" is left out on purpose: the trace settings answer in Triton's shape, but no
# traces are written, and listing it would promise them.

_MAX_VERSION = (1 << 63) - 1


def parse_version(value: str | int | None) -> int | None:
    """A version as a request names it -> int; None (the latest) when absent or empty.
    Digits only, as Triton: anything else is InvalidInputError."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and not (value.isdigit() and value.isascii()):
        raise InvalidInputError(f"failed to get model version from specified version string '{value}'")
    version = int(value)
    if version > _MAX_VERSION:
        raise InvalidInputError(f"failed to get model version from specified version string '{value}'")
    return version


def server_metadata() -> dict[str, Any]:
    return {"name": "nereid", "version": __version__, "extensions": list(EXTENSIONS)}


def model_ready(manager: Lookup, name: str, version: str | int | None) -> bool:
    """Whether the version can serve now. Not ready (never an error) for an unknown model
    or version and for a version none of whose instances can serve, as Triton's core
    answers; a malformed version string is an error."""
    return why_not_ready(manager, name, version) is None


def why_not_ready(manager: Lookup, name: str, version: str | int | None) -> str | None:
    """None when the version can serve now; else why not: what an infer on it would be
    told (with the reason a failed load left), or why none of its instances can serve. A
    malformed version string raises InvalidInputError."""
    number = parse_version(version)
    try:
        serving = manager.get(name, number)
    except (ModelNotFoundError, UnavailableError) as exc:
        return exc.message
    if serving.problem is None:
        return None
    return f"model '{name}' version {serving.version} is UNAVAILABLE: {serving.problem}"


def model_metadata(manager: Lookup, name: str, version: str | int | None) -> dict[str, Any]:
    serving = manager.get(name, parse_version(version))
    if version not in (None, ""):
        versions = [str(serving.version)]
    else:
        versions = [str(s.version) for s in manager.model_versions(name)]
    config = serving.config
    batch = [-1] if config.max_batch_size > 0 else []
    return {
        "name": name,
        "versions": versions,
        "platform": config.platform or config.backend,
        "inputs": [
            {"name": t.name, "datatype": t.data_type.wire_name, "shape": batch + list(t.dims)} for t in config.input
        ],
        "outputs": [
            {"name": t.name, "datatype": t.data_type.wire_name, "shape": batch + list(t.dims)} for t in config.output
        ],
    }


def model_config(manager: Lookup, name: str, version: str | int | None) -> dict[str, Any]:
    """The version's config in Triton's JSON form."""
    return manager.get(name, parse_version(version)).config_json


def model_statistics(source: StatsSource, name: str | None, version: str | int | None) -> dict[str, Any]:
    """Triton's statistics for every served version (no name), a model's versions, or one,
    from ``source``: the ModelManager, or a picture of its figures (the same answer)."""
    if not name:
        return {"model_stats": [_stats(s) for s in source.serving_models()]}
    number = parse_version(version)
    versions = source.model_versions(name)
    if not versions:
        raise InvalidInputError(f"requested model '{name}' is not available")
    if number is not None:
        versions = [s for s in versions if s.version == number]
        if not versions:
            raise InvalidInputError(f"requested model version is not available for model '{name}'")
    return {"model_stats": [_stats(s) for s in versions]}


def _stats(serving: Counted) -> dict[str, Any]:
    """A version's entry of Triton's statistics, with nereid's ``scheduling`` figures
    (where the time between batches goes); a model with process instances also says how
    often they were restarted (``instance_restarts``, nereid's)."""
    entry = serving.stats.snapshot()
    entry["scheduling"] = serving.stats.scheduling_json()
    if serving.has_process_instances:
        entry["instance_restarts"] = serving.restarts
    return entry


async def repository_index(manager: ModelManager, ready_only: bool) -> list[dict[str, Any]]:
    entries = []
    for entry in await manager.index(ready_only):
        row: dict[str, Any] = {"name": entry.name}
        if entry.version is not None:
            row["version"] = str(entry.version)
        if entry.state is not None:
            row["state"] = entry.state
        if entry.reason:
            row["reason"] = entry.reason
        entries.append(row)
    return entries


def _check_control(manager: ModelManager, name: str, repository: str | None) -> None:
    """Refuse a load/unload this server does not take: a named repository, a control mode
    other than explicit, a bad model name (before anything touches the filesystem)."""
    if repository:
        raise UnsupportedError("'repository_name' specification is not supported")
    if manager.mode != "explicit":
        # Triton's text for both NONE and POLL mode (model_repository_manager.cc).
        raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")
    check_model_name(name)


async def load_model(
    manager: ModelManager, name: str, parameters: Mapping[str, Any], repository: str | None = None
) -> None:
    """Load (or reload) ``name``; ``parameters`` may hold ``config``, a JSON text that
    replaces the model's config.toml. ModelLoadError says why a load failed."""
    _check_control(manager, name, repository)
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise InvalidInputError(
                f"load of model '{name}': parameter '{key}': expected a JSON string, got {type(value).__name__}"
            )
        if key.startswith("file:"):
            raise UnsupportedError(
                f"load of model '{name}': parameter '{key}' refused: nereid does not accept model files "
                "over the network; put the files in the model repository folder and load the model by name"
            )
    config = None
    if "config" in parameters:
        source = f"load request for '{name}' (parameters.config)"
        try:
            obj = json.loads(parameters["config"])
        except ValueError as exc:
            raise InvalidInputError(f"{source}: failed to parse the JSON text: {exc}") from exc
        if not isinstance(obj, dict):
            raise InvalidInputError(f"{source}: expected a JSON object, got {type(obj).__name__}")
        config = config_from_triton_json(obj, source=source, folder_name=name)
    await manager.load(name, config)


async def unload_model(
    manager: ModelManager, name: str, parameters: Mapping[str, Any], repository: str | None = None
) -> None:
    _check_control(manager, name, repository)
    if "unload_dependents" in parameters and not isinstance(parameters["unload_dependents"], bool):
        raise InvalidInputError(
            f"unload of model '{name}': parameter 'unload_dependents': expected a boolean, "
            f"got {type(parameters['unload_dependents']).__name__}"
        )
    await manager.unload(name, unload_dependents=parameters.get("unload_dependents") is True)

