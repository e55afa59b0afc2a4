"""Where a DynamicBatcher's time comes from: the Clock protocol, real time (SYSTEM_CLOCK)
and the precise timer that waits out queue delays shorter than the event loop's 1 ms steps.

Tests pass a clock of their own whose time moves only when they say so
(tests/unit/manual_clock.py). Knows nothing about requests or batches.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Protocol

__all__ = ["PRECISE_BELOW_NS", "SYSTEM_CLOCK", "Cancellable", "Clock", "PreciseTimer", "SystemClock", "wake"]


class Cancellable(Protocol):
    """A scheduled call that can be called off (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class PreciseTimer(Protocol):
    """Wakes one future at a time at a ``monotonic_ns`` deadline: how a batcher waits out
    a short queue delay. One per batcher."""

    def wake_at(self, deadline_ns: int, future: asyncio.Future[None], /) -> None:
        """Resolve ``future`` once now reaches ``deadline_ns`` (replaces the pending wake)."""

    def cancel(self) -> None:
        """Call off the pending wake, if any."""

    def stop(self) -> None:
        """No more wakes (the batcher closed)."""


class Clock(Protocol):
    """Where a DynamicBatcher's time comes from: ``SYSTEM_CLOCK`` (real time, the default),
    or a fake whose time moves only when a test says so.

    Times are nanoseconds on one monotonic timeline, except ``call_at``'s ``when``: seconds
    (``deadline_ns / 1e9``), the event loop's unit, so that real time's ``call_at`` is the
    loop's own method and the batcher calls it with nothing in between.
    """

    def monotonic_ns(self) -> int:
        """Now."""

    def call_at(self, when: float, callback: Callable[..., object], /, *args: Any) -> Cancellable:
        """Call ``callback(*args)`` on the running loop once now reaches ``when`` seconds
        (``asyncio.AbstractEventLoop.call_at``'s contract). Millisecond steps are good enough:
        the batcher uses it for request timeouts and for queue delays of 2 ms or more."""

    def precise_timer(self, name: str, /) -> PreciseTimer:
        """A timer for the batcher named ``name``, for waits shorter than 2 ms."""


#: Waits shorter than this go to the precise timer (event-loop timers have 1 ms steps).
PRECISE_BELOW_NS = 2_000_000


class _PreciseTimer:
    """Wakes an asyncio future at a monotonic time with sub-millisecond precision.

    uvloop (libuv) and asyncio's selector both round timers to whole milliseconds, so a
    100 µs queue delay would cost a full millisecond. Short waits are handed to this
    daemon thread instead: it sleeps on a condition with a nanosecond timeout and wakes
    the loop through ``call_soon_threadsafe``. One per batcher, started on first use.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._condition = threading.Condition()
        self._deadline_ns: int | None = None
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def wake_at(self, deadline_ns: int, future: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        with self._condition:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"nereid-timer-{self._name}", daemon=True)
                self._thread.start()
            self._deadline_ns = deadline_ns
            self._target = (loop, future)
            self._condition.notify()

    def cancel(self) -> None:
        with self._condition:
            self._deadline_ns = None
            self._target = None

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify()

    def _run(self) -> None:
        condition = self._condition
        with condition:
            while not self._stopped:
                deadline = self._deadline_ns
                if deadline is None:
                    condition.wait()
                    continue
                remaining = deadline - time.monotonic_ns()
                if remaining > 0:
                    condition.wait(remaining / 1e9)
                    continue
                target = self._target
                self._deadline_ns = None
                self._target = None
                if target is not None:
                    loop, future = target
                    try:
                        loop.call_soon_threadsafe(wake, future)
                    except RuntimeError:  # the loop is closed
                        pass


class SystemClock:
    """Real time: ``time.monotonic_ns``, the running loop's timers (``loop.time()`` is
    ``time.monotonic()``, the same timeline) and a thread for waits shorter than their 1 ms
    steps (``_PreciseTimer``)."""

    monotonic_ns = staticmethod(time.monotonic_ns)

    @staticmethod
    def call_at(when: float, callback: Callable[..., object], /, *args: Any) -> Cancellable:
        """The running loop's ``call_at`` (a batcher binds that one directly once entered)."""
        return asyncio.get_running_loop().call_at(when, callback, *args)

    @staticmethod
    def precise_timer(name: str, /) -> PreciseTimer:
        return _PreciseTimer(name)


#: The default clock of every DynamicBatcher.
SYSTEM_CLOCK = SystemClock()


def wake(future: asyncio.Future[None] | None) -> None:
    """Resolve a waiter's future unless it is gone or resolved already."""
    if future is not None and not future.done():
        future.set_result(None)
