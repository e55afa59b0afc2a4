"""InstanceThreads: a model instance's own threads, which run its model code off the
event loop. Calls go in through a queue; results come back as asyncio futures resolved
on the caller's loop. Knows nothing about models or batches.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

from nereid.repository.model_file import describe_exception

__all__ = ["InstanceThreads"]


class InstanceThreads:
    """The instance's own threads: calls go in through a queue, results come back as
    asyncio futures resolved on their loop.

    Lighter than ``loop.run_in_executor`` with a ThreadPoolExecutor (no concurrent
    Future, no work-item lock, no thread-count check per call): that pair was a fifth of
    the server's time per request on the identity model. Daemon threads, so a model
    stuck in ``infer`` cannot keep the process alive at exit.
    """

    def __init__(self, count: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopping: list[asyncio.Future[Any]] | None = None  # what stop() waits for
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=True) for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def _serve(self) -> None:
        calls = self._calls
        while _run_call(calls.get()):
            pass

    async def stop(self, timeout: float) -> bool:
        """Stop every thread once the calls queued before are done, and wait (up to
        ``timeout`` seconds) until each has let go of its last call and is exiting. False
        if one is still busy (stuck in model code): a daemon thread, it cannot keep the
        process alive."""
        if self._stopping is None:  # once: a second stop would wait for threads long gone
            self._stopping = [self.call(_stop) for _ in self._threads]  # a thread takes one, then ends
        done, _ = await asyncio.wait(self._stopping, timeout=timeout)
        return len(done) == len(self._stopping)


def _stop() -> None:
    """Queued (never called) to tell a thread to answer it and end (``stop``)."""


def _run_call(call: Any) -> bool:
    """Run one queued call and hand its outcome to its loop; False for ``_stop``.

    Its own frame, so that a thread waiting for the next call holds no reference to the
    last one's function, arguments or result (the model object itself, after the call
    that built it): those must be released by the loop, never by a daemon thread that
    may still run while the interpreter shuts down (in 3.11 a daemon thread that needs
    the GIL then is ended by pthread_exit, which aborts the process when it unwinds
    through C++ code, as torch's tensor destructors are)."""
    loop, future, fn, args = call
    if fn is _stop:
        loop.call_soon_threadsafe(_resolve, future, None)
        return False
    try:
        result = fn(*args)
    except BaseException as exc:  # handed to the awaiting coroutine
        loop.call_soon_threadsafe(_reject, future, exc)
    else:
        loop.call_soon_threadsafe(_resolve, future, result)
    return True


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        if isinstance(exc, StopIteration):  # a Future refuses it (TypeError): it would never be done
            error = RuntimeError(f"model code raised {describe_exception(exc)}")
            error.__cause__ = exc
            exc = error
        future.set_exception(exc)
