"""DynamicBatcher: the asyncio side of one model's scheduling.

Forms batches from the model's queue and hands them to idle instances; each instance
slot, when free, forms its own next batch, so instances never fragment each other's
batches. Pipelined: a slot hands its instance the next batch before it answers the one
that returned, and, on an instance that queues batches, while the current one still runs
(staging.py), so the instance never waits for Python between batches.
Decisions: queue.py (pure); time: clock.py; each request waits as a ``Pending`` answered
through its ``Answer`` (pending.py); running and answering a batch, and the instance
protocol: execution.py. What a batcher holds, and how it is started, tuned and drained
(none of it per request): batcher_lifecycle.py. Generic payloads
(models.loader.batcher_for: InferRequests); no HTTP, no JSON.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncGenerator, Sequence

from nereid.errors import NereidError, QueueFullError, RequestTimeoutError, UnavailableError
from nereid.scheduling.batcher_lifecycle import BatcherLifecycle
from nereid.scheduling.clock import PRECISE_BELOW_NS
from nereid.scheduling.execution import Instance, Outcome
from nereid.scheduling.pending import Answer, Bundle, BundleAnswer, CallbackAnswer, OnAnswer, Pending, Stream, awaited
from nereid.scheduling.staging import Running, Stage

__all__ = ["DynamicBatcher", "Instance", "Outcome"]

#: a batch that returned, as ``_answer`` takes it: the batch, when it began, its Outcome,
#: its scheduling figures
_Answered = tuple[tuple[Pending, ...], int, Outcome, tuple[int, int | None, int]]


class DynamicBatcher(BatcherLifecycle):
    """Batches one model version's requests onto its instances.

    ``async with DynamicBatcher(...) as batcher: await batcher.infer(request)``; leaving
    the block drains it (``aclose``). Each accepted request is a ``Pending`` record; its
    ``Answer`` is how it is answered (pending.py). Its constructor, run-time settings,
    gauges and ``aclose``: ``BatcherLifecycle`` (batcher_lifecycle.py).
    """

    # -- the three ways in: each queues a Pending with its own kind of Answer ---------------

    async def infer(self, payload: Any, received_ns: int | None = None, *, priority: int = 0,
                    timeout_us: int | None = None) -> Any:
        """Queue one payload and wait for its result (for a model: its own output rows).
        ``priority`` (0: the default level) and ``timeout_us`` (None: the queue policy's)
        are the request's own, honoured as the config allows. Raises QueueFullError,
        RequestTimeoutError, ModelExecutionError, InvalidInputError (cost beyond
        max_batch_size) or UnavailableError (stopping). A caller cancelled while the
        payload waits takes it out of the queue unexecuted."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        return await awaited(future, self._enqueue(payload, received_ns, future, priority, timeout_us))

    def submit(self, payload: Any, received_ns: int | None, on_answer: OnAnswer, *, priority: int = 0,
               timeout_us: int | None = None) -> Pending:
        """Queue one payload without waiting; ``on_answer(result, error)`` is called once,
        on the loop, straight from the batch that answers it (``error``: None, what
        ``infer`` would raise, or a CancelledError when withdrawn): no Future and no
        scheduled callback per request. Raises what ``infer`` raises before queueing.
        ``withdraw()`` the returned Pending if the caller goes away."""
        return self._enqueue(payload, received_ns, CallbackAnswer(on_answer), priority, timeout_us)

    def submit_many(self, payloads: Sequence[Any], received_ns: Sequence[int], answers: Sequence[Answer], *,
                    priority: int = 0, timeout_us: int | None = None) -> list[Pending | NereidError]:
        """Queue several payloads of one priority and timeout at once, each answered
        through its own ``Answer`` (pending.py: ``set_result``, ``set_exception``,
        ``cancel``), not a callback: one clock reading, one wake-up and one timeout timer
        for them all. Each is still its own queue entry (max_queue_size, priority,
        timeout, cancellation and errors are per payload). One result per payload: its
        Pending (``withdraw()`` it as ``submit``'s), or the error that refused it
        (QueueFullError, counted as REJECTED). Raises UnavailableError once closed."""
        now, level, deadline_ns = self._admission(priority, timeout_us)
        cost_of, signature_of = self._cost_of, self._signature_of
        try:
            entries = [Pending(cost_of(payload), signature_of(payload), level, now, deadline_ns, payload, received,
                               answer, self) for payload, received, answer in zip(payloads, received_ns, answers)]
        except NereidError:  # a payload's cost cannot be counted (Model.batch_size): one at a time, it fails alone
            return [self._admit_or_error(payload, received, answer, level, now, deadline_ns)
                    for payload, received, answer in zip(payloads, received_ns, answers)]
        queued = self._queue.push_many(entries)
        admitted: list[Pending | NereidError] = list(entries[:queued])
        for pending in entries[queued:]:
            self.stats.record_failure(now - pending.received_ns, "REJECTED")
            admitted.append(QueueFullError("Exceeds maximum queue size"))
        if self._order is not None:
            for pending in entries[:queued]:
                self._order.track(pending)
        self._arrived(now, deadline_ns)
        return admitted

    def submit_bundle(self, payload: Any, count: int, received_ns: int, answer: BundleAnswer, *, priority: int = 0,
                      timeout_us: int | None = None) -> Bundle | NereidError:
        """Queue ``count`` alike requests of one caller as one entry (a ``Bundle``: one
        queue entry, one payload of all their rows, ``received_ns`` their mean), answered
        at once through ``answer``; only where ``bundle_limit`` allows it, and with a cost
        within it. Its Bundle (``withdraw_part`` when one of them is no longer wanted), or
        the error that refused it. Raises UnavailableError once closed."""
        now, level, deadline_ns = self._admission(priority, timeout_us)
        bundle = Bundle(self._cost_of(payload), self._signature_of(payload), level, now, deadline_ns, payload,
                        received_ns, answer, self)
        bundle.count = count
        try:
            self._queue.push(bundle)
        except NereidError as exc:
            self.stats.record_failure(now - received_ns, "REJECTED", count)
            return exc
        if self._order is not None:
            self._order.track(bundle)
        self._arrived(now, deadline_ns)
        return bundle

    def withdraw_part(self, bundle: Pending, payload: Any, received_ns: int) -> bool:
        """One of the requests ``bundle`` stands for (received at ``received_ns``) is no
        longer wanted. While the bundle waits, it leaves it: the bundle holds ``payload``
        (its other requests' rows) from now on and that request is counted as CANCELED
        (True). Once a batch took the bundle, its rows run and are counted (False: its
        answer is for the bundle's Answer to drop)."""
        if bundle.removed:
            return False
        count = bundle.count
        if count <= 1:  # its last request: the bundle goes
            self.withdraw(bundle)
            return True
        bundle.received_ns = (bundle.received_ns * count - received_ns) // (count - 1)
        bundle.request = payload
        self._queue.recost(bundle, self._cost_of(payload), count - 1)
        self.stats.record_failure(self._clock() - received_ns, "CANCELED")
        return True

    def _admit_or_error(self, payload: Any, received_ns: int, answer: Answer, level: int, now: int,
                        deadline_ns: int) -> Pending | NereidError:
        try:
            pending = self._admit(payload, received_ns, answer, level, now, deadline_ns)
        except NereidError as exc:
            return exc
        self._arrived(now, deadline_ns)
        return pending

    async def stream(self, payload: Any, received_ns: int | None = None, *, priority: int = 0,
                     timeout_us: int | None = None) -> AsyncGenerator[Any, None]:
        """Queue one request of a decoupled model and yield its outputs step by step, until
        the model marks it finished or its batch's generator ends. Leaving the iteration
        early (the client went away) takes it out of the queue, or out of its batch."""
        steps = Stream()
        pending = self._enqueue(payload, received_ns, steps, priority, timeout_us)
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
            self.stats.record_failure(self._clock() - pending.received_ns, "CANCELED", pending.count)

    def _enqueue(self, payload: Any, received_ns: int | None, answer: Answer, priority: int,
                 timeout_us: int | None) -> Pending:
        """Queue a payload with its Answer. Raises UnavailableError once closed,
        QueueFullError (counted as REJECTED)."""
        now, level, deadline_ns = self._admission(priority, timeout_us)
        pending = self._admit(payload, now if received_ns is None else received_ns, answer, level, now, deadline_ns)
        self._arrived(now, deadline_ns)
        return pending

    def _admission(self, priority: int, timeout_us: int | None) -> tuple[int, int, int]:
        """Now, the queue level of ``priority`` and the queue deadline of ``timeout_us``
        for requests arriving now. Raises UnavailableError once closed."""
        if self._closed:
            raise UnavailableError(f"model '{self.model_name}' is not accepting requests")
        now = self._clock()
        queue = self._queue
        level = 0 if queue.single_level else queue.level_for(priority)
        return now, level, queue.deadline_for(level, now, timeout_us) if queue.timed else 0

    def _admit(self, payload: Any, received_ns: int, answer: Answer, level: int, now: int, deadline_ns: int) -> Pending:
        """Into the queue (QueueFullError, counted as REJECTED, when there is no room)."""
        pending = Pending(self._cost_of(payload), self._signature_of(payload), level, now, deadline_ns,
                          payload, received_ns, answer, self)
        try:
            self._queue.push(pending)
        except NereidError:
            self.stats.record_failure(self._clock() - received_ns, "REJECTED")
            raise
        if self._order is not None:
            self._order.track(pending)
        return pending

    def _arrived(self, now: int, deadline_ns: int) -> None:
        """Requests were queued at ``now``: wake an idle slot, let a busy one look, and
        time their deadline."""
        self._wake_idle()
        stager = self._stager
        stager.last_arrival_ns = now
        if stager.stages:
            stager.arrived()
        if deadline_ns:
            # Timeouts fire even while every instance is busy and nobody forms a batch.
            self._call_at(deadline_ns / 1e9, self._expire_timeouts)

    # -- slots -------------------------------------------------------------------------

    async def _worker(self, instance: Instance) -> None:
        """One slot of ``instance``: runs batch after batch, pipelined.

        When a batch returns, the next one (if one is due) is formed and handed to the
        instance before the returned one is answered. On an instance that queues batches
        (it starts the next one itself the moment the current one returns), the next
        batch may be handed over already while the current one runs (``Stage``): only
        where nothing times a wait, neither a request's queue timeout (it must be able to
        expire until its batch begins) nor an execution timeout the instance does not
        enforce itself (it would count the wait for the batch before)."""
        if self.streaming:
            await self._stream_worker(instance)
            return
        execution = self._execution
        timed = execution.timed(instance)
        stages = instance.queues_batches and not self._queue.timed and not timed
        current: Running | None = None
        following: Running | None = None
        # answers put off to the loop's next turn, oldest first: whatever answers at once
        # answers these first, so this slot's batches are answered in the order they ran
        deferred: deque[_Answered] = deque()
        try:
            while True:
                if current is None:
                    batch = await self._next_batch()
                    if batch is None:
                        return
                    current = self._launch(instance, batch, timed)
                outcome, following = await self._finish(instance, current, stages)
                ended = self._clock()
                if following is None and len(self._queue):
                    batch = self._take_now()
                    if batch:
                        following = self._launch(instance, batch, timed)
                self._executing -= 1
                scheduling = self._scheduling(current, outcome, ended, following)
                if outcome is None or (outcome.error is not None and execution.retries(outcome, current.batch)):
                    self.stats.record_scheduling(*scheduling)
                    if outcome is not None:
                        await execution.rerun_each(instance, current.batch)
                elif following is None:  # nothing waits: answer at once (no loop turn)
                    while deferred:
                        self._answer(*deferred.popleft())
                    self._answer(current.batch, current.started, outcome, scheduling)
                else:
                    # On the loop's next turn: the next batch's task (if it is one) starts
                    # first, and between the two turns the loop releases the GIL (its poll),
                    # so the instance's thread begins that batch before the answers go out.
                    deferred.append((current.batch, current.started, outcome, scheduling))
                    asyncio.get_running_loop().call_soon(self._answer_deferred, deferred)
                current, following = following, None
        except asyncio.CancelledError:  # aclose gave up on them: their requests get an answer
            for running in (current, following):
                if running is not None:
                    self._unloaded(running)
            raise

    def _launch(self, instance: Instance, batch: tuple[Pending, ...], timed: bool = False, /) -> Running:
        """Hand ``batch`` to ``instance`` now: the instance's own future where it gives one
        (the batch is with it already), else a task that starts on the loop's next turn,
        before any callback scheduled after it. ``timed``: it runs under the execution
        timeout (``Execution.run``)."""
        self._executing += 1
        execution = self._execution
        future: asyncio.Future[Outcome | None]
        if timed:
            future = asyncio.ensure_future(execution.run(instance, batch))
        else:
            try:
                running = instance.run_batch([pending.request for pending in batch])
            except BaseException as exc:  # the instance's to report, never to end the caller with
                running = asyncio.get_running_loop().create_future()
                running.set_result(execution.contained(instance, exc))
            if asyncio.isfuture(running):
                future = running
            else:
                future = asyncio.ensure_future(execution.contain(instance, running))
        return Running(batch, future, self._clock(), formation_ns=self._formation_ns)

    async def _finish(self, instance: Instance, current: Running, stages: bool) -> tuple[Outcome | None, Running | None]:
        """Wait for ``current`` to return (while it runs, its slot's next batch may be
        handed over: ``Stager.look``): its Outcome, and the next batch if handed over."""
        stage: Stage | None = None
        if stages:
            stage = Stage(instance, current, self._typical_ns if len(self._workers) == 1 else 0)
            self._stager.stages.append(stage)
            if len(self._queue):
                self._stager.look(stage)
        try:
            return await current.future, None if stage is None else stage.following
        except BaseException as exc:  # the instance's to report, never to end this worker with
            return self._execution.contained(instance, exc), None if stage is None else stage.following
        finally:
            if stage is not None:
                self._stager.stages.remove(stage)
                if stage.timer is not None:
                    stage.timer.cancel()

    def _scheduling(self, current: Running, outcome: Outcome | None, ended: int,
                    following: Running | None) -> tuple[int, int | None, int]:
        """``current``'s scheduling figures (``ModelStats.record_scheduling``): its time on
        its instance (the instance's own times when it reports them, else as the loop saw
        them), the instance's idle time before it (None: it was not ready when the one
        before ended) and its formation time. ``following`` could start once it ended."""
        began = outcome.began_ns if outcome is not None and outcome.began_ns else current.started
        finished = outcome.ended_ns if outcome is not None and outcome.ended_ns else ended
        idle = None
        if current.after is not None:  # handed over ahead: it began once the one before ended
            began = max(began, current.after)
            idle = max(0, began - current.after)
        if outcome is not None and outcome.error is None:
            typical = self._typical_ns
            self._typical_ns = finished - began if not typical else (7 * typical + finished - began) // 8
        if following is not None:
            # back to back: it could start once this one ended (staged), or now
            following.started = max(following.started, ended)
            following.after = finished
            self._begun(following)
        return finished - began, idle, current.formation_ns

    def _answer(self, batch: tuple[Pending, ...], started: int, outcome: Outcome,
                scheduling: tuple[int, int | None, int] | None) -> None:
        """Answer a batch that began on its instance at ``started`` and returned (from the
        loop once the instance has its next batch; ``Answers``)."""
        if outcome.error is not None:
            self._answers.batch_failed(batch, outcome.error, scheduling)
        else:
            assert outcome.outputs is not None
            self._answers.batch(batch, started, outcome.outputs,
                                (outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns), scheduling)

    def _answer_deferred(self, deferred: deque[_Answered]) -> None:
        """The oldest answer a slot put off (none if the slot answered it already)."""
        if deferred:
            self._answer(*deferred.popleft())

    def _answer_rerun(self, batch: tuple[Pending, ...], started: int, outcome: Outcome) -> None:
        self._answer(batch, started, outcome, None)

    def _unloaded(self, running: Running) -> None:
        """aclose gave up on ``running``: its requests fail."""
        self._begun(running)
        running.future.cancel()
        for pending in running.batch:
            self._answers.fail(pending, UnavailableError(f"model '{self.model_name}' was unloaded while this request ran in it"))

    async def _stream_worker(self, instance: Instance) -> None:
        """One slot of a decoupled model's instance: a batch at a time."""
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self.stats.record_formation(self._formation_ns)
            self._executing += 1
            try:
                await self._execution.execute_stream(instance, batch)
            except asyncio.CancelledError:  # aclose gave up on it: its requests get an answer
                for pending in batch:
                    self._answers.fail(pending, UnavailableError(
                        f"model '{self.model_name}' was unloaded while this request ran in it"))
                raise
            finally:
                self._executing -= 1

    def _begun(self, running: Running) -> None:
        """A batch handed over ahead of time began: its requests no longer count as queued."""
        if running.held:
            running.held = False
            self._queue.release(running.batch)

    # -- forming batches -----------------------------------------------------------------

    def _form(self, only_full: bool = False, /) -> tuple[tuple[Pending, ...], int | None]:
        """The batch due now (empty if none) and, if none, when the queue next wants a look
        (None: only on an arrival); requests whose timeout expired fail. The time it took
        is ``_formation_ns`` (``batch_formation``, counted with the batch)."""
        while True:
            started = self._clock()
            decision = self._queue.decide(started, flush=self._closed, only_full=only_full)
            for item in decision.expired:
                self._answers.fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
            live = tuple(item for item in decision.batch if not item.answer.done())
            if live:
                self._formation_ns = self._clock() - started
                return live, None
            if not decision.batch:
                return (), decision.wake_at_ns

    def _take_now(self) -> tuple[Pending, ...]:
        return self._form()[0]

    async def _next_batch(self) -> tuple[Pending, ...] | None:
        """The next batch for an idle slot; None once closed and the queue is empty."""
        loop = asyncio.get_running_loop()
        self._idle += 1
        try:
            async with self._form_lock:
                while True:
                    closing = self._closed
                    batch, wake_at = self._form()
                    if batch:
                        return batch
                    if closing and len(self._queue) == 0:
                        self._wake_idle()  # let the next idle slot see it too
                        return None
                    await self._arrival_or(loop, wake_at)
        finally:
            self._idle -= 1

    def _wake_idle(self) -> None:
        """Wake the idle slot waiting in ``_arrival_or``, if any: a request arrived, its
        wait is over, or something changed (clock.wake, here: called once per request)."""
        arrival = self._arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    async def _arrival_or(self, loop: asyncio.AbstractEventLoop, wake_at: int | None) -> None:
        """Wait for an arrival (or a change: ``_wake_idle``), or until ``wake_at``."""
        arrival = self._arrival = loop.create_future()
        timer = None
        precise = False
        if wake_at is not None:
            if wake_at - self._clock() < PRECISE_BELOW_NS:
                self._timer.wake_at(wake_at, arrival)
                precise = True
            else:
                timer = self._call_at(wake_at / 1e9, self._wake_idle)
        try:
            await arrival
        finally:
            if timer is not None:
                timer.cancel()
            if precise:
                self._timer.cancel()

    def _expire_timeouts(self) -> None:
        for item in self._queue.expire(self._clock()):
            self._answers.fail(item, RequestTimeoutError("Request timeout expired"), "REJECTED")
