"""Model faults in the server log: a failure of the user's model code (import,
``__init__``, ``infer``, ``batch_size``, ``close``, or outputs that do not match the
config) is logged with its traceback the first time it occurs, and its repeats are
counted and summarised at most once a window, so a model failing under load cannot flood
the log.

The client's error stays short (``model "m" raised in infer: ValueError: ...``); this
module is where the operator finds the file and line. Knows nothing about HTTP.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["FaultLog", "describe_exception"]

_NEREID_DIR = str(Path(__file__).resolve().parent)


@dataclass(slots=True)
class _Seen:
    """One distinct failure: when it was last reported, and repeats not yet reported."""

    reported_at: float
    repeats: int = 0
    last: str = ""


class FaultLog:
    """Logs model-code failures once each, then counts repeats.

    A failure is *distinct* by model, version, stage (``"infer"``, ``"__init__"``, ...),
    exception type and the innermost frame of its traceback (file and line): the same bug
    hit by many requests is one failure. The first occurrence is logged at ERROR with the
    traceback (nereid's own frames above the model's are left out). Repeats are counted
    and reported as one line when a repeat comes at least ``window_s`` after the last
    report, or when ``flush(model)`` is called (at unload). At most
    ``max_tracebacks`` distinct tracebacks per model are logged per window; failures
    past that are counted under one summary for the model.

    Thread-safe: instance threads report their own failures. ``clock`` (seconds) is
    injectable for tests. Each server's model loader owns one (and each process
    instance's worker process its own), so two servers in one process count apart.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        window_s: float = 60.0,
        max_tracebacks: int = 10,
        max_remembered: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger if logger is not None else logging.getLogger("nereid")
        self._window_s = window_s
        self._max_tracebacks = max_tracebacks
        self._max_remembered = max_remembered
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[object, ...], _Seen] = {}
        #: per (model, version): (window start, tracebacks logged in that window)
        self._budget: dict[tuple[str, int | None], tuple[float, int]] = {}

    def record(self, model: str, version: int | None, stage: str, exc: BaseException) -> None:
        """Report one failure of model code (``exc`` as raised, with its traceback)."""
        frames = _user_frames(exc)
        where = (frames[-1].filename, frames[-1].lineno) if frames else None
        key = (model, version, stage, type(exc).__qualname__, where)
        self._report(key, model, version, stage, exc, frames)

    def record_message(self, model: str, version: int | None, stage: str, message: str) -> None:
        """Report a failure that has no traceback of its own (outputs that do not match
        the config): logged once per distinct message, repeats counted."""
        self._report((model, version, stage, message), model, version, stage, message, None)

    def flush(self, model: str, version: int | None) -> None:
        """Report the repeats still counted for one model version and forget its
        failures: called when it unloads, so its last repeats are not lost and a new
        load's failures are logged afresh."""
        with self._lock:
            lines = []
            for key in [k for k in self._seen if k[0] == model and k[1] == version]:
                seen = self._seen.pop(key)
                if seen.repeats:
                    lines.append(self._repeat_line(key, seen))
            self._budget.pop((model, version), None)
        for line in lines:
            self._log.error("%s", line)

    def _report(
        self,
        key: tuple[object, ...],
        model: str,
        version: int | None,
        stage: str,
        exc: BaseException | str,
        frames: list[traceback.FrameSummary] | None,
    ) -> None:
        now = self._clock()
        summary = exc if isinstance(exc, str) else describe_exception(exc)
        with self._lock:
            seen = self._seen.get(key)
            if seen is None and not self._take_budget(model, version, now):
                key = (model, version, stage, "*")  # past the budget: one summary per model
                seen = self._seen.setdefault(key, _Seen(reported_at=now))
            if seen is not None:
                seen.repeats += 1
                seen.last = summary
                if now - seen.reported_at < self._window_s:
                    return
                line = self._repeat_line(key, seen)
                seen.reported_at, seen.repeats = now, 0
            else:
                if len(self._seen) >= self._max_remembered:
                    self._seen.clear()
                self._seen[key] = _Seen(reported_at=now)
                line = None
        if line is not None:
            self._log.error("%s", line)
            return
        head = f"model '{model}'{_version(version)} {_stage_text(stage)} (logged once; repeats are counted)"
        if isinstance(exc, str):
            self._log.error("%s: %s", head, exc)
        else:
            body = "".join(_format(exc, frames)).rstrip("\n")
            self._log.error("%s:\n%s", head, body)

    def _take_budget(self, model: str, version: int | None, now: float) -> bool:
        start, used = self._budget.get((model, version), (now, 0))
        if now - start >= self._window_s:
            start, used = now, 0
        if used >= self._max_tracebacks:
            return False
        self._budget[(model, version)] = (start, used + 1)
        return True

    def _repeat_line(self, key: tuple[object, ...], seen: _Seen) -> str:
        model, version, stage = key[0], key[1], key[2]
        assert isinstance(model, str) and isinstance(stage, str)
        assert version is None or isinstance(version, int)
        what = "other failures" if key[-1] == "*" else "more times"
        return (
            f"model '{model}'{_version(version)} {_stage_text(stage)} again: {seen.repeats} {what} "
            f"in the last {self._window_s:.0f} s (last: {seen.last})"
        )


def _version(version: int | None) -> str:
    return "" if version is None else f" version {version}"


def _stage_text(stage: str) -> str:
    if stage == "import":
        return "failed to import"
    if stage == "outputs":
        return "returned outputs that do not match its config"
    return f"raised in {stage}"


def describe_exception(exc: BaseException) -> str:
    """``TypeName: message`` for reasons and logs (no traceback)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback's frames from the first one that is not nereid's or importlib's:
    the user sees their own file first. None of them for a SyntaxError in the user's
    file (the error names its file and line itself); all of them when every one is
    nereid's (a fault of nereid, not of the model)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for index, frame in enumerate(frames):
        if not (frame.filename.startswith(_NEREID_DIR) or frame.filename.startswith("<frozen")):
            return list(frames[index:])
    return [] if isinstance(exc, SyntaxError) else list(frames)


def _format(exc: BaseException, frames: list[traceback.FrameSummary] | None) -> list[str]:
    """Python's traceback text for ``exc`` with only ``frames`` in its stack."""
    shown = traceback.TracebackException.from_exception(exc)
    if frames is not None:
        shown.stack = traceback.StackSummary.from_list(frames)
    return list(shown.format())

