"""DynamicBatcher: the asyncio side of one model's scheduling.

Forms batches from the model's queue and hands them to idle instances; each instance
slot, when free, forms its own next batch, so instances never fragment each other's
batches. Pipelined: a slot hands its instance the next batch before it answers the one
that returned, and, on an instance that queues batches, while the current one still runs
(``_staged``), so the instance never waits for Python between batches.
Decisions: request_queue.py (pure); time: clock.py; each request waits as a
``Pending`` answered through its ``Answer`` (pending.py); instances sit behind a small
protocol. Generic payloads (model_loader.batcher_for: InferRequests); no HTTP, no JSON.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable, Protocol, Sequence

import numpy as np

from nereid.config.schema import DynamicBatching
from nereid.errors import (
    ExecutionTimeoutError,
    InternalError,
    ModelExecutionError,
    NereidError,
    RequestTimeoutError,
    UnavailableError,
)
from nereid.scheduling.clock import PRECISE_BELOW_NS, SYSTEM_CLOCK, Cancellable, Clock, SystemClock, wake
from nereid.scheduling.pending import Answer, CallbackAnswer, InOrder, OnAnswer, Pending, Stream
from nereid.scheduling.queue import RequestQueue
from nereid.stats import ModelStats

__all__ = ["DynamicBatcher", "Instance", "Outcome"]

_log = logging.getLogger("nereid")

#: The least time before a running batch is expected to end at which the next batch (not
#: full) is formed and handed to its instance (``DynamicBatcher._staged``).
_STAGE_LEAD_NS = 1_000_000


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


@dataclass(slots=True)
class _Running:
    """A batch handed to an instance: its task (``_run``) and when it could start (now,
    or once the batch before it on its slot returned: ``started`` is moved then)."""

    batch: tuple[Pending, ...]
    task: asyncio.Task[Outcome | None]
    started: int
    #: when the batch before it on its slot ended, if it was ready then (back to back)
    after: int | None = None
    #: handed over ahead of time and not begun: its requests still count as queued
    held: bool = False
    #: handed over ahead of time (while the batch before it ran)
    ahead: bool = False


@dataclass(frozen=True, slots=True)
class _Failed:
    """The Outcome of a batch whose instance raised instead of reporting one."""

    error: NereidError
    outputs: None = None
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


class DynamicBatcher:
    """Batches one model version's requests onto its instances.

    ``async with DynamicBatcher(...) as batcher: await batcher.infer(request)``; leaving
    the block drains it (``aclose``). Each accepted request is a ``Pending`` record; its
    ``Answer`` is how it is answered (pending.py).
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
        execution_timeout_ms: int = 0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``cost_of`` counts a payload against ``max_batch_size``, payloads batch only
        with equal ``signature_of``, ``rows_of`` is what statistics count;
        ``execution_timeout_ms`` (0: none) bounds a batch on an instance that does not
        enforce it; ``clock``: tests pass one they move by hand."""
        self.model_name = model_name
        self.instances = tuple(instances)
        self.stats = stats
        self._time = clock
        # looked up once: for SYSTEM_CLOCK, time.monotonic_ns and (from __aenter__) loop.call_at
        self._clock: Callable[[], int] = clock.monotonic_ns
        self._call_at: Callable[..., Cancellable] = clock.call_at
        self._cost_of = cost_of
        self._signature_of = signature_of
        self._rows_of = rows_of
        self._queue: RequestQueue[Pending] = RequestQueue(max_batch_size=max_batch_size, dynamic_batching=dynamic_batching)
        #: decoupled models stream: their batches run through ``run_stream``.
        self.streaming = streaming
        self._timeout_s = execution_timeout_ms / 1000 if execution_timeout_ms > 0 else None
        self._form_lock = asyncio.Lock()
        self._arrival: asyncio.Future[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._executing = 0
        self._idle = 0  # slots waiting in _next_batch
        self._stagers: set[asyncio.Future[None]] = set()  # busy slots waiting for a full batch
        self._late_stagers: set[asyncio.Future[None]] = set()  # ... for any batch (theirs is about to end)
        self._typical_ns = 0  # how long a batch runs, lately (a moving average; 0: none ran yet)
        self._last_arrival_ns = 0
        self._timer = clock.precise_timer(model_name)
        preserve = dynamic_batching is not None and dynamic_batching.preserve_ordering
        self._order: InOrder | None = InOrder() if preserve else None

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Change the batch bound at run time (applies to batches formed from now on)."""
        self._queue.set_max_batch_size(max_batch_size)

    def set_max_queue_delay(self, microseconds: int) -> None:
        """Change the queue delay at run time."""
        self._queue.set_max_queue_delay(microseconds)
        wake(self._arrival)

    @property
    def queue_depth(self) -> int:
        """Requests waiting now: in the queue, or in a batch handed to an instance ahead of
        time that has not begun."""
        return len(self._queue) + self._queue.held

    @property
    def executing(self) -> int:
        """Batches running now."""
        return self._executing

    async def __aenter__(self) -> DynamicBatcher:
        if isinstance(self._time, SystemClock):  # real time's timers are the loop's own
            self._call_at = asyncio.get_running_loop().call_at
        for instance in self.instances:
            for slot in range(instance.capacity):
                self._workers.append(asyncio.create_task(self._worker(instance), name=f"nereid-batcher-{instance.name}-{slot}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> bool:
        """Stop taking requests; run what was already accepted (queued ones too, without
        waiting out the queue delay); then stop the workers. After ``drain_timeout`` what
        is still queued or running fails with UnavailableError, and False is returned
        (batches abandoned in the model)."""
        if self._closed:
            return True
        self._closed = True
        wake(self._arrival)
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
        return not pending

    # -- the three ways in: each queues a Pending with its own kind of Answer ---------------

    async def infer(self, payload: Any, received_ns: int | None = None) -> Any:
        """Queue one payload and wait for its result (for a model: its own output rows).
        Raises QueueFullError, RequestTimeoutError, ModelExecutionError, InvalidInputError
        (cost beyond max_batch_size) or UnavailableError (stopping). A caller cancelled
        while the payload waits takes it out of the queue unexecuted."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending = self._enqueue(payload, received_ns, future)
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(pending)
            raise

    def submit(self, payload: Any, received_ns: int | None, on_answer: OnAnswer) -> Pending:
        """Queue one payload without waiting; ``on_answer(result, error)`` is called once,
        on the loop, straight from the batch that answers it (``error``: None, what
        ``infer`` would raise, or a CancelledError when withdrawn): no Future and no
        scheduled callback per request. Raises what ``infer`` raises before queueing.
        ``withdraw()`` the returned Pending if the caller goes away."""
        return self._enqueue(payload, received_ns, CallbackAnswer(on_answer))

    async def stream(self, payload: Any, received_ns: int | None = None) -> AsyncGenerator[Any, None]:
        """Queue one request of a decoupled model and yield its outputs step by step, until
        the model marks it finished or its batch's generator ends. Leaving the iteration
        early (the client went away) takes it out of the queue, or out of its batch."""
        steps = Stream()
        pending = self._enqueue(payload, received_ns, steps)
        try:
            async for step in steps:
                yield step
        finally:
            if not steps.done():
                self.withdraw(pending)

    def withdraw(self, pending: Pending) -> None:
        """Its caller no longer wants ``pending``: it leaves the queue unexecuted (counted
        as CANCELED) or, already running, gets no answer (a stream: no more steps)."""
        pending.answer.cancel()
        if self._queue.discard(pending):
            self.stats.record_failure(self._clock() - pending.received_ns, "CANCELED")

    def _enqueue(self, payload: Any, received_ns: int | None, answer: Answer) -> Pending:
        """Queue a payload with its Answer. Raises UnavailableError once closed,
        QueueFullError (counted as REJECTED)."""
        if self._closed:
            raise UnavailableError(f"model '{self.model_name}' is not accepting requests")
        now = self._clock()
        if received_ns is None:
            received_ns = now
        queue = self._queue
        level = 0 if queue.single_level else queue.level_for(getattr(payload, "priority", 0))
        deadline_ns = queue.deadline_for(level, now, getattr(payload, "timeout_us", None)) if queue.timed else 0
        pending = Pending(self._cost_of(payload), self._signature_of(payload), level, now, deadline_ns,
                          payload, received_ns, answer, self)
        try:
            queue.push(pending)
        except NereidError:
            self.stats.record_failure(self._clock() - received_ns, "REJECTED")
            raise
        if self._order is not None:
            self._order.track(pending)
        self._last_arrival_ns = now
        wake(self._arrival)
        for waiter in self._late_stagers:
            wake(waiter)
        if self._stagers and queue.full:
            for waiter in self._stagers:
                wake(waiter)
        if deadline_ns:
            # Timeouts fire even while every instance is busy and nobody forms a batch.
            self._call_at(deadline_ns / 1e9, self._expire_timeouts)
        return pending

    # -- workers -----------------------------------------------------------------------

    async def _worker(self, instance: Instance) -> None:
        """One slot of ``instance``: runs batch after batch, pipelined (see ``_Running``).

        When a batch returns, the next one (if one is due) is formed and handed to the
        instance before the returned one is answered, and its answers go out from the loop
        afterwards: answering never delays the next batch. On an instance that queues
        batches (``queues_batches``: it starts the next one itself the moment the current
        one returns), a full batch is handed over already while the current one runs."""
        if self.streaming:
            await self._stream_worker(instance)
            return
        loop = asyncio.get_running_loop()
        # Ahead of time only where nothing times a wait: a request's queue timeout (it must
        # be able to expire until its batch begins) or an execution timeout the instance does
        # not enforce itself (it would count the wait for the batch before).
        stage = bool(getattr(instance, "queues_batches", False)) and not self._queue.timed and (
            self._timeout_s is None or getattr(instance, "enforces_timeout", False))
        current: _Running | None = None
        following: _Running | None = None
        try:
            while True:
                if current is None:
                    batch = await self._next_batch()
                    if batch is None:
                        return
                    current = self._launch(loop, instance, batch)
                if stage:
                    following = await self._staged(loop, instance, current)
                outcome = await current.task
                ended = self._clock()
                if following is None:
                    batch = self._take_now()
                    if batch:
                        following = self._launch(loop, instance, batch)
                self._executing -= 1
                # the instance's own times when it reports them, else as the loop saw them
                began = getattr(outcome, "began_ns", 0) or current.started
                finished = getattr(outcome, "ended_ns", 0) or ended
                if current.after is not None:  # handed over ahead: it began once the one before ended
                    began = max(began, current.after)
                self.stats.busy.add(finished - began)
                if outcome is not None and outcome.error is None:
                    typical = self._typical_ns
                    self._typical_ns = finished - began if not typical else (7 * typical + finished - began) // 8
                if current.after is not None:  # it was ready when the batch before it ended
                    self.stats.idle_between.add(max(0, began - current.after))
                if following is not None:
                    # back to back: it could start once this one ended (staged), or now
                    following.started = max(following.started, ended)
                    following.after = finished
                    self._begun(following)
                if outcome is not None and self._retries(outcome, current.batch):
                    await self._rerun_each(instance, current.batch)
                elif outcome is not None:
                    loop.call_soon(self._answer, current.batch, current.started, outcome)
                current, following = following, None
        except asyncio.CancelledError:  # aclose gave up on them: their requests get an answer
            for running in (current, following):
                if running is not None:
                    self._begun(running)
                    running.task.cancel()
                    for pending in running.batch:
                        self._fail(pending, UnavailableError(
                            f"model '{self.model_name}' was unloaded while this request ran in it"))
            raise

    async def _stream_worker(self, instance: Instance) -> None:
        """One slot of a decoupled model's instance: a batch at a time."""
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self._executing += 1
            try:
                await self._execute_stream(instance, batch)
            except asyncio.CancelledError:  # aclose gave up on it: its requests get an answer
                for pending in batch:
                    self._fail(pending, UnavailableError(
                        f"model '{self.model_name}' was unloaded while this request ran in it"))
                raise
            finally:
                self._executing -= 1

    def _begun(self, running: _Running) -> None:
        """A batch handed over ahead of time began: its requests no longer count as queued."""
        if running.held:
            running.held = False
            self._queue.release(running.batch)

    def _launch(self, loop: asyncio.AbstractEventLoop, instance: Instance, batch: tuple[Pending, ...]) -> _Running:
        """Hand ``batch`` to ``instance`` (its task starts on the loop's next turn, before any
        answer queued after it with call_soon)."""
        self._executing += 1
        return _Running(batch, loop.create_task(self._run(instance, batch)), self._clock())

    async def _staged(self, loop: asyncio.AbstractEventLoop, instance: Instance, current: _Running) -> _Running | None:
        """While ``current`` runs: the next batch, handed to the instance early so that it
        starts the moment ``current`` returns (unless another slot is idle to take it): a
        full one as soon as it is queued; where this is the model's one slot, once
        ``current`` is about to end (its expected
        duration, from the batches before it, less a tenth of that or 1 ms at least:
        ``lead``), a batch Triton's rules let leave, when it is as large as ``current``
        or nothing arrived for ``lead`` (until then, more may come before ``current``
        ends). None if ``current`` returns first."""
        task = current.task
        # A batch that is not full goes ahead of time only where this is the model's one
        # slot: with several, it waits for the first slot to be free and grows meanwhile
        # (handed early to each busy slot, the load would split into ever smaller batches).
        typical = self._typical_ns if len(self._workers) == 1 else 0
        lead = max(typical // 10, _STAGE_LEAD_NS)
        # it began when the batch before it ended, by the instance's own clock, if it was
        # handed over ahead of time (the loop may see that end late); else when handed over
        began = current.after if current.ahead and current.after is not None else current.started
        due_at = began + typical - lead if typical else None
        size = sum(pending.cost for pending in current.batch)
        queue = self._queue
        while not task.done() and not self._closed:
            now = self._clock()
            late = due_at is not None and now >= due_at
            quiet_at = self._last_arrival_ns + lead
            if self._idle == 0 and (queue.full or (late and (queue.queued_cost >= size or now >= quiet_at))):
                batch = self._take_now(only_full=not late)
                if batch:
                    queue.hold(batch)
                    staged = self._launch(loop, instance, batch)
                    staged.held = staged.ahead = True
                    return staged
            waiter: asyncio.Future[None] = loop.create_future()
            # woken by an arrival (any, once late; else one that fills a batch), when it is
            # due (or, late, when arrivals have been quiet for lead), or when current returns
            (self._late_stagers if late else self._stagers).add(waiter)
            wake_at = (max(quiet_at, now) if late else due_at) if due_at is not None else None
            timer = self._call_at(wake_at / 1e9, wake, waiter) if wake_at is not None else None

            def returned(_: object, waiter: asyncio.Future[None] = waiter) -> None:
                wake(waiter)

            task.add_done_callback(returned)
            try:
                await waiter
            finally:
                self._stagers.discard(waiter)
                self._late_stagers.discard(waiter)
                task.remove_done_callback(returned)
                if timer is not None:
                    timer.cancel()
        return None

    def _take_now(self, only_full: bool = False) -> tuple[Pending, ...]:
        """The batch due now (empty if none), requests whose timeout expired failed; the
        time it took counts as ``batch_formation``."""
        while True:
            started = self._clock()
            decision = self._queue.decide(started, flush=self._closed, only_full=only_full)
            for item in decision.expired:
                self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
            live = tuple(item for item in decision.batch if not item.answer.done())
            if live:
                self.stats.formation.add(self._clock() - started)
                return live
            if not decision.batch:
                return ()

    async def _next_batch(self) -> tuple[Pending, ...] | None:
        """The next batch for an idle slot; None once closed and the queue is empty."""
        loop = asyncio.get_running_loop()
        self._idle += 1
        try:
            async with self._form_lock:
                while True:
                    closing = self._closed
                    started = self._clock()
                    decision = self._queue.decide(started, flush=closing)
                    for item in decision.expired:
                        self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
                    live = tuple(item for item in decision.batch if not item.answer.done())
                    if live:
                        self.stats.formation.add(self._clock() - started)
                        return live
                    if decision.batch:
                        continue
                    if closing and len(self._queue) == 0:
                        wake(self._arrival)  # let the next idle slot see it too
                        return None
                    arrival = self._arrival = loop.create_future()
                    timer = None
                    precise = False
                    wake_at = decision.wake_at_ns
                    if wake_at is not None:
                        if wake_at - self._clock() < PRECISE_BELOW_NS:
                            self._timer.wake_at(wake_at, arrival)
                            precise = True
                        else:
                            timer = self._call_at(wake_at / 1e9, wake, arrival)
                    try:
                        await arrival
                    finally:
                        if timer is not None:
                            timer.cancel()
                        if precise:
                            self._timer.cancel()
        finally:
            self._idle -= 1

    async def _run(self, instance: Instance, batch: tuple[Pending, ...]) -> Outcome | None:
        """Run ``batch`` on ``instance``: its Outcome (what the instance raised, contained in
        one), or None when it ran past the execution timeout (its requests are answered)."""
        try:
            if self._timeout_s is None or getattr(instance, "enforces_timeout", False):
                return await instance.run_batch([pending.request for pending in batch])
            return await self._run_timed(instance, batch, self._timeout_s)
        except BaseException as exc:  # the instance's to report, never to end this worker with
            return self._contained(instance, exc)

    @staticmethod
    def _retries(outcome: Outcome, batch: tuple[Pending, ...]) -> bool:
        """Whether a failed batch is rerun a request at a time to find the culprit."""
        return outcome.error is not None and len(batch) > 1 and isinstance(outcome.error, ModelExecutionError)

    async def _execute(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """Run ``batch`` and answer it, nothing pipelined (a failed batch's reruns)."""
        started = self._clock()
        outcome = await self._run(instance, batch)
        if outcome is None:
            return
        if self._retries(outcome, batch):
            await self._rerun_each(instance, batch)
        else:
            self._answer(batch, started, outcome)

    async def _rerun_each(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """Find the culprit of a failed batch: rerun one request at a time so only it fails."""
        for pending in batch:
            if not pending.answer.done():
                await self._execute(instance, (pending,))
            else:  # withdrawn while its batch ran (its client left): not rerun
                self.stats.record_failure(self._clock() - pending.received_ns, "CANCELED")

    def _answer(self, batch: tuple[Pending, ...], started: int, outcome: Outcome) -> None:
        """Answer a batch that began on its instance at ``started`` and returned (called
        from the loop once the instance has its next batch); the time it takes counts as
        ``batch_answer``."""
        begun = self._clock()
        if outcome.error is not None:
            for pending in batch:
                if pending.answer.done():  # withdrawn while it ran: it failed all the same
                    self.stats.record_failure(begun - pending.received_ns, "BACKEND")
                else:
                    self._fail(pending, outcome.error, "BACKEND")
            self.stats.answer.add(self._clock() - begun)
            return
        assert outcome.outputs is not None
        rows_of = self._rows_of
        rows = sum(rows_of(pending.request) for pending in batch)
        self.stats.record_execution(
            rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns
        )
        # Counted before any answer goes out: a client that reads the statistics once
        # answered finds its request in them.
        end = begun
        total_ns = 0
        queue_times: list[int] = []
        for pending, outputs in zip(batch, outcome.outputs):
            if not isinstance(outputs, NereidError):  # withdrawn while it ran too: executed, so counted
                total_ns += end - pending.received_ns
                queue_times.append(started - pending.enqueued_ns)
        self.stats.record_successes(
            total_ns, queue_times, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns
        )
        order = self._order  # None: answers go out at once, else they may have to wait
        for pending, outputs in zip(batch, outcome.outputs):
            answer = pending.answer
            if isinstance(outputs, NereidError):  # that request alone failed (a Triton model's error response)
                if answer.done():
                    self.stats.record_failure(end - pending.received_ns, "BACKEND")
                else:
                    self._fail(pending, outputs, "BACKEND")
            elif answer.done():  # withdrawn while it ran (its client left)
                pass
            elif order is None:
                answer.set_result(outputs)
            else:
                order.answer(pending, True, outputs)
        self.stats.answer.add(self._clock() - begun)

    async def _execute_stream(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """One batch of a decoupled model: every step reaches each request still listening;
        a request leaves when the model marks it finished; the generator is closed once
        nobody listens. A failure fails every request not finished yet (no retry: some
        may already have received steps)."""
        started = self._clock()
        payloads = [pending.request for pending in batch]
        streams: list[Stream] = [pending.answer for pending in batch]  # type: ignore[misc]  # a streaming batch: all Streams
        stats = self.stats

        def sink(parts: list[Any], finished: list[bool]) -> None:
            # A part may be None (nothing for that request this time: finished alone
            # ends it) or a NereidError (that request alone fails).
            for stream, part, last in zip(streams, parts, finished):
                if part is None:
                    if last:
                        stream.finish()
                elif isinstance(part, NereidError):
                    stream.set_exception(part)
                elif last:
                    stream.set_result(part)
                else:
                    stream.put(part)

        def abandoned() -> bool:
            return all(stream.done() for stream in streams)

        # Steps from a sync generator reach ``sink`` through call_soon_threadsafe, in order and
        # before the executor's completion callback, so every step is delivered by now.
        try:
            outcome = await instance.run_stream(payloads, sink, abandoned)  # type: ignore[attr-defined]
        except BaseException as exc:  # the instance's to report, never to end this worker with
            outcome = self._contained(instance, exc)
        end = self._clock()
        if outcome.error is None:
            rows = sum(self._rows_of(p) for p in payloads)
            stats.record_execution(rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
        for pending, stream in zip(batch, streams):
            if outcome.error is not None:
                stream.set_exception(outcome.error)
            else:
                stream.finish()  # the generator ended: so does every open stream
            if stream.finished:
                stats.record_success(end - pending.received_ns, started - pending.enqueued_ns,
                                     outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
            else:
                stats.record_failure(end - pending.received_ns, "BACKEND" if outcome.error is not None else "CANCELED")

    async def _run_timed(self, instance: Instance, batch: tuple[Pending, ...], timeout_s: float) -> Outcome | None:
        """``run_batch`` under the execution timeout. Past it the batch's requests fail at
        once, and the instance (a thread stuck in model code: nothing can stop it) stays
        out of rotation, this worker waiting, until the batch returns; its ``problem``
        says so meanwhile. None when it timed out."""
        run = asyncio.ensure_future(instance.run_batch([pending.request for pending in batch]))
        done, _ = await asyncio.wait((run,), timeout=timeout_s)
        if done:
            return run.result()
        ms = round(timeout_s * 1000)
        error = ExecutionTimeoutError(
            f'model "{self.model_name}" instance {instance.name}: the batch ran past execution_timeout_ms '
            f"({ms} ms); the instance is out of rotation until it returns",
            model=self.model_name,
        )
        _log.error("%s", error.message)
        for pending in batch:
            self._fail(pending, error, "BACKEND")
        setattr(instance, "problem", f"instance {instance.name} is stuck in a batch past execution_timeout_ms ({ms} ms)")
        try:
            await asyncio.wait((run,))
        finally:
            setattr(instance, "problem", None)
        if not run.cancelled() and run.exception() is None:
            _log.warning("model '%s' instance %s: the batch that ran past its execution timeout returned; "
                         "the instance is back in rotation", self.model_name, instance.name)
        return None

    def _contained(self, instance: Instance, exc: BaseException) -> _Failed:
        """The outcome of a batch whose instance raised ``exc`` (it reports model errors in
        its outcome; this is a bug, or a SystemExit & co that got through): logged, and
        failing that batch only. The loop cancelling this worker goes on up."""
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is None or task.cancelling() > 0:
                raise exc
        _log.error("internal error in model '%s' (instance %s)", self.model_name, instance.name, exc_info=exc)
        text = str(exc)
        return _Failed(InternalError(
            f"internal error in model '{self.model_name}': {type(exc).__name__}" + (f": {text}" if text else "")
        ))

    def _expire_timeouts(self) -> None:
        for item in self._queue.expire(self._clock()):
            self._fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")

    def _fail(self, pending: Pending, error: NereidError, reason: str = "OTHER") -> None:
        if pending.answer.done():
            return
        if self._order is None:
            pending.answer.set_exception(error)
        else:
            self._order.answer(pending, False, error)
        self.stats.record_failure(self._clock() - pending.received_ns, reason)
