"""ModelManager: which model versions are loaded, their state and reason, and serving.

Owns loading, reloading and unloading as transactions per model (the loader brings one
version up or down: loader.py; what each version shows: states.py; poll mode's watcher
calls them: poller.py), and the lookup the surfaces use to reach a running model: its
serving handle (serving.py). Knows nothing about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import AsyncIterator, Callable, Iterable, Mapping, Sequence

from nereid.config.schema import ModelConfig
from nereid.errors import ModelLoadError, NereidError, UnavailableError
from nereid.repository.model_file import describe_exception
from nereid.models.dependencies import Dependencies
from nereid.models.loader import Loader, ModelLoader
from nereid.models.states import (
    LOADING,
    READY,
    UNAVAILABLE,
    UNLOADED,
    UNLOADING,
    IndexEntry,
    ModelRecord,
    VersionStatus,
    not_serving_error,
)
from nereid.options import MODEL_CONTROL_MODES
from nereid.triton_python.bls import BlsTarget
from nereid.custom_metrics import CustomMetrics
from nereid.repository.scan import (
    ModelSource,
    Repositories,
    check_model_name,
    is_model_folder,
)
from nereid.repository.watch import Changes
from nereid.models.poller import RepositoryPoller
from nereid.models.serving import ServingModel, Ticket

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


class ModelManager:
    """Loads models from one or more repositories and serves their READY versions.

    Several repositories (``--model-repository`` repeated) serve the union of their
    models; a name with a folder in more than one is no model, as in Triton: it is
    UNAVAILABLE with a reason naming every folder, and is not loaded.

    ``mode`` is tritonserver's model control mode: ``none`` loads every model at start and
    the load/unload API is refused (by the HTTP layer); ``explicit`` loads
    ``startup_models`` (``*``: all) and accepts load/unload; ``poll`` loads all, then
    every ``poll_secs`` looks at the repository: new folders load, removed ones unload,
    changed ones reload, each once its folder has held still for one interval.

    Loading is a transaction per model, as in Triton: the versions the version policy
    selects load (and warm up) while whatever is loaded keeps serving. If every one of
    them becomes ready, traffic moves to them at once, and the previous objects drain
    (queued and running requests finish) and unload. If any one fails, the new objects
    are discarded and the model keeps serving exactly what it served before. How that
    shows in the index and in readiness: states.py.
    """

    def __init__(
        self,
        repository: Path | Sequence[Path],
        *,
        mode: str = "none",
        startup_models: Iterable[str] = (),
        poll_secs: float = 5.0,
        loader: Loader | None = None,
        bls: BlsTarget | None = None,
    ) -> None:
        """``loader`` brings one version up and down (tests give a stub; by default
        ``ModelLoader``: model files from the repository); ``bls``: where the default
        loader's Triton models send their BLS requests (the server's other models)."""
        if mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model control mode: expected one of {', '.join(MODEL_CONTROL_MODES)}, got {mode!r}")
        if mode == "poll" and not poll_secs > 0:
            raise ValueError(f"--repository-poll-secs: expected a number of seconds > 0, got {poll_secs!r}")
        self.repositories = Repositories(repository)
        self.mode = mode
        self.startup_models = tuple(startup_models)
        self.poll_secs = poll_secs
        #: the metric families its models make (context.metric_family, pb_utils.MetricFamily)
        self.custom_metrics = CustomMetrics()
        self._loader: Loader = (
            loader if loader is not None
            else ModelLoader(bls=bls, steps=self, custom_metrics=self.custom_metrics)
        )
        self._records: dict[str, ModelRecord] = {}
        # name -> latest READY version, for the hot path
        self._latest: dict[str, ServingModel] = {}
        #: name -> the READY version a request without a version gets, read per request
        #: without a call (``serving = manager.latest.get(name) or manager.get(name)``:
        #: ``get`` raises Triton's error for why there is none)
        self.latest: Mapping[str, ServingModel] = self._latest
        self._startup_done = False
        self._closing = False
        self._poller = RepositoryPoller(
            self.repositories, poll_secs, load=self._load_logged, unload=self._unload_logged
        )
        self._dependencies = Dependencies()  # ensembles' step models
        #: called at once, on the loop, after each change to what the manager shows (a
        #: version's state or reason, the versions that serve, a model known or
        #: forgotten, start-up done, shutdown begun): front-end workers' picture of the
        #: models follows it (models/directory.py). Not called for an instance's
        #: ``problem``, which changes on its own.
        self.on_change: list[Callable[[], None]] = []

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Load the startup set for the control mode (models load concurrently); in poll
        mode then start watching the repository. A model that fails to load is
        UNAVAILABLE with its reason; it never stops the others or the server."""
        scan = await asyncio.to_thread(self.repositories.scan)
        if self.mode == "poll":
            await self._poller.take_baseline(scan)  # before loading: changes made meanwhile count
        if self.mode == "explicit" and "*" not in self.startup_models:
            names = list(dict.fromkeys(self.startup_models))
        else:
            names = list(scan.roots) + list(scan.duplicates)  # a duplicate is remembered UNAVAILABLE
        await asyncio.gather(*(self._load_logged(name, startup=True) for name in names))
        self._startup_done = True
        self._changed()
        if self.mode == "poll":
            self._poller.start()

    async def aclose(self) -> None:
        """Stop polling, then unload everything (in-flight requests finish first)."""
        self._closing = True
        self._changed()
        await self._poller.aclose()
        names = list(self._records)
        results = await asyncio.gather(*(self.unload(name) for name in names), return_exceptions=True)
        for name, result in zip(names, results):
            if isinstance(result, Exception):  # one model's failure must not stop the others' unload
                _log.error("unloading '%s' at shutdown failed: %s", name, describe_exception(result))

    async def close(self) -> None:
        """The same as ``aclose()`` (the app's lifespan calls this name)."""
        await self.aclose()

    def set_shutdown_deadline(self, deadline: float) -> None:
        """Unloading stops waiting for model code at ``deadline`` (``time.monotonic``):
        batches still running then are abandoned (``abandoned``). Server.shutdown sets it
        from --exit-timeout-secs."""
        if isinstance(self._loader, ModelLoader):
            self._loader.deadline = deadline

    @property
    def abandoned(self) -> list[str]:
        """``name:version`` of the versions whose running batches were abandoned."""
        return list(self._loader.abandoned) if isinstance(self._loader, ModelLoader) else []

    def _changed(self) -> None:
        for callback in self.on_change:
            callback()

    @property
    def records(self) -> Mapping[str, ModelRecord]:
        """Every model the manager knows, by name (read only: the manager's to change)."""
        return self._records

    @property
    def startup_done(self) -> bool:
        return self._startup_done

    def unfit_models(self) -> list[str]:
        """The models strict readiness waits for (a version neither READY nor unloaded on
        purpose, or an unreadable folder or config), by name."""
        return sorted(name for name, record in self._records.items() if not record.fine)

    def ready_models(self) -> list[str]:
        """The models with a READY version, by name."""
        return sorted(name for name, record in self._records.items() if record.serving)

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
        return not strict or all(record.fine for record in self._records.values())

    # -- serving lookup (hot path) -----------------------------------------------------

    def get(self, name: str, version: int | None = None) -> ServingModel:
        """The READY model version to serve, or Triton's error for why there is none,
        followed by the reason the index holds (``...has no available versions; version
        1 is UNAVAILABLE: <why it failed to load>``: states.not_serving_error)."""
        if version is None:
            serving = self._latest.get(name)
            if serving is not None:
                return serving
        else:
            record = self._records.get(name)
            serving = record.serving.get(version) if record is not None else None
            if serving is not None:
                return serving
        raise not_serving_error(name, version, self._records.get(name))

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
        scan = await asyncio.to_thread(self.repositories.scan, log_duplicates=False)
        return self._entries([*scan.roots, *scan.duplicates], ready_only)

    def states(self) -> list[IndexEntry]:
        """The rows of the models the manager knows (no folder scan): the start-up table."""
        return self._entries((), False)

    def _entries(self, folders: Iterable[str], ready_only: bool) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        for name in sorted(set(folders) | {n for n, r in self._records.items() if not r.empty}):
            record = self._records.get(name)
            if record is not None:
                entries.extend(record.rows(ready_only))
            elif not ready_only:
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
        before then keeps serving (see the class docstring). An ensemble's step models
        that are not loaded load first (Triton's dependencies).
        """
        self._dependencies.implicit.discard(name)
        await self._load(name, config, startup=False)

    async def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of a model: new requests are refused at once (404 "has no
        available versions"), requests already accepted finish, then the instances close.
        Every version then reads UNAVAILABLE "unloaded". Unknown names are a no-op.
        ``unload_dependents`` (an ensemble): then also unload the step models that were
        loaded only for it and that no other loaded ensemble uses, as Triton does."""
        check_model_name(name)
        if name not in self._records:
            return
        async with self._locked(name) as record:
            retiring = record.unloading()
            self._refresh_latest(record)
            self._changed()
            await asyncio.gather(*(self._retire(record, serving, keep_status=False) for serving in retiring.values()))
            record.all_unloaded()
            self._changed()
        if unload_dependents:
            for step in self._dependencies.dependents(retiring.values(), self._latest.values()):
                await self.unload(step, unload_dependents=True)

    async def poll(self) -> Changes:
        """Look at the repository once (poll mode's step): fingerprint every model folder
        off the event loop, and act on the changes that have held still for one poll:
        unload removed models, load new ones, reload changed ones. Returns what it acted
        on. Failures are logged and shown in the index, never raised."""
        return await self._poller.poll()

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
    async def _locked(self, name: str) -> AsyncIterator[ModelRecord]:
        """The model's record, created when missing, under its lock. A record left with
        nothing to say is dropped on the way out; a waiter that finds its record dropped
        takes the current one instead."""
        while True:
            record = self._records.get(name)
            if record is None:
                record = self._records[name] = ModelRecord(name)
                self._changed()
            await record.lock.acquire()
            if self._records.get(name) is record:
                break
            record.lock.release()
        try:
            yield record
        finally:
            if record.empty:
                del self._records[name]
                self._changed()
            record.lock.release()

    async def _load(self, name: str, config: ModelConfig | None, *, startup: bool) -> None:
        check_model_name(name)
        if self._closing:
            raise UnavailableError(f"cannot load '{name}': the server is shutting down")
        async with self._locked(name) as record:
            source = await asyncio.to_thread(self.repositories.read_model, name, config)
            if source.config is None or source.error is not None:
                reason = source.error or f"{source.path}: invalid config"
                _log.error("failed to load '%s': %s", name, reason)
                # A load API call for something that is not a model folder (no folder, or
                # no config file, model file or override) leaves nothing behind: it never becomes
                # a model the server knows, nor makes the server unready. A model asked
                # for at start-up is remembered either way.
                is_model = config is not None or await asyncio.to_thread(is_model_folder, source.path)
                if startup or record.statuses or is_model:
                    record.source_failed(source.missing_versions, reason)
                    self._changed()
                raise ModelLoadError(name, f"failed to load '{name}', {reason}", str(source.path))
            if source.config.ensemble_scheduling is not None:
                await self._dependencies.load_steps(name, source.config, startup=startup, serving=self._latest,
                                                    locked=self._locked, load=self._load_logged)
            await self._load_versions(record, source)

    async def _load_versions(self, record: ModelRecord, source: ModelSource) -> None:
        """Load the selected versions while the old ones serve; swap or roll back."""
        name = record.name
        failures: dict[int, str] = {
            missing: f"{source.path / str(missing)}: version folder not found "
            f"(version_policy.specific lists version {missing})"
            for missing in source.missing_versions
        }
        versions = [selected.version for selected in source.versions]
        for version in versions:
            _log.info("loading: %s:%d", name, version)
        record.loading(versions)
        self._changed()
        tasks = [
            asyncio.create_task(self._loader.load(source, selected), name=f"nereid-load-{name}:{selected.version}")
            for selected in source.versions
        ]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            # Shutdown during a load: versions that finished loading must still be closed.
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    await self._loader.close(task.result())
            record.load_cancelled(versions)
            self._changed()
            raise
        loaded: dict[int, ServingModel] = {}
        for version, result in zip(versions, results):
            if isinstance(result, ServingModel):
                loaded[version] = result
            elif isinstance(result, ModelLoadError):
                failures[version] = result.reason
            elif isinstance(result, asyncio.CancelledError):
                raise result
            else:  # pragma: no cover - the loader converts every Exception
                failures[version] = describe_exception(result)
        if failures:
            record.roll_back(loaded, failures)
            self._changed()
            await asyncio.gather(*(self._loader.close(serving) for serving in loaded.values()))
            detail = "".join(
                f"version {version} is at UNAVAILABLE state: {reason};" for version, reason in sorted(failures.items())
            )
            raise ModelLoadError(name, f"failed to load '{name}', {detail}", str(source.path))
        # Every version is ready: traffic moves in one step (no await until the old drain).
        old = record.swap(loaded)
        self._refresh_latest(record)
        self._changed()
        await asyncio.gather(
            *(self._retire(record, serving, keep_status=serving.version in loaded) for serving in old.values())
        )

    async def _retire(self, record: ModelRecord, serving: ServingModel, *, keep_status: bool) -> None:
        """Drain and unload an object that no longer takes traffic. ``keep_status``: the
        same version number serves on (a reload), so its index row stays READY."""
        _log.info("unloading: %s:%d", serving.name, serving.version)
        await self._loader.close(serving)
        if not keep_status:
            record.unloaded(serving.version)
            self._changed()
        _log.info("successfully unloaded '%s' version %d", serving.name, serving.version)

    def _refresh_latest(self, record: ModelRecord) -> None:
        if record.serving:
            self._latest[record.name] = record.serving[max(record.serving)]
        else:
            self._latest.pop(record.name, None)

