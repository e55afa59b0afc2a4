"""What the model manager shows per model and version: state, reason, readiness.

A ``ModelRecord`` per model name holds the ServingModel objects that take traffic and,
per version, a ``VersionStatus`` (READY, UNAVAILABLE, LOADING, UNLOADING, with a
reason): the rows of the repository index and what strict readiness reads. Its methods
are the transitions of a load, reload, roll-back and unload (manager.py drives
them); each runs without awaiting, so nobody ever sees half a transition.

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

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Container, Iterable, Protocol

from nereid.errors import ModelNotFoundError, ModelNotReadyError
from nereid.models.serving import ServingModel

__all__ = [
    "IndexEntry", "LOADING", "ModelRecord", "READY", "UNAVAILABLE", "UNLOADED", "UNLOADING", "VersionStatus",
    "not_serving_error",
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


def kept_serving(reason: str) -> str:
    """The reason of a version that serves on although a load meant to replace it."""
    return f"reload failed, the previous load keeps serving: {reason}"


@dataclass(eq=False)
class ModelRecord:
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

    @property
    def fine(self) -> bool:
        """What strict readiness asks of a model: each version READY, or UNAVAILABLE
        because it was unloaded on purpose; and a readable folder and config."""
        if not self.statuses and self.reason:
            return False
        return all(
            (state == READY) or (state == UNAVAILABLE and reason == UNLOADED)
            for state, reason in (self.state_of(version) for version in self.statuses)
        )

    def state_of(self, version: int) -> tuple[str, str]:
        """A version's state and reason as readiness and the index tell them: a READY
        version none of whose instances can serve now (a process restarting, a batch
        stuck past its timeout) reads UNAVAILABLE with why, until one is back; an
        ensemble whose step model was unloaded (or no longer fits) reads UNAVAILABLE
        "unloaded", as Triton unloads it then, until the step model is back."""
        status = self.statuses[version]
        if status.state == READY:
            serving = self.serving.get(version)
            problem = serving.problem if serving is not None else None
            if problem is not None:
                return UNAVAILABLE, UNLOADED if serving is not None and serving.withdrawn else problem
        return status.state, status.reason

    def why_not_serving(self, version: int | None = None) -> str:
        """Why the model takes no requests, as the index tells it: ``version 1 is
        UNAVAILABLE: <reason>`` per version (``; `` between them), or ``UNAVAILABLE:
        <reason>`` when its folder or config could not be read; for one ``version``, ``it
        is UNAVAILABLE: <reason>``. "" when there is nothing to tell."""
        if version is not None:
            if version not in self.statuses:
                return ""
            state, reason = self.state_of(version)
            return f"it is {state}: {reason}" if reason else f"it is {state}"
        parts = []
        for number in sorted(self.statuses):
            state, reason = self.state_of(number)
            parts.append(f"version {number} is {state}: {reason}" if reason else f"version {number} is {state}")
        if not parts and self.reason:
            parts.append(f"{UNAVAILABLE}: {self.reason}")
        return "; ".join(parts)

    def rows(self, ready_only: bool) -> list[IndexEntry]:
        """The model's index rows: one per version; or one version-less row."""
        if self.statuses:
            states = [(version, *self.state_of(version)) for version in sorted(self.statuses)]
            return [
                IndexEntry(self.name, version, state, reason)
                for version, state, reason in states
                if not ready_only or state == READY
            ]
        if ready_only:
            return []
        if self.reason:
            return [IndexEntry(self.name, None, UNAVAILABLE, self.reason)]
        return [IndexEntry(self.name)]

    def _set(self, version: int, state: str, reason: str = "") -> None:
        self.statuses[version] = VersionStatus(version, state, reason)

    # -- transitions ---------------------------------------------------------------------

    def source_failed(self, missing_versions: Iterable[int], reason: str) -> None:
        """The model's folder or config could not be read: every version says so (those
        serving stay READY and serve on)."""
        self.reason = reason
        for version, status in list(self.statuses.items()):
            if status.state == READY:
                self._set(version, READY, kept_serving(reason))
            else:
                self._set(version, UNAVAILABLE, reason)
        for missing in missing_versions:
            if missing not in self.serving:
                self._set(missing, UNAVAILABLE, reason)

    def loading(self, versions: Iterable[int]) -> None:
        """A load began: new version numbers are LOADING; serving ones stay READY."""
        for version in versions:
            if version not in self.serving:
                self._set(version, LOADING)

    def load_cancelled(self, versions: Iterable[int]) -> None:
        """Shutdown interrupted a load: what did not serve before is UNAVAILABLE."""
        for version in versions:
            if version not in self.serving:
                self._set(version, UNAVAILABLE, "load cancelled: the server is shutting down")

    def swap(self, loaded: dict[int, ServingModel]) -> dict[int, ServingModel]:
        """Every version of a load is ready: traffic moves to ``loaded`` in one step. The
        previous objects are returned, retired (a reloaded one points at its successor);
        those whose version number stays are READY, the others UNLOADING."""
        old = self.serving
        for version, serving in old.items():
            serving.successor = loaded.get(version)
            serving.retired = True
        self.serving = loaded
        self.reason = ""
        for version in loaded:
            self._set(version, READY)
            _log.info("successfully loaded '%s' version %d", self.name, version)
        for version in [v for v, s in self.statuses.items() if v not in loaded and v not in old and s.reason != UNLOADED]:
            # a failure of an earlier load, for a version this load no longer selects
            del self.statuses[version]
        for version in old:
            if version not in loaded:
                self._set(version, UNLOADING)
        return old

    def roll_back(self, loaded: dict[int, ServingModel], failures: dict[int, str]) -> None:
        """A load with a failed version: what did load is discarded (the caller closes
        it), what served keeps serving, and every row says why."""
        name = self.name
        old = self.serving
        failed = ", ".join(str(v) for v in sorted(failures))
        for version, reason in sorted(failures.items()):
            _log.error("failed to load '%s' version %d: %s", name, version, reason)
            if version in old:
                _log.warning("'%s' version %d keeps serving its previous load", name, version)
                self._set(version, READY, kept_serving(reason))
            else:
                self._set(version, UNAVAILABLE, reason)
        for version in loaded:
            _log.info("discarding '%s' version %d: version %s of the same load failed", name, version, failed)
            if version in old:
                self._set(version, READY, kept_serving(f"version {failed} of the same load failed"))
            else:
                self._set(version, UNAVAILABLE, f"not loaded: version {failed} of the same load failed")
        for version in old:
            if version not in failures and version not in loaded:
                # serving on although the load meant to retire it
                self._set(version, READY, kept_serving(f"version {failed} failed to load"))

    def unloading(self) -> dict[int, ServingModel]:
        """An unload began: no version takes new requests; each is UNLOADING until it
        has drained. Returns the objects to drain."""
        retiring = self.serving
        for serving in retiring.values():
            serving.retired = True
        self.serving = {}
        for version in retiring:
            self._set(version, UNLOADING)
        return retiring

    def unloaded(self, version: int) -> None:
        """A version drained and closed on purpose."""
        self._set(version, UNAVAILABLE, UNLOADED)

    def all_unloaded(self) -> None:
        """An unload finished: every version that is not READY reads "unloaded"."""
        for version, status in list(self.statuses.items()):
            if status.state != READY:
                self._set(version, UNAVAILABLE, UNLOADED)
        self.reason = ""


class Explains(Protocol):
    """What ``not_serving_error`` reads of a model: a ModelRecord, or its picture in a
    front-end worker (``models.directory.ModelFacts``)."""

    @property
    def statuses(self) -> Container[int]: ...

    def why_not_serving(self, version: int | None = None) -> str: ...


def not_serving_error(
    name: str, version: int | None, record: Explains | None
) -> ModelNotFoundError | ModelNotReadyError:
    """Triton's error for a request on ``name`` (``version``: None for the latest) that no
    READY version takes, followed by the reason the index holds (``...has no available
    versions; version 1 is UNAVAILABLE: <why it failed to load>``); ``record``: what is
    known of the model (None: nothing)."""
    if record is None:
        return ModelNotFoundError(f"Request for unknown model: '{name}' is not found", model=name)
    if version is None:
        return ModelNotFoundError(
            _with_reason(f"Request for unknown model: '{name}' has no available versions", record.why_not_serving()),
            model=name,
        )
    if version in record.statuses:
        return ModelNotReadyError(
            _with_reason(
                f"Request for unknown model: '{name}' version {version} is not at ready state",
                record.why_not_serving(version),
            ),
            model=name,
        )
    # a model whose folder or config could not be read has no versions: say why
    why = "" if record.statuses else record.why_not_serving()
    return ModelNotFoundError(
        _with_reason(f"Request for unknown model: '{name}' version {version} is not found", why), model=name
    )


def _with_reason(message: str, reason: str) -> str:
    """Triton's words for a model that cannot serve, then nereid's reason (when known)."""
    return f"{message}; {reason}" if reason else message
