"""Time for asyncio tests without sleeping: a clock that moves only when told, and waits
that end on a condition instead of after a while."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any, Callable

__all__ = ["ManualClock", "settle", "until"]


class _Call:
    """One scheduled callback of a ManualClock (an ``asyncio.TimerHandle`` look-alike)."""

    __slots__ = ("deadline_ns", "callback", "args", "cancelled")

    def __init__(self, deadline_ns: int, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.deadline_ns = deadline_ns
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Timer:
    """A ManualClock's ``precise_timer``: one pending wake at a time, like the real one."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock
        self._pending: _Call | None = None
        self._stopped = False

    def wake_at(self, deadline_ns: int, future: asyncio.Future[None], /) -> None:
        self.cancel()
        if not self._stopped:
            self._pending = self._clock.call_at_ns(deadline_ns, _wake, future)

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def stop(self) -> None:
        self._stopped = True
        self.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ManualClock:
    """A ``nereid.scheduling.clock.Clock`` whose time moves only through ``advance``.

    Callbacks scheduled with ``call_at`` (and the precise timers' wakes) run inside
    ``advance``, in deadline order (ties: in the order they were scheduled), each with the
    clock reading its own deadline; then the clock reads the target time. Nothing runs on
    its own, so what a test sees depends only on what it does.
    """

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now_ns = start_ns
        self._calls: list[tuple[int, int, _Call]] = []
        self._order = itertools.count()

    def monotonic_ns(self) -> int:
        return self._now_ns

    def call_at(self, when: float, callback: Callable[..., object], /, *args: Any) -> _Call:
        """``when`` in seconds, as the batcher passes it (``deadline_ns / 1e9``)."""
        return self.call_at_ns(round(when * 1e9), callback, *args)

    def call_at_ns(self, deadline_ns: int, callback: Callable[..., object], /, *args: Any) -> _Call:
        call = _Call(deadline_ns, callback, args)
        heapq.heappush(self._calls, (deadline_ns, next(self._order), call))
        return call

    def precise_timer(self, name: str, /) -> _Timer:
        return _Timer(self)

    @property
    def pending(self) -> list[int]:
        """The deadlines of the calls still to run, earliest first."""
        return sorted(deadline for deadline, _, call in self._calls if not call.cancelled)

    def advance(self, ns: int) -> None:
        """Move time ``ns`` forward, running every call that falls due on the way."""
        if ns < 0:
            raise ValueError(f"time does not go back: advance({ns})")
        target = self._now_ns + ns
        calls = self._calls
        while calls and calls[0][0] <= target:
            deadline, _, call = heapq.heappop(calls)
            if call.cancelled:
                continue
            self._now_ns = max(self._now_ns, deadline)
            call.callback(*call.args)
        self._now_ns = target

    def advance_to(self, deadline_ns: int) -> None:
        self.advance(deadline_ns - self._now_ns)


async def next_turn() -> None:
    """One turn of the event loop: every task ready to run takes one step (no clock time
    passes). The only way the in-process tests let other tasks run."""
    await asyncio.sleep(0)


async def until(condition: Callable[[], object], *, steps: int = 1000) -> None:
    """Let the other tasks run until ``condition()`` holds; fail after ``steps`` turns of
    the loop (no clock time passes: a condition that needs some never comes true)."""
    for _ in range(steps):
        if condition():
            return
        await next_turn()
    if condition():
        return
    raise AssertionError(f"still not true after {steps} turns of the event loop: {condition}")


async def settle(steps: int = 50) -> None:
    """Let the other tasks run for ``steps`` turns of the loop: for checking that something
    does *not* happen (its cause has been given every chance to run)."""
    for _ in range(steps):
        await next_turn()
