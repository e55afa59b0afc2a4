"""``nereid.batch``: the dynamic batcher as a decorator for plain Python functions.

Owns the decorator API (Ray Serve's ``@serve.batch``, mixedbread's ``batched``) on the
same core as the server: RequestQueue decides, DynamicBatcher schedules. Knows nothing
about HTTP, configs or tensors: items are any Python objects.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Generic, Sequence, TypeVar

from nereid.scheduling.batcher import DynamicBatcher
from nereid.config.schema import DynamicBatching
from nereid.errors import ModelExecutionError, NereidError
from nereid.stats import ModelStats

__all__ = ["batch", "BatchedFunction"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class _Outcome:
    outputs: list[Any] | None
    error: NereidError | None
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    began_ns: int = 0
    ended_ns: int = 0


class _FunctionRunner:
    """The "instance" behind a decorated function: calls it with a list of items, on its
    own threads for a sync function, awaited on the batcher's loop for an async one."""

    name = "batched"
    #: a batch at a time: the batcher times it where an execution timeout is set
    enforces_timeout = False
    queues_batches = False

    def __init__(self, fn: Callable[[list[Any]], Any], capacity: int, name: str) -> None:
        self.fn = fn
        self.capacity = capacity
        self.name = name
        self.is_async = inspect.iscoroutinefunction(fn)
        self.problem: str | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(capacity, thread_name_prefix=name)

    @property
    def cost_function(self) -> None:
        return None

    @property
    def sees_requests(self) -> bool:
        """The function gets the items themselves: a bundle would be one item to it."""
        return True

    async def run_batch(self, items: Sequence[Any], /) -> _Outcome:
        started = time.monotonic_ns()
        try:
            if self.is_async:
                results = await self.fn(list(items))
            else:
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(self._executor, self.fn, list(items))
        except Exception as exc:
            error = ModelExecutionError(f"{self.name} raised: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return _Outcome(None, error, 0, time.monotonic_ns() - started, 0)
        elapsed = time.monotonic_ns() - started
        if not isinstance(results, (list, tuple)) or len(results) != len(items):
            got = f"{type(results).__name__} of length {len(results)}" if isinstance(results, (list, tuple)) else type(results).__name__
            return _Outcome(None, ModelExecutionError(
                f"{self.name}: expected a list of {len(items)} results (one per item), got {got}"), 0, elapsed, 0)
        return _Outcome(list(results), None, 0, elapsed, 0)

    async def run_stream(
        self, items: Sequence[Any], sink: Callable[[list[Any], list[bool]], None], abandoned: Callable[[], bool], /
    ) -> _Outcome:
        """A batch run as a stream: the function's results, each its item's one and last step."""
        outcome = await self.run_batch(items)
        if outcome.outputs is not None:
            sink(outcome.outputs, [True] * len(items))
        return outcome

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class _LoopThread:
    """A private event loop on a daemon thread: the batcher lives there, so sync callers
    from any thread and async callers from any loop can share one queue."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()


class BatchedFunction(Generic[T, R]):
    """A function of ``list[T] -> list[R]`` called one item at a time.

    Calls are queued and executed together: a batch leaves when it reaches
    ``max_batch_size`` (or a preferred size), when the queue delay has passed since the
    oldest queued call, or at once when the delay is 0 and the function is free
    (Triton's rules). A sync function's callers block; an async function's callers
    ``await``; ``acall`` awaits in either case. Methods get one batcher per object.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        max_batch_size: int = 32,
        max_queue_delay_microseconds: int = 0,
        preferred_batch_size: Sequence[int] = (),
        max_concurrent_batches: int = 1,
        batch_size: Callable[[Any], int] | None = None,
        name: str | None = None,
    ) -> None:
        _check_at_least("max_batch_size", max_batch_size, 1)
        _check_at_least("max_queue_delay_microseconds", max_queue_delay_microseconds, 0)
        _check_at_least("max_concurrent_batches", max_concurrent_batches, 1)
        for size in preferred_batch_size:
            if not 1 <= size <= max_batch_size:
                raise ValueError(
                    f"nereid.batch: preferred_batch_size: expected sizes in 1..{max_batch_size} (max_batch_size), got {size!r}"
                )
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._name: str = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "batched"
        self._max_batch_size = max_batch_size
        self._delay_us = max_queue_delay_microseconds
        self._preferred = tuple(preferred_batch_size)
        self._concurrency = max_concurrent_batches
        self._batch_size = batch_size
        self._is_async = inspect.iscoroutinefunction(fn)
        self._lock = threading.Lock()
        self._state: _BatcherState | None = None
        self._bound: weakref.WeakKeyDictionary[Any, BatchedFunction[T, R]] = weakref.WeakKeyDictionary()

    # -- calling -------------------------------------------------------------------------

    def __call__(self, item: T) -> Any:
        """One item in, its result out: blocks for a sync function, an awaitable for an
        async one."""
        if self._is_async:
            return self.acall(item)
        return self._state_or_start().call(item)

    async def acall(self, item: T) -> R:
        """Await one item's result (from any event loop)."""
        future = self._state_or_start().submit(item)
        result: R = await asyncio.wrap_future(future)
        return result

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        with self._lock:
            bound = self._bound.get(obj)
            if bound is None:
                method = functools.partial(self._fn, obj) if not self._is_async else _bind_async(self._fn, obj)
                bound = BatchedFunction(
                    method, max_batch_size=self._max_batch_size, max_queue_delay_microseconds=self._delay_us,
                    preferred_batch_size=self._preferred, max_concurrent_batches=self._concurrency,
                    batch_size=self._batch_size, name=self._name,
                )
                self._bound[obj] = bound
        return bound

    # -- control -------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, Any]:
        """Counts so far: ``calls`` (items done), ``failures``, ``batches``, and
        ``batch_sizes`` (a histogram: batch size -> number of batches)."""
        state = self._state
        if state is None:
            return {"calls": 0, "failures": 0, "batches": 0, "batch_sizes": {}, "queued": 0}
        view: dict[str, Any] = state.call_soon(lambda: _stats_view(state)).result()
        return view

    def set_max_batch_size(self, max_batch_size: int) -> None:
        _check_at_least("max_batch_size", max_batch_size, 1)
        self._max_batch_size = max_batch_size
        self._set_on_batchers(DynamicBatcher.set_max_batch_size, max_batch_size)

    def set_max_queue_delay(self, microseconds: int) -> None:
        _check_at_least("max_queue_delay_microseconds", microseconds, 0)
        self._delay_us = microseconds
        self._set_on_batchers(DynamicBatcher.set_max_queue_delay, microseconds)

    def _set_on_batchers(self, setter: Callable[[DynamicBatcher, int], None], value: int) -> None:
        """``setter(batcher, value)`` on every running batcher (this one's and its bound
        methods'), each on its own loop."""
        for target in self._targets():
            target.call_soon(functools.partial(setter, target.batcher, value)).result()

    def _targets(self) -> list[_BatcherState]:
        states = [self._state] if self._state is not None else []
        for bound in list(self._bound.values()):
            bound._max_batch_size = self._max_batch_size
            bound._delay_us = self._delay_us
            if bound._state is not None:
                states.append(bound._state)
        return states

    def close(self) -> None:
        """Finish queued calls and stop the batcher thread (also done at interpreter exit)."""
        for target in self._targets():
            target.close()
        self._state = None

    def _state_or_start(self) -> _BatcherState:
        state = self._state
        if state is None:
            with self._lock:
                if self._state is None:
                    self._state = _BatcherState(self)
                state = self._state
        return state


def _check_at_least(option: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"nereid.batch: {option}: expected an integer >= {low}, got {value!r}")


class _BatcherState:
    """The running side of one BatchedFunction: its loop thread, runner and batcher."""

    def __init__(self, owner: BatchedFunction[Any, Any]) -> None:
        name = owner._name
        self.loop_thread = _LoopThread(f"nereid-batch-{name}")
        self.runner = _FunctionRunner(owner._fn, owner._concurrency, name)
        self.stats = ModelStats(name, 1)
        cost = owner._batch_size
        limit = owner._max_batch_size

        def cost_of(item: Any) -> int:
            if cost is None:
                return 1
            value = cost(item)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: batch_size(item): expected a positive int, got {value!r}")
            if value > limit:
                raise ValueError(f"{name}: batch_size(item) is {value}, more than max_batch_size {limit}")
            return value

        async def build() -> DynamicBatcher:
            batcher = DynamicBatcher(
                model_name=name,
                max_batch_size=owner._max_batch_size,
                dynamic_batching=DynamicBatching(
                    preferred_batch_size=owner._preferred,
                    max_queue_delay_microseconds=owner._delay_us,
                    max_concurrent_batches=owner._concurrency,
                ),
                instances=[self.runner],
                stats=self.stats,
                cost_of=cost_of,
            )
            return await batcher.__aenter__()

        self.batcher: DynamicBatcher = self.loop_thread.submit(build()).result()
        self._finalizer = weakref.finalize(self, _shutdown, self.loop_thread, self.batcher, self.runner)

    def close(self) -> None:
        self._finalizer()

    def submit(self, item: Any) -> concurrent.futures.Future[Any]:
        return self.loop_thread.submit(_unwrap(self.batcher.infer(item)))

    def call(self, item: Any) -> Any:
        return self.submit(item).result()

    def call_soon(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        async def run() -> Any:
            return fn()

        return self.loop_thread.submit(run())


def _shutdown(loop_thread: _LoopThread, batcher: DynamicBatcher, runner: _FunctionRunner) -> None:
    loop = loop_thread.loop
    if loop.is_closed() or not loop.is_running():
        return
    try:
        loop_thread.submit(batcher.aclose(drain_timeout=5.0)).result(timeout=10)
    except Exception:  # the interpreter may be exiting; nothing left to tell
        pass
    loop_thread.stop()
    runner.close()


async def _unwrap(awaitable: Awaitable[Any]) -> Any:
    """Re-raise the user's own exception (not nereid's wrapper) to the caller."""
    try:
        return await awaitable
    except ModelExecutionError as exc:
        if exc.__cause__ is not None:
            raise exc.__cause__ from None
        raise


def _bind_async(fn: Callable[..., Any], obj: Any) -> Callable[[list[Any]], Awaitable[Any]]:
    async def bound(items: list[Any]) -> Any:
        return await fn(obj, items)

    return bound


def _stats_view(state: _BatcherState) -> dict[str, Any]:
    stats = state.stats
    return {
        "calls": stats.success.count,
        "failures": stats.fail.count,
        "batches": stats.execution_count,
        "batch_sizes": {size: entry.compute_infer.count for size, entry in sorted(stats.batch_stats.items())},
        "queued": state.batcher.queue_depth,
    }


def batch(
    fn: Callable[..., Any] | None = None,
    *,
    max_batch_size: int = 32,
    max_queue_delay_microseconds: int = 0,
    preferred_batch_size: Sequence[int] = (),
    max_concurrent_batches: int = 1,
    batch_size: Callable[[Any], int] | None = None,
) -> Any:
    """Decorate ``fn(items: list) -> list`` so that callers pass one item at a time and
    calls are executed together in batches.

    ``max_batch_size`` bounds a batch (in items, or in the units ``batch_size(item)``
    returns, e.g. tokens); ``max_queue_delay_microseconds`` is how long the oldest call may
    wait for company (0: a batch leaves as soon as the function is free);
    ``preferred_batch_size`` lists sizes worth leaving early for; ``max_concurrent_batches``
    lets several batches run at once. Usable as ``@batch`` or ``@batch(...)``.
    """
    make = functools.partial(
        BatchedFunction, max_batch_size=max_batch_size, max_queue_delay_microseconds=max_queue_delay_microseconds,
        preferred_batch_size=preferred_batch_size, max_concurrent_batches=max_concurrent_batches, batch_size=batch_size,
    )
    return make(fn) if fn is not None else make
