"""ModelManager: which model versions are loaded, their state and reason, and serving.

Owns loading, reloading and unloading (import, instances, warmup, batcher), per-version
state (READY, UNAVAILABLE, LOADING, UNLOADING) with a reason, the poll-mode watcher task,
and the lookup the surfaces use to reach a running model. Knows nothing about HTTP; user
code never runs on the event loop here (imports and ``__init__`` run in threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Mapping

import numpy as np

from nereid.batcher import DynamicBatcher, OnAnswer, Ticket
from nereid.config import to_triton_json
from nereid.config.schema import ModelConfig
from nereid.context import ModelContext
from nereid.devices import GpuInventory, placements, resolve_instance_groups
from nereid.errors import (
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NereidError,
    UnavailableError,
)
from nereid.inference import InferRequest
from nereid.instance import ModelInstance
from nereid.model_faults import MODEL_FAULTS
from nereid.model_file import ModelClass, describe_exception, load_model_class, unload_model_module
from nereid.options import MODEL_CONTROL_MODES
from nereid.repository import CONFIG_FILE, ModelSource, VersionSource, check_model_name, list_model_names, read_model
from nereid.repository_watch import ChangeDetector, Changes, fingerprint_repository
from nereid.stats import ModelStats
from nereid.warmup import build_samples, run_warmup

__all__ = [
    "ModelManager",
    "ServingModel",
    "Ticket",
    "VersionStatus",
    "IndexEntry",
    "READY",
    "UNAVAILABLE",
    "LOADING",
    "UNLOADING",
    "UNLOADED",
]

_log = logging.getLogger("nereid")

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"
#: The reason of a version that was unloaded on purpose (Triton's word). Strict readiness
#: counts such a version as fine, any other UNAVAILABLE one as not ready.
UNLOADED = "unloaded"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index (Triton's shape: version/state/reason optional)."""

    name: str
    version: int | None = None
    state: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """State of one model version, and why (empty when there is nothing to say)."""

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
    #: set when this object stops taking traffic; ``successor`` when a reload of the
    #: same version replaced it.
    retired: bool = field(default=False, init=False, repr=False)
    successor: ServingModel | None = field(default=None, init=False, repr=False)

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]:
        """Run one request through the batcher; its own output rows come back.

        A caller that looked this object up just before a reload retired it is served by
        the object that replaced it; after an unload it gets Triton's "no available
        versions" error (the manager never hands out a retired object itself)."""
        outputs: dict[str, np.ndarray] = await self._current().batcher.infer(request, received_ns)
        return outputs

    def submit(self, request: InferRequest, received_ns: int | None, on_answer: OnAnswer) -> Ticket:
        """Queue one request without waiting (``infer`` for callback-driven callers):
        ``on_answer(outputs, error)`` is called once with its answer (``DynamicBatcher.submit``);
        ``ticket.withdraw()`` if the caller goes away."""
        return self._current().batcher.submit(request, received_ns, on_answer)

    def _current(self) -> ServingModel:
        serving = self
        while serving.successor is not None:
            serving = serving.successor
        if serving.retired:
            raise ModelNotFoundError(
                f"Request for unknown model: '{self.name}' has no available versions", model=self.name
            )
        return serving


@dataclass(eq=False)
class _ModelRecord:
    """Everything the manager knows about one model name.

    ``serving`` holds the objects that take traffic; ``statuses`` what the index shows
    per version; ``reason`` why the model has no version at all (its folder or config
    could not be read), shown as a version-less UNAVAILABLE row while ``statuses`` is
    empty. ``lock`` serialises load and unload of this model.
    """

    name: str
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    serving: dict[int, ServingModel] = field(default_factory=dict)
    reason: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def empty(self) -> bool:
        return not (self.statuses or self.serving or self.reason)


class ModelManager:
    """Loads models from a repository and serves their READY versions.

    ``mode`` is tritonserver's model control mode: ``none`` loads every model at start and
    the load/unload API is refused (by the HTTP layer); ``explicit`` loads
    ``startup_models`` (``*``: all) and accepts load/unload; ``poll`` loads all, then
    every ``poll_secs`` looks at the repository: new folders load, removed ones unload,
    changed ones reload, each once its folder has held still for one interval.

    Loading is a transaction per model, as in Triton: the versions the version policy
    selects load (and warm up) while whatever is loaded keeps serving. If every one of
    them becomes ready, traffic moves to them at once, and the previous objects drain
    (queued and running requests finish) and unload. If any one fails, the new objects
    are discarded and the model keeps serving exactly what it served before.

    How a failed load shows in the index (Triton's index only says READY there; nereid
    keeps the state truthful about traffic and puts the failure in the reason):

    - a version that failed and was not serving: UNAVAILABLE, with the failure;
    - a version that was serving (the failed load reloaded it, or meant to retire it):
      stays READY, with the reason ``reload failed, the previous load keeps serving:
      <failure>``;
    - a model whose folder or config could not be read: the same on its version rows
      (non-serving ones UNAVAILABLE with the reason), or one version-less UNAVAILABLE
      row when it never had versions.

    The next successful load clears these reasons. Strict readiness follows the states:
    a failed new version number (UNAVAILABLE) makes the server unready, as in Triton,
    while a failed reload of a serving version (READY) does not.
    """

    def __init__(
        self,
        repository: Path,
        *,
        mode: str = "none",
        startup_models: Iterable[str] = (),
        poll_secs: float = 5.0,
    ) -> None:
        if mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model control mode: expected one of {', '.join(MODEL_CONTROL_MODES)}, got {mode!r}")
        if mode == "poll" and not poll_secs > 0:
            raise ValueError(f"--repository-poll-secs: expected a number of seconds > 0, got {poll_secs!r}")
        self.repository = Path(repository)
        self.mode = mode
        self.startup_models = tuple(startup_models)
        self.poll_secs = poll_secs
        self._records: dict[str, _ModelRecord] = {}
        # name -> latest READY version, for the hot path
        self._latest: dict[str, ServingModel] = {}
        self._startup_done = False
        self._closing = False
        self._detector: ChangeDetector | None = None
        self._poller: asyncio.Task[None] | None = None
        self._gpus = GpuInventory()
        # Model constructors run one at a time (each on its instance's own thread): user
        # __init__ code imports libraries, and some (transformers' lazy modules) are not
        # safe to import from two threads at once. Loading stays off the event loop.
        self._construct_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load the startup set for the control mode (models load concurrently); in poll
        mode then start watching the repository. A model that fails to load is
        UNAVAILABLE with its reason; it never stops the others or the server."""
        baseline = None
        if self.mode == "poll":
            # Fingerprints taken before loading: a change made while models load is seen
            # by the first polls and acted on.
            baseline = await asyncio.to_thread(fingerprint_repository, self.repository)
        if self.mode == "explicit" and "*" not in self.startup_models:
            names = list(dict.fromkeys(self.startup_models))
        else:
            names = await asyncio.to_thread(list_model_names, self.repository)
        await asyncio.gather(*(self._load_logged(name, startup=True) for name in names))
        self._startup_done = True
        if baseline is not None:
            self._detector = ChangeDetector(baseline)
            self._poller = asyncio.create_task(self._poll_forever(), name="nereid-repository-poll")
            _log.info("polling %s for changes every %g s", self.repository, self.poll_secs)

    async def aclose(self) -> None:
        """Stop polling, then unload everything (in-flight requests finish first)."""
        self._closing = True
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        names = list(self._records)
        results = await asyncio.gather(*(self.unload(name) for name in names), return_exceptions=True)
        for name, result in zip(names, results):
            if isinstance(result, Exception):  # one model's failure must not stop the others' unload
                _log.error("unloading '%s' at shutdown failed: %s", name, describe_exception(result))

    async def close(self) -> None:
        """The same as ``aclose()`` (the app's lifespan calls this name)."""
        await self.aclose()

    @property
    def startup_done(self) -> bool:
        return self._startup_done

    def is_ready(self, strict: bool = True) -> bool:
        """Server readiness, as tritonserver decides it.

        Never ready while the initial load runs or once shutdown began. With ``strict``
        (tritonserver's default) every model the manager knows must be fine: each of its
        versions READY, or UNAVAILABLE because it was unloaded on purpose; a version
        LOADING or failed, or a model whose config could not be read, makes the server
        not ready. Without ``strict`` the server is ready once the initial load is done.
        """
        if not self._startup_done or self._closing:
            return False
        if not strict:
            return True
        for record in self._records.values():
            if not record.statuses and record.reason:
                return False
            for status in record.statuses.values():
                if status.state != READY and not (status.state == UNAVAILABLE and status.reason == UNLOADED):
                    return False
        return True

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

    # -- index -------------------------------------------------------------------------

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """The repository index: every model folder (those never loaded by name only)
        and every model the manager knows, one row per version with state and reason;
        ``ready_only`` keeps READY rows only. The folder is read off the event loop."""
        folders = await asyncio.to_thread(list_model_names, self.repository)
        return self._entries(folders, ready_only)

    def states(self) -> list[IndexEntry]:
        """The rows of the models the manager knows (no folder scan): the start-up table."""
        return self._entries((), False)

    def _entries(self, folders: Iterable[str], ready_only: bool) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        for name in sorted(set(folders) | {n for n, r in self._records.items() if not r.empty}):
            record = self._records.get(name)
            if record is not None and record.statuses:
                entries.extend(
                    IndexEntry(name, version, status.state, status.reason)
                    for version, status in sorted(record.statuses.items())
                    if not ready_only or status.state == READY
                )
            elif ready_only:
                continue
            elif record is not None and record.reason:
                entries.append(IndexEntry(name, None, UNAVAILABLE, record.reason))
            else:
                entries.append(IndexEntry(name))
        return entries

    # -- load / unload -----------------------------------------------------------------

    async def load(self, name: str, config: ModelConfig | None = None) -> None:
        """Load or reload one model from the repository; ``config`` replaces its
        config.toml for this load (the load API's override).

        Returns once the new versions serve and the previous ones have drained and
        unloaded. Raises InvalidInputError for a name that is not a folder name (before
        any filesystem access), UnavailableError during shutdown, and ModelLoadError
        (``failed to load 'm', <why>``) when the model could not load; what served
        before then keeps serving (see the class docstring).
        """
        await self._load(name, config, startup=False)

    async def unload(self, name: str) -> None:
        """Unload every version of a model: new requests are refused at once (404 "has no
        available versions"), requests already accepted finish, then the instances close.
        Every version then reads UNAVAILABLE "unloaded". Unknown names are a no-op."""
        check_model_name(name)
        if name not in self._records:
            return
        async with self._locked(name) as record:
            retiring = dict(record.serving)
            for serving in retiring.values():
                serving.retired = True
            record.serving = {}
            self._refresh_latest(record)
            for version in retiring:
                record.statuses[version] = VersionStatus(version, UNLOADING)
            await asyncio.gather(*(self._retire(record, serving, keep_status=False) for serving in retiring.values()))
            for version, status in record.statuses.items():
                if status.state != READY:
                    record.statuses[version] = VersionStatus(version, UNAVAILABLE, UNLOADED)
            record.reason = ""

    async def poll(self) -> Changes:
        """Look at the repository once (poll mode's step): fingerprint every model folder
        off the event loop, and act on the changes that have held still for one poll:
        unload removed models, load new ones, reload changed ones. Returns what it acted
        on. Failures are logged and shown in the index, never raised."""
        if self._detector is None:
            self._detector = ChangeDetector(await asyncio.to_thread(fingerprint_repository, self.repository))
            return Changes()
        current = await asyncio.to_thread(fingerprint_repository, self.repository)
        changes = self._detector.observe(current)
        for name in changes.removed:
            _log.info("repository poll: '%s' was removed", name)
        for name in changes.added:
            _log.info("repository poll: '%s' was added", name)
        for name in changes.modified:
            _log.info("repository poll: '%s' changed", name)
        await asyncio.gather(
            *(self._unload_logged(name) for name in changes.removed),
            *(self._load_logged(name) for name in changes.added + changes.modified),
        )
        return changes

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_secs)
            try:
                await self.poll()
            except Exception:  # a failed poll must not end polling
                _log.exception("repository poll of %s failed", self.repository)

    async def _load_logged(self, name: str, startup: bool = False) -> None:
        try:
            await self._load(name, None, startup=startup)
        except ModelLoadError:
            pass  # logged, and shown in the index
        except NereidError as exc:
            _log.error("cannot load '%s': %s", name, exc.message)

    async def _unload_logged(self, name: str) -> None:
        try:
            await self.unload(name)
        except NereidError as exc:
            _log.error("cannot unload '%s': %s", name, exc.message)

    @contextlib.asynccontextmanager
    async def _locked(self, name: str) -> AsyncIterator[_ModelRecord]:
        """The model's record, created when missing, under its lock. A record left with
        nothing to say is dropped on the way out; a waiter that finds its record dropped
        takes the current one instead."""
        while True:
            record = self._records.setdefault(name, _ModelRecord(name))
            await record.lock.acquire()
            if self._records.get(name) is record:
                break
            record.lock.release()
        try:
            yield record
        finally:
            if record.empty:
                del self._records[name]
            record.lock.release()

    async def _load(self, name: str, config: ModelConfig | None, *, startup: bool) -> None:
        check_model_name(name)
        if self._closing:
            raise UnavailableError(f"cannot load '{name}': the server is shutting down")
        async with self._locked(name) as record:
            source = await asyncio.to_thread(read_model, self.repository, name, config)
            if source.config is None or source.error is not None:
                reason = source.error or f"{source.path}: invalid config"
                _log.error("failed to load '%s': %s", name, reason)
                # A load API call for something that is not a model folder (no folder, or
                # no config.toml and no override) leaves nothing behind: it never becomes
                # a model the server knows, nor makes the server unready. A model asked
                # for at start-up is remembered either way.
                is_model = config is not None or await asyncio.to_thread(
                    (source.path / CONFIG_FILE).is_file
                )
                if startup or record.statuses or is_model:
                    self._record_source_failure(record, source, reason)
                raise ModelLoadError(name, f"failed to load '{name}', {reason}", str(source.path))
            await self._load_versions(record, source)

    def _record_source_failure(self, record: _ModelRecord, source: ModelSource, reason: str) -> None:
        record.reason = reason
        for version, status in record.statuses.items():
            if status.state == READY:
                record.statuses[version] = VersionStatus(version, READY, _kept_serving(reason))
            else:
                record.statuses[version] = VersionStatus(version, UNAVAILABLE, reason)
        for missing in source.missing_versions:
            if missing not in record.serving:
                record.statuses[missing] = VersionStatus(missing, UNAVAILABLE, reason)

    async def _load_versions(self, record: _ModelRecord, source: ModelSource) -> None:
        """Load the selected versions while the old ones serve; swap or roll back."""
        name = record.name
        old = dict(record.serving)
        failures: dict[int, str] = {
            missing: f"{source.path / str(missing)}: version folder not found "
            f"(version_policy.specific lists version {missing})"
            for missing in source.missing_versions
        }
        for selected in source.versions:
            _log.info("loading: %s:%d", name, selected.version)
            if selected.version not in old:
                record.statuses[selected.version] = VersionStatus(selected.version, LOADING)
        tasks = [
            asyncio.create_task(self._load_version(source, selected), name=f"nereid-load-{name}:{selected.version}")
            for selected in source.versions
        ]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            # Shutdown during a load: versions that finished loading must still be closed.
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    await _close_serving(task.result())
            for selected in source.versions:
                if selected.version not in old:
                    record.statuses[selected.version] = VersionStatus(
                        selected.version, UNAVAILABLE, "load cancelled: the server is shutting down"
                    )
            raise
        loaded: dict[int, ServingModel] = {}
        for selected, result in zip(source.versions, results):
            if isinstance(result, ServingModel):
                loaded[selected.version] = result
            elif isinstance(result, ModelLoadError):
                failures[selected.version] = result.reason
            elif isinstance(result, asyncio.CancelledError):
                raise result
            else:  # pragma: no cover - _load_version converts every Exception
                failures[selected.version] = describe_exception(result)
        if failures:
            await self._roll_back(record, old, loaded, failures)
            detail = "".join(
                f"version {version} is at UNAVAILABLE state: {reason};" for version, reason in sorted(failures.items())
            )
            raise ModelLoadError(name, f"failed to load '{name}', {detail}", str(source.path))
        # Every version is ready: traffic moves in one step (no await between these lines).
        for version, serving in old.items():
            serving.successor = loaded.get(version)
            serving.retired = True
        record.serving = loaded
        record.reason = ""
        for version in loaded:
            record.statuses[version] = VersionStatus(version, READY)
        self._refresh_latest(record)
        for version in loaded:
            _log.info("successfully loaded '%s' version %d", name, version)
        for version in [v for v, s in record.statuses.items() if v not in loaded and v not in old and s.reason != UNLOADED]:
            # a failure of an earlier load, for a version this load no longer selects
            del record.statuses[version]
        for version in old:
            if version not in loaded:
                record.statuses[version] = VersionStatus(version, UNLOADING)
        await asyncio.gather(
            *(self._retire(record, serving, keep_status=serving.version in loaded) for serving in old.values())
        )

    async def _roll_back(
        self,
        record: _ModelRecord,
        old: dict[int, ServingModel],
        loaded: dict[int, ServingModel],
        failures: dict[int, str],
    ) -> None:
        """A load with a failed version: discard what did load; the old keeps serving."""
        name = record.name
        failed = ", ".join(str(v) for v in sorted(failures))
        for version, reason in sorted(failures.items()):
            _log.error("failed to load '%s' version %d: %s", name, version, reason)
            if version in old:
                _log.warning("'%s' version %d keeps serving its previous load", name, version)
                record.statuses[version] = VersionStatus(version, READY, _kept_serving(reason))
            else:
                record.statuses[version] = VersionStatus(version, UNAVAILABLE, reason)
        for version, serving in loaded.items():
            _log.info("discarding '%s' version %d: version %s of the same load failed", name, version, failed)
            if version in old:
                record.statuses[version] = VersionStatus(
                    version, READY, _kept_serving(f"version {failed} of the same load failed")
                )
            else:
                record.statuses[version] = VersionStatus(
                    version, UNAVAILABLE, f"not loaded: version {failed} of the same load failed"
                )
        for version in old:
            if version not in failures and version not in loaded:
                # serving on although the load meant to retire it
                record.statuses[version] = VersionStatus(
                    version, READY, _kept_serving(f"version {failed} failed to load")
                )
        await asyncio.gather(*(_close_serving(serving) for serving in loaded.values()))

    async def _retire(self, record: _ModelRecord, serving: ServingModel, *, keep_status: bool) -> None:
        """Drain and unload an object that no longer takes traffic. ``keep_status``: the
        same version number serves on (a reload), so its index row stays READY."""
        _log.info("unloading: %s:%d", serving.name, serving.version)
        await _close_serving(serving)
        if not keep_status:
            record.statuses[serving.version] = VersionStatus(serving.version, UNAVAILABLE, UNLOADED)
        _log.info("successfully unloaded '%s' version %d", serving.name, serving.version)

    async def _load_version(self, source: ModelSource, version: VersionSource) -> ServingModel:
        """Import, start every instance, warm up, start the batcher: a ServingModel not yet
        taking traffic. Raises ModelLoadError with the reason (naming file and key); on
        any failure or cancellation whatever was started is closed again."""
        assert source.config is not None
        name = source.name
        instances: list[ModelInstance] = []
        model_class: ModelClass | None = None
        try:
            config = await resolve_instance_groups(source.config, source.path / "config.toml", self._gpus)
            config_json = to_triton_json(config)
            samples = await asyncio.to_thread(
                build_samples, config, source.path, model_version=version.version
            )
            model_class = await asyncio.to_thread(load_model_class, version.model_file, name, version.version)
            for index, (_, device) in enumerate(placements(config)):
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
                instances.append(instance)
                async with self._construct_lock:
                    await instance.start()
            await run_warmup(samples, instances, name)
            labels = await asyncio.to_thread(_load_labels, config, version.path, source.path)
            stats = ModelStats(name, version.version)
            batcher = DynamicBatcher.for_model(name, config, instances, stats)
            await batcher.__aenter__()
        except BaseException as exc:
            for instance in instances:
                await instance.close()
            MODEL_FAULTS.flush(name, version.version)  # the next load attempt logs its failures afresh
            if model_class is not None:
                unload_model_module(model_class)
            if isinstance(exc, ModelLoadError):
                raise
            if isinstance(exc, NereidError):
                raise ModelLoadError(name, exc.message, str(version.model_file)) from exc
            if isinstance(exc, Exception):  # anything user code or the filesystem throws
                _log.exception("loading %s:%d failed", name, version.version)
                raise ModelLoadError(
                    name, f"{version.model_file}: {describe_exception(exc)}", str(version.model_file)
                ) from exc
            raise
        return ServingModel(
            name, version.version, config, config_json, stats, batcher, tuple(instances), model_class, labels
        )

    def _refresh_latest(self, record: _ModelRecord) -> None:
        if record.serving:
            self._latest[record.name] = record.serving[max(record.serving)]
        else:
            self._latest.pop(record.name, None)


def _kept_serving(reason: str) -> str:
    return f"reload failed, the previous load keeps serving: {reason}"


async def _close_serving(serving: ServingModel) -> None:
    """Stop taking requests, let accepted ones finish (the batcher drains its queue and
    running batches), close the instances, and only then forget the model's modules."""
    serving.retired = True
    await serving.batcher.aclose()
    for instance in serving.instances:
        await instance.close()
    MODEL_FAULTS.flush(serving.name, serving.version)  # its last repeats; a new load logs afresh
    unload_model_module(serving.model_class)


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


