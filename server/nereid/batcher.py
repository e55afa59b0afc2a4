"""DynamicBatcher: the asyncio side of one model's scheduling.

Forms batches from the model's queue and hands them to idle instances; each instance
slot, when free, forms its own next batch, so instances never fragment each other's
batches. The decisions live in request_queue.py (pure); array work in batch.py; the
instances behind a small protocol. Knows nothing about HTTP or JSON.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import operator
import threading
import time
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

import numpy as np

from nereid.batch_arrays import request_cost, signature_function
from nereid.config.schema import DynamicBatching, ModelConfig
from nereid.errors import (
    InvalidInputError,
    ModelExecutionError,
    NereidError,
    RequestTimeoutError,
    UnavailableError,
)
from nereid.inference import InferRequest
from nereid.request_queue import QueuedRequest, RequestQueue
from nereid.stats import ModelStats

__all__ = ["SYSTEM_CLOCK", "Cancellable", "Clock", "DynamicBatcher", "Instance", "OnAnswer", "Outcome", "PreciseTimer",
           "SystemClock", "Ticket"]

_log = logging.getLogger("nereid")


class Outcome(Protocol):
    """What an instance reports for one batch: per-payload results, or one error."""

    @property
    def outputs(self) -> Sequence[Any] | None: ...
    @property
    def error(self) -> NereidError | None: ...
    @property
    def compute_input_ns(self) -> int: ...
    @property
    def compute_infer_ns(self) -> int: ...
    @property
    def compute_output_ns(self) -> int: ...


class Instance(Protocol):
    """What the batcher needs of an instance (``instance.ModelInstance`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int: ...
    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None: ...

    async def run_batch(self, requests: Sequence[Any], /) -> Outcome: ...


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
                        loop.call_soon_threadsafe(_wake, future)
                    except RuntimeError:  # the loop is closed
                        pass


#: Waits shorter than this go to the precise timer (event-loop timers have 1 ms steps).
_PRECISE_BELOW_NS = 2_000_000


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


class _Stream:
    """The channel of one streaming request: steps in (from the batch), out to its caller.

    Quacks like the futures of non-streaming requests where the batcher needs it
    (``done()``, ``set_exception()``), so queueing, timeouts and draining treat both alike.
    """

    __slots__ = ("_queue", "_done", "finished")

    _END = object()

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._done = False
        #: True once the request got its last step (not when it failed or was abandoned).
        self.finished = False

    def done(self) -> bool:
        return self._done

    def put(self, outputs: Any) -> None:
        if not self._done:
            self._queue.put_nowait(outputs)

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self.finished = True
            self._queue.put_nowait(_Stream._END)

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait(error)

    def abandon(self) -> None:
        self._done = True

    async def get(self) -> Any:
        return await self._queue.get()


#: ``on_answer(result, error)``: how ``DynamicBatcher.submit`` answers a callback caller.
OnAnswer = Callable[[Any, "BaseException | None"], None]


class _Callback:
    """The answer slot of a payload submitted with ``on_answer``: quacks like the future
    the batcher otherwise resolves (``done``, ``set_result``, ``set_exception``,
    ``cancel``) but calls ``on_answer`` at once. A failing ``on_answer`` is logged: it
    must not stop the batch that answers the other requests."""

    __slots__ = ("_done", "_on_answer")

    def __init__(self, on_answer: OnAnswer) -> None:
        self._on_answer = on_answer
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any, error: BaseException | None = None) -> None:
        """Call ``on_answer(result, error)`` unless answered already. Also how
        ``set_exception`` and ``cancel`` answer (one method: the batch calls this one once
        per answered request, so it is not a wrapper)."""
        if self._done:
            return
        self._done = True
        try:
            self._on_answer(result, error)
        except Exception:  # noqa: BLE001 - one caller's failure must not fail its batch mates
            _log.exception("answering a request failed")

    def set_exception(self, error: BaseException) -> None:
        self.set_result(None, error)

    def cancel(self) -> None:
        self.set_result(None, asyncio.CancelledError())


class Ticket:
    """One submitted payload: ``future`` gets its result (for ``submit`` with
    ``on_answer``: an object that calls it); ``withdraw()`` when its caller no longer
    wants it (it leaves the queue unexecuted, counted as CANCELED)."""

    __slots__ = ("future", "item", "_batcher")

    def __init__(self, future: Any, item: QueuedRequest, batcher: DynamicBatcher) -> None:
        self.future = future
        self.item = item
        self._batcher = batcher

    def withdraw(self) -> None:
        self._batcher._withdraw(self)


class DynamicBatcher:
    """Batches one model version's requests onto its instances.

    Use as ``async with DynamicBatcher(...) as batcher: await batcher.infer(request)``.
    Leaving the block stops taking requests, lets running batches finish (drain) and fails
    what is still queued with UnavailableError.
    """

    def __init__(
        self,
        *,
        model_name: str,
        max_batch_size: int,
        dynamic_batching: DynamicBatching | None,
        instances: Sequence[Instance],
        stats: ModelStats,
        cost_of: Callable[[Any], int] = lambda payload: 1,
        signature_of: Callable[[Any], Any] = lambda payload: None,
        rows_of: Callable[[Any], int] = lambda payload: 1,
        streaming: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """A batcher over generic payloads: ``cost_of`` counts a payload against
        ``max_batch_size``, payloads batch together only with equal ``signature_of``, and
        ``rows_of`` is what statistics count. ``for_model`` builds one for InferRequests.
        ``clock`` is where time comes from (tests pass one they move by hand)."""
        self.model_name = model_name
        self.instances = tuple(instances)
        self.stats = stats
        self._time = clock
        # The clock's parts, looked up once: for SYSTEM_CLOCK ``_clock`` is time.monotonic_ns
        # itself, and ``_call_at`` becomes the loop's own call_at in __aenter__.
        self._clock: Callable[[], int] = clock.monotonic_ns
        self._call_at: Callable[..., Cancellable] = clock.call_at
        self._cost_of = cost_of
        self._signature_of = signature_of
        self._rows_of = rows_of
        self._queue = RequestQueue(max_batch_size=max_batch_size, dynamic_batching=dynamic_batching)
        #: decoupled models stream: their batches run through ``run_stream``.
        self.streaming = streaming
        self._form_lock = asyncio.Lock()
        self._arrival: asyncio.Future[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._executing = 0
        self._timer = clock.precise_timer(model_name)
        # preserve_ordering: requests in arrival order, and the outcomes of those that
        # finished before an earlier one (held back until it finishes).
        preserve = dynamic_batching is not None and dynamic_batching.preserve_ordering
        self._order: collections.deque[QueuedRequest] | None = collections.deque() if preserve else None
        self._held: dict[int, tuple[bool, Any]] = {}

    @classmethod
    def for_model(
        cls, model_name: str, config: ModelConfig, instances: Sequence[Instance], stats: ModelStats
    ) -> DynamicBatcher:
        """The batcher of a served model: cost is rows (or the model's ``batch_size()``),
        requests whose shapes differ never share a batch (unless padded)."""
        cost_fn = instances[0].cost_function if instances else None
        batching = config.dynamic_batching is not None and config.max_batch_size > 0
        limit = config.max_batch_size

        rows_of: Callable[[InferRequest], int] = operator.attrgetter("rows")

        def cost_of(request: InferRequest) -> int:
            cost = request_cost(request, cost_fn)
            if batching and cost > limit:
                raise InvalidInputError(
                    f"model '{model_name}': request cost {cost} (from Model.batch_size) "
                    f"exceeds max_batch_size {limit}",
                    model=model_name,
                )
            return cost

        return cls(
            model_name=model_name,
            max_batch_size=config.max_batch_size,
            dynamic_batching=config.dynamic_batching,
            instances=instances,
            stats=stats,
            cost_of=rows_of if cost_fn is None else cost_of,
            signature_of=signature_function(config),
            rows_of=rows_of,
            streaming=config.decoupled,
        )

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Change the batch bound at run time (applies to batches formed from now on)."""
        self._queue.set_max_batch_size(max_batch_size)

    def set_max_queue_delay(self, microseconds: int) -> None:
        """Change the queue delay at run time."""
        self._queue.set_max_queue_delay(microseconds)
        _wake_optional(self._arrival)

    @property
    def queue_depth(self) -> int:
        """Requests waiting in the queue now."""
        return len(self._queue)

    @property
    def executing(self) -> int:
        """Batches running now."""
        return self._executing

    async def __aenter__(self) -> DynamicBatcher:
        if isinstance(self._time, SystemClock):
            # Real time's timers are the loop's: bind its call_at once, so that scheduling a
            # request's timeout costs what calling the loop directly costs.
            self._call_at = asyncio.get_running_loop().call_at
        for instance in self.instances:
            for slot in range(instance.capacity):
                task = asyncio.create_task(
                    self._worker(instance), name=f"nereid-batcher-{instance.name}-{slot}"
                )
                self._workers.append(task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> None:
        """Stop taking requests; run what was already accepted (queued ones too, without
        waiting out the queue delay); then stop the workers. After ``drain_timeout``
        seconds whatever is still queued fails with UnavailableError."""
        if self._closed:
            return
        self._closed = True
        _wake_optional(self._arrival)
        done, pending = await asyncio.wait(self._workers, timeout=drain_timeout) if self._workers else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._timer.stop()
        while len(self._queue):
            decision = self._queue.decide(self._clock(), flush=True)
            for item in decision.batch + decision.expired:
                self._fail(item, UnavailableError(f"model '{self.model_name}' was unloaded"))
        self._workers.clear()

    async def infer(self, payload: Any, received_ns: int | None = None) -> Any:
        """Queue one payload and wait for its result (for a model: its own output rows).

        Raises QueueFullError, RequestTimeoutError, ModelExecutionError, InvalidInputError
        (cost beyond max_batch_size) or UnavailableError (stopping). If the caller is
        cancelled while the payload waits, it leaves the queue unexecuted.
        """
        ticket = self.submit(payload, received_ns)
        try:
            return await ticket.future
        except asyncio.CancelledError:
            ticket.withdraw()
            raise

    def submit(
        self, payload: Any, received_ns: int | None = None, on_answer: OnAnswer | None = None
    ) -> Ticket:
        """Queue one payload without waiting. Raises what ``infer`` raises before queueing.

        Without ``on_answer`` the ticket's future gets the result (or the error ``infer``
        would raise). With it, ``on_answer(result, error)`` is called once instead, on the
        loop, straight from the batch that answers it (``error`` is None on success, a
        CancelledError when withdrawn): no Future and no scheduled callback per request,
        and the batch's answers go out before its worker forms the next batch. For
        callers that answer from a callback (the native HTTP engine)."""
        answer: Any = _Callback(on_answer) if on_answer is not None else asyncio.get_running_loop().create_future()
        item, _ = self._enqueue(payload, answer, received_ns)
        return Ticket(answer, item, self)

    def _withdraw(self, ticket: Ticket) -> None:
        ticket.future.cancel()
        if self._queue.discard(ticket.item):
            self.stats.record_failure(self._clock() - ticket.item.payload[2], "CANCELED")

    async def stream(self, payload: Any, received_ns: int | None = None) -> AsyncIterator[Any]:
        """Queue one request of a decoupled model and yield its outputs step by step, until
        the model marks it finished or its batch's generator ends. Leaving the iteration
        early (the client went away) takes it out of the queue, or out of its batch."""
        channel = _Stream()
        item, received_ns = self._enqueue(payload, channel, received_ns)
        finished = False
        try:
            while True:
                step = await channel.get()
                if step is _Stream._END:
                    finished = True
                    return
                if isinstance(step, BaseException):
                    finished = True
                    raise step
                yield step
        finally:
            if not finished:
                channel.abandon()
                if self._queue.discard(item):
                    self.stats.record_failure(self._clock() - received_ns, "CANCELED")

    def _enqueue(self, payload: Any, answer: Any, received_ns: int | None) -> tuple[QueuedRequest, int]:
        """Queue a payload with what will answer it (a future, or a stream's channel).
        Raises UnavailableError once closed, QueueFullError (counted as REJECTED)."""
        if self._closed:
            raise UnavailableError(f"model '{self.model_name}' is not accepting requests")
        now = self._clock()
        if received_ns is None:
            received_ns = now
        queue = self._queue
        level = 0 if queue.single_level else queue.level_for(getattr(payload, "priority", 0))
        deadline_ns = queue.deadline_for(level, now, getattr(payload, "timeout_us", None)) if queue.timed else 0
        item = QueuedRequest((payload, answer, received_ns), self._cost_of(payload), self._signature_of(payload),
                             level, now, deadline_ns)
        try:
            queue.push(item)
        except NereidError:
            self.stats.record_failure(self._clock() - received_ns, "REJECTED")
            raise
        if self._order is not None and not isinstance(answer, _Stream):
            self._order.append(item)
        _wake_optional(self._arrival)
        if item.deadline_ns:
            # Timeouts fire even while every instance is busy and nobody forms a batch.
            self._call_at(item.deadline_ns / 1e9, self._expire_timeouts)
        return item, received_ns

    # -- workers -----------------------------------------------------------------------

    async def _worker(self, instance: Instance) -> None:
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self._executing += 1
            try:
                await self._execute(instance, batch)
            finally:
                self._executing -= 1

    async def _next_batch(self) -> tuple[QueuedRequest, ...] | None:
        """The next batch for an idle slot; None once closed and the queue is empty."""
        loop = asyncio.get_running_loop()
        async with self._form_lock:
            while True:
                closing = self._closed
                decision = self._queue.decide(self._clock(), flush=closing)
                for item in decision.expired:
                    self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
                live = tuple(item for item in decision.batch if not item.payload[1].done())
                if live:
                    return live
                if decision.batch:
                    continue
                if closing and len(self._queue) == 0:
                    _wake_optional(self._arrival)  # let the next idle slot see it too
                    return None
                arrival = self._arrival = loop.create_future()
                timer = None
                precise = False
                wake_at = decision.wake_at_ns
                if wake_at is not None:
                    if wake_at - self._clock() < _PRECISE_BELOW_NS:
                        self._timer.wake_at(wake_at, arrival)
                        precise = True
                    else:
                        timer = self._call_at(wake_at / 1e9, _wake, arrival)
                try:
                    await arrival
                finally:
                    if timer is not None:
                        timer.cancel()
                    if precise:
                        self._timer.cancel()

    async def _execute(self, instance: Instance, batch: tuple[QueuedRequest, ...]) -> None:
        if self.streaming:
            await self._execute_stream(instance, batch)
            return
        started = self._clock()
        payloads = [item.payload[0] for item in batch]
        outcome = await instance.run_batch(payloads)
        if outcome.error is not None and len(batch) > 1 and isinstance(outcome.error, ModelExecutionError):
            # Find the culprit: rerun one request at a time so only it fails.
            for item in batch:
                if not item.payload[1].done():
                    await self._execute(instance, (item,))
            return
        if outcome.error is not None:
            for item in batch:
                self._fail(item, outcome.error, "BACKEND")
            return
        assert outcome.outputs is not None
        rows_of = self._rows_of
        rows = sum(rows_of(payload) for payload in payloads)
        self.stats.record_execution(
            rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns
        )
        end = self._clock()
        total_ns = 0
        queue_times: list[int] = []
        resolve = self._resolve
        in_order = self._order is None  # else answers may have to wait (_resolve)
        for item, outputs in zip(batch, outcome.outputs):
            _, future, received_ns = item.payload
            if future.done():
                continue
            if in_order:
                future.set_result(outputs)
            else:
                resolve(item, True, outputs)
            total_ns += end - received_ns
            queue_times.append(started - item.enqueued_ns)
        self.stats.record_successes(
            total_ns, queue_times, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns
        )

    async def _execute_stream(self, instance: Instance, batch: tuple[QueuedRequest, ...]) -> None:
        """One batch of a decoupled model: every step reaches each request still listening;
        a request leaves when the model marks it finished; the generator is closed once
        nobody listens. A failure fails every request not finished yet (no retry: some
        may already have received steps)."""
        started = self._clock()
        payloads = [item.payload[0] for item in batch]
        channels: list[_Stream] = [item.payload[1] for item in batch]
        stats = self.stats

        def sink(parts: list[Any], finished: list[bool]) -> None:
            for channel, part, done in zip(channels, parts, finished):
                if channel.done():
                    continue
                channel.put(part)
                if done:
                    channel.finish()

        def abandoned() -> bool:
            return all(channel.done() for channel in channels)

        # Steps from a sync generator reach ``sink`` through call_soon_threadsafe, in order and
        # before the executor's completion callback, so every step is delivered by now.
        outcome = await instance.run_stream(payloads, sink, abandoned)  # type: ignore[attr-defined]
        end = self._clock()
        if outcome.error is None:
            rows = sum(self._rows_of(p) for p in payloads)
            stats.record_execution(rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
        for item, channel in zip(batch, channels):
            received_ns = item.payload[2]
            if not channel.done():
                if outcome.error is not None:
                    channel.set_exception(outcome.error)
                else:
                    channel.finish()  # the generator ended: so does every open stream
            if channel.finished:
                stats.record_success(end - received_ns, started - item.enqueued_ns, outcome.compute_input_ns,
                                     outcome.compute_infer_ns, outcome.compute_output_ns)
            else:
                stats.record_failure(end - received_ns, "BACKEND" if outcome.error is not None else "CANCELED")

    def _expire_timeouts(self) -> None:
        for item in self._queue.expire(self._clock()):
            self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")

    def _fail(self, item: QueuedRequest, error: NereidError, reason: str = "OTHER") -> None:
        _, future, received_ns = item.payload
        if future.done():
            return
        self._resolve(item, False, error)
        self.stats.record_failure(self._clock() - received_ns, reason)

    def _resolve(self, item: QueuedRequest, ok: bool, value: Any) -> None:
        """Answer a request, or with preserve_ordering hold the answer until every request
        that arrived before it has its own (Triton's response ordering)."""
        order = self._order
        if order is None or isinstance(item.payload[1], _Stream):
            _answer(item.payload[1], ok, value)
            return
        self._held[item.seq] = (ok, value)
        while order:
            head = order[0]
            future = head.payload[1]
            held = self._held.pop(head.seq, None)
            if held is not None:
                _answer(future, *held)
            elif not future.done():
                return  # an earlier request is still running or queued
            order.popleft()


def _answer(future: Any, ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _wake_optional(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


