"""Model code's coroutines run from a process instance's serving threads: an ``async
def infer`` awaited on the worker's own event loop (``run_on``), an async generator of a
decoupled model iterated from a thread (``sync_steps``), and a coroutine that will not be
used closed (``discard``). Whatever the model code raises comes back to the calling thread
as it is."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

__all__ = ["discard", "run_on", "sync_steps"]


async def _contained(awaitable: Any) -> tuple[bool, Any]:
    """Await model code on the worker's loop, whatever it raises returned rather than
    raised: a SystemExit or KeyboardInterrupt leaving a task stops the loop itself (every
    later await would hang), and a CancelledError of the model's own would come back as
    the cross-thread future's bare CancelledError, its message lost."""
    try:
        return True, await awaitable
    except BaseException as exc:  # model code: handed to the calling thread as it is
        return False, exc


def run_on(loop: asyncio.AbstractEventLoop, awaitable: Any) -> Any:
    """``await awaitable`` on ``loop``, from a serving thread: its result, or what it raised."""
    ok, value = asyncio.run_coroutine_threadsafe(_contained(awaitable), loop).result()
    if not ok:
        raise value
    return value


def discard(value: Any) -> None:
    """Close what infer returned and will not be used (a coroutine never awaited warns)."""
    if inspect.iscoroutine(value):
        value.close()


def sync_steps(steps: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """An async generator iterated from this thread through the worker's loop."""

    class _Steps:
        def __iter__(self) -> Any:
            return self

        def __next__(self) -> Any:
            try:
                return run_on(loop, steps.__anext__())
            except StopAsyncIteration:
                raise StopIteration from None

        def close(self) -> None:
            run_on(loop, steps.aclose())

    return _Steps()
