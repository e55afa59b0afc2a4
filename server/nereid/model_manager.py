"""ModelManager: which model versions are loaded, their state and reason, and serving.

Owns loading and unloading (import, instances, batcher), per-version state (READY,
UNAVAILABLE, LOADING, UNLOADING) with a reason, and the lookup the surfaces use to reach
a running model. Knows nothing about HTTP; user code never runs on the event loop here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from nereid.batcher import DynamicBatcher
from nereid.config import to_triton_json
from nereid.config.schema import InstanceGroup, ModelConfig
from nereid.context import ModelContext
from nereid.errors import (
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NereidError,
)
from nereid.inference import InferRequest
from nereid.instance import ModelInstance
from nereid.model_file import ModelClass, describe_exception, load_model_class, unload_model_module
from nereid.repository import ModelSource, VersionSource, list_model_names, read_model
from nereid.stats import ModelStats

__all__ = ["ModelManager", "ServingModel", "VersionStatus", "IndexEntry", "READY", "UNAVAILABLE", "LOADING", "UNLOADING"]

_log = logging.getLogger("nereid")

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index (Triton's shape: version/state/reason optional)."""

    name: str
    version: int | None = None
    state: str | None = None
    reason: str = ""


@dataclass(slots=True)
class VersionStatus:
    """State of one model version."""

    version: int
    state: str
    reason: str = ""


@dataclass(eq=False)
class ServingModel:
    """A READY model version, as the surfaces use it: its config (records and Triton
    JSON), statistics and ``infer``."""

    name: str
    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    stats: ModelStats
    batcher: DynamicBatcher
    instances: tuple[ModelInstance, ...]
    model_class: ModelClass
    labels: Mapping[str, list[str]] = field(default_factory=dict)

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]:
        """Run one request through the batcher; its own output rows come back."""
        return await self.batcher.infer(request, received_ns)


@dataclass(eq=False)
class _ModelRecord:
    """Everything the manager knows about one model name."""

    name: str
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    serving: dict[int, ServingModel] = field(default_factory=dict)
    source_reason: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelManager:
    """Loads models from a repository and serves their READY versions.

    ``mode`` is tritonserver's model control mode: ``none`` loads every model at start and
    refuses load/unload; ``explicit`` loads ``startup_models`` (``*``: all) and accepts
    load/unload; ``poll`` loads all and follows the folder.
    """

    def __init__(
        self,
        repository: Path,
        *,
        mode: str = "none",
        startup_models: Iterable[str] = (),
    ) -> None:
        self.repository = Path(repository)
        self.mode = mode
        self.startup_models = tuple(startup_models)
        self._records: dict[str, _ModelRecord] = {}
        # name -> latest READY version, for the hot path
        self._latest: dict[str, ServingModel] = {}
        self._startup_done = False
        self._expected: set[str] = set()
        self._gpu_count: int | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load the startup set for the control mode (models load concurrently)."""
        if self.mode == "explicit":
            names = list_model_names(self.repository) if "*" in self.startup_models else list(self.startup_models)
        else:
            names = list_model_names(self.repository)
        self._expected = set(names)
        # A model that fails to load is UNAVAILABLE with its reason; it never stops the others.
        await asyncio.gather(*(self.load(name) for name in names), return_exceptions=True)
        self._startup_done = True

    async def close(self) -> None:
        """Unload everything (draining in-flight requests)."""
        await asyncio.gather(*(self.unload(name) for name in list(self._records)))

    @property
    def startup_done(self) -> bool:
        return self._startup_done

    def is_ready(self, strict: bool = True) -> bool:
        """Server readiness: start-up finished and (strict) every model expected at start
        has at least one READY version."""
        if not self._startup_done:
            return False
        if not strict:
            return True
        return all(name in self._latest for name in self._expected)

    # -- serving lookup (hot path) -----------------------------------------------------

    def get(self, name: str, version: int | None = None) -> ServingModel:
        """The READY model version to serve, or Triton's error for why there is none."""
        if version is None:
            serving = self._latest.get(name)
            if serving is not None:
                return serving
            if name in self._records:
                raise ModelNotFoundError(
                    f"Request for unknown model: '{name}' has no available versions", model=name
                )
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found", model=name)
        record = self._records.get(name)
        if record is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found", model=name)
        serving = record.serving.get(version)
        if serving is not None:
            return serving
        if version in record.statuses:
            raise ModelNotReadyError(
                f"Request for unknown model: '{name}' version {version} is not at ready state",
                model=name,
            )
        raise ModelNotFoundError(
            f"Request for unknown model: '{name}' version {version} is not found", model=name
        )

    def serving_models(self) -> list[ServingModel]:
        """Every READY model version, by name then version."""
        return [
            serving
            for name in sorted(self._records)
            for _, serving in sorted(self._records[name].serving.items())
        ]

    def model_versions(self, name: str) -> list[ServingModel]:
        """READY versions of one model (lowest first); [] when none or unknown."""
        record = self._records.get(name)
        return [s for _, s in sorted(record.serving.items())] if record else []

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """The repository index: every model folder and every model the manager knows,
        with version, state and reason per version; never-loaded models by name only."""
        names = set(list_model_names(self.repository)) | set(self._records)
        entries: list[IndexEntry] = []
        for name in sorted(names):
            record = self._records.get(name)
            if record is None or (not record.statuses and not record.source_reason):
                if not ready_only:
                    entries.append(IndexEntry(name))
                continue
            if not record.statuses:
                if not ready_only:
                    entries.append(IndexEntry(name, None, UNAVAILABLE, record.source_reason))
                continue
            for version, status in sorted(record.statuses.items()):
                if ready_only and status.state != READY:
                    continue
                entries.append(IndexEntry(name, version, status.state, status.reason))
        return entries

    # -- load / unload -----------------------------------------------------------------

    async def load(self, name: str, config: ModelConfig | None = None) -> None:
        """Load (or reload) a model from the repository. New versions load (and start)
        while the old ones keep serving; traffic moves once they are READY; then the old
        versions drain and unload. Raises ModelLoadError when no version could load."""
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = _ModelRecord(name)
        async with record.lock:
            source = await asyncio.to_thread(read_model, self.repository, name, config)
            if source.config is None or source.error is not None:
                reason = source.error or "invalid config"
                record.source_reason = reason
                for missing in source.missing_versions:
                    record.statuses.setdefault(missing, VersionStatus(missing, UNAVAILABLE, reason))
                if not record.serving:
                    _log.error("failed to load '%s': %s", name, reason)
                else:
                    _log.error("failed to reload '%s' (the loaded versions keep serving): %s", name, reason)
                raise ModelLoadError(name, reason)
            record.source_reason = ""
            old = dict(record.serving)
            for missing in source.missing_versions:
                record.statuses[missing] = VersionStatus(
                    missing, UNAVAILABLE, f"{source.path}/{missing}: version folder not found"
                )
            results = await asyncio.gather(
                *(self._load_version(source, version, record) for version in source.versions)
            )
            loaded = {s.version: s for s in results if s is not None}
            if not loaded:
                reasons = "; ".join(
                    record.statuses[v.version].reason for v in source.versions if v.version in record.statuses
                )
                if old:
                    # Keep serving the old versions: a bad new version never takes them down.
                    for version, serving in old.items():
                        record.statuses[version] = VersionStatus(version, READY)
                raise ModelLoadError(name, reasons or f"failed to load '{name}'")
            record.serving = dict(loaded)
            self._refresh_latest(record)
            retired = [s for v, s in old.items() if loaded.get(v) is not s]
            for serving in retired:
                if serving.version not in loaded:
                    record.statuses[serving.version] = VersionStatus(serving.version, UNLOADING)
            for serving in retired:
                await self._retire(serving)
                if serving.version not in loaded:
                    record.statuses[serving.version] = VersionStatus(serving.version, UNAVAILABLE, "unloaded")

    async def unload(self, name: str) -> None:
        """Unload every version: new requests are refused at once, accepted ones finish."""
        record = self._records.get(name)
        if record is None:
            return
        async with record.lock:
            serving = list(record.serving.values())
            record.serving = {}
            self._refresh_latest(record)
            for s in serving:
                record.statuses[s.version] = VersionStatus(s.version, UNLOADING)
            for s in serving:
                await self._retire(s)
                record.statuses[s.version] = VersionStatus(s.version, UNAVAILABLE, "unloaded")
            self._expected.discard(name)

    async def _retire(self, serving: ServingModel) -> None:
        await serving.batcher.aclose()
        for instance in serving.instances:
            await instance.close()
        unload_model_module(serving.model_class)
        _log.info("successfully unloaded '%s' version %d", serving.name, serving.version)

    async def _load_version(
        self, source: ModelSource, version: VersionSource, record: _ModelRecord
    ) -> ServingModel | None:
        assert source.config is not None
        name = source.name
        previous = record.statuses.get(version.version)
        if previous is None or previous.state != READY:
            record.statuses[version.version] = VersionStatus(version.version, LOADING)
        _log.info("loading: %s:%d", name, version.version)
        instances: list[ModelInstance] = []
        try:
            config = self._resolve_kinds(source.config, source.path / "config.toml")
            config_json = to_triton_json(config)
            model_class = await asyncio.to_thread(load_model_class, version.model_file, name)
            for index, (group, device) in enumerate(self._placements(config)):
                del group
                context = ModelContext(
                    model_name=name,
                    model_version=version.version,
                    instance_name=f"{name}_{index}",
                    instance_index=index,
                    device=device,
                    kind="GPU" if device.startswith("cuda") else "CPU",
                    config=config_json,
                    parameters=dict(config.parameters),
                    model_dir=version.path,
                    max_batch_size=config.max_batch_size,
                    device_id=int(device.split(":")[1]) if device.startswith("cuda") else None,
                )
                instance = ModelInstance(model_class, context, config)
                await instance.start()
                instances.append(instance)
            labels = _load_labels(config, version.path, source.path)
            stats = ModelStats(name, version.version)
            batcher = DynamicBatcher.for_model(name, config, instances, stats)
            await batcher.__aenter__()
        except NereidError as exc:
            reason = exc.message
        except Exception as exc:  # anything user code or the filesystem throws
            _log.exception("loading %s:%d failed", name, version.version)
            reason = f"{version.model_file}: {describe_exception(exc)}"
        else:
            serving = ServingModel(
                name, version.version, config, config_json, stats, batcher, tuple(instances), model_class, labels
            )
            record.statuses[version.version] = VersionStatus(version.version, READY)
            _log.info("successfully loaded '%s' version %d", name, version.version)
            return serving
        for instance in instances:
            await instance.close()
        if previous is not None and previous.state == READY and version.version in record.serving:
            _log.error("failed to reload '%s' version %d (old version keeps serving): %s", name, version.version, reason)
            record.statuses[version.version] = VersionStatus(version.version, READY, "")
        else:
            record.statuses[version.version] = VersionStatus(version.version, UNAVAILABLE, reason)
            _log.error("failed to load '%s' version %d: %s", name, version.version, reason)
        return None

    def _refresh_latest(self, record: _ModelRecord) -> None:
        if record.serving:
            self._latest[record.name] = record.serving[max(record.serving)]
        else:
            self._latest.pop(record.name, None)

    # -- devices -----------------------------------------------------------------------

    def gpu_count(self) -> int:
        """GPUs torch can see; 0 without importing torch when no NVIDIA device node exists."""
        if self._gpu_count is None:
            self._gpu_count = _visible_gpus()
        return self._gpu_count

    def _resolve_kinds(self, config: ModelConfig, config_path: Path) -> ModelConfig:
        groups = config.instance_group or (InstanceGroup(name=config.name),)
        resolved: list[InstanceGroup] = []
        for index, group in enumerate(groups):
            kind = group.kind
            if kind == "KIND_AUTO":
                kind = "KIND_GPU" if self.gpu_count() > 0 else "KIND_CPU"
            if kind == "KIND_GPU":
                gpus = self.gpu_count()
                if gpus == 0:
                    raise ModelLoadError(
                        config.name,
                        f"{config_path}: instance_group[{index}].kind: KIND_GPU requested but no GPU is visible "
                        "(torch.cuda.is_available() is False)",
                    )
                for gpu in group.gpus:
                    if gpu >= gpus:
                        raise ModelLoadError(
                            config.name,
                            f"{config_path}: instance_group[{index}].gpus: GPU {gpu} does not exist "
                            f"(visible GPUs: {list(range(gpus))})",
                        )
                if not group.gpus:
                    group = dataclasses.replace(group, gpus=tuple(range(gpus)))
            resolved.append(dataclasses.replace(group, kind=kind, name=group.name or config.name))
        return dataclasses.replace(config, instance_group=tuple(resolved))

    @staticmethod
    def _placements(config: ModelConfig) -> list[tuple[InstanceGroup, str]]:
        placements: list[tuple[InstanceGroup, str]] = []
        for group in config.instance_group:
            if group.kind == "KIND_GPU":
                for gpu in group.gpus:
                    placements.extend((group, f"cuda:{gpu}") for _ in range(group.count))
            else:
                placements.extend((group, "cpu") for _ in range(group.count))
        return placements


def _visible_gpus() -> int:
    if not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as no GPU
        return 0


def _load_labels(config: ModelConfig, version_dir: Path, model_dir: Path) -> dict[str, list[str]]:
    """Label files named by outputs' ``label_filename`` (looked up in the version folder,
    then the model folder), one label per line, for the classification extension."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        for folder in (version_dir, model_dir):
            path = folder / output.label_filename
            if path.is_file():
                labels[output.name] = path.read_text(encoding="utf-8").splitlines()
                break
        else:
            raise ModelLoadError(
                config.name,
                f"{model_dir / output.label_filename}: label_filename of output "
                f"'{output.name}' not found",
            )
    return labels


