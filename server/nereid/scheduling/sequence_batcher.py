"""SequenceBatcher: the asyncio side of a stateful model's scheduling (sequence_batching).

Each instance is a lane of slots (sequences.py decides who holds which slot and which
batch is due); one task per lane runs its batches one at a time, so a sequence's requests
reach its slot in order. Each step gets its control and state inputs
(sequence_tensors.py); the state outputs are kept for the sequence's next step and never
returned. An empty row of a direct batch runs a null request whose outputs are dropped.
Idle sequences are released, and backlogged ones past their timeout rejected, on the
injected clock's timer. The same ways in as DynamicBatcher (``infer``, ``submit``,
``withdraw``, ``aclose``); no HTTP, no JSON.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator, Sequence

from nereid.config.schema import ModelConfig
from nereid.errors import InternalError, NereidError, RequestCancelledError, RequestTimeoutError, UnavailableError
from nereid.inference import InferRequest
from nereid.scheduling.clock import SYSTEM_CLOCK, Cancellable, Clock
from nereid.scheduling.execution import Execution, Instance, Outcome
from nereid.scheduling.pending import Answer, Answers, CallbackAnswer, OnAnswer, Pending, awaited
from nereid.scheduling.sequence_tensors import SequenceTensors
from nereid.scheduling.sequences import Rows, Sequences
from nereid.stats import ModelStats

__all__ = ["SequenceBatcher"]

_log = logging.getLogger("nereid")


def _rows(request: Any) -> int:
    return int(getattr(request, "rows", 1))


def _id(pending: Pending) -> int | str:
    flags = pending.request.sequence
    return flags.id if flags is not None else 0


class _Dropped:
    """The Answer of a null request: nobody listens, so it counts as answered already
    (whatever fails or answers a batch passes it over)."""

    def done(self) -> bool:
        return True

    def set_result(self, outputs: Any) -> None:
        pass

    def set_exception(self, error: BaseException) -> None:
        pass

    def cancel(self) -> None:
        pass


_DROPPED = _Dropped()


class SequenceBatcher:
    """Schedules one sequence model version's requests onto its instances' slots.

    ``async with SequenceBatcher(...) as batcher: await batcher.infer(request)``; leaving
    the block drains it (``aclose``)."""

    def __init__(self, *, config: ModelConfig, tensors: SequenceTensors, instances: Sequence[Instance],
                 stats: ModelStats, clock: Clock = SYSTEM_CLOCK) -> None:
        batching = config.sequence_batching
        assert batching is not None
        self.model_name = config.name
        self.instances = tuple(instances)
        self.stats = stats
        self.streaming = False
        self._tensors = tensors
        self._clock = clock.monotonic_ns
        self._call_at = clock.call_at
        strategy = batching.strategy
        slots = max(1, config.max_batch_size)
        if strategy is not None and strategy.kind == "oldest" and strategy.max_candidate_sequences > 0:
            slots = strategy.max_candidate_sequences
        self.sequences = Sequences(config.name, len(self.instances), slots, config.max_batch_size, strategy,
                                   batching.max_sequence_idle_microseconds)
        self._answers = Answers(stats, _rows, None, self._clock)
        self._execution = Execution(config.name, self._answers, _rows, self._answer_rerun, config.execution_timeout_ms)
        self._wakes: list[asyncio.Event] = [asyncio.Event() for _ in self.instances]
        self._timers: list[Cancellable | None] = [None for _ in self.instances]
        self._reaper: Cancellable | None = None
        self._reaper_at: int | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._executing = 0

    @property
    def queue_depth(self) -> int:
        """Requests waiting now."""
        return self.sequences.queued

    @property
    def executing(self) -> int:
        """Batches running now."""
        return self._executing

    async def __aenter__(self) -> SequenceBatcher:
        for index, instance in enumerate(self.instances):
            name = f"nereid-sequences-{instance.name}"
            self._workers.append(asyncio.create_task(self._lane(index, instance), name=name))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> bool:
        """Stop taking requests; run what was already accepted (without waiting out a queue
        delay); then stop. After ``drain_timeout`` what is left fails with
        UnavailableError and False is returned."""
        if self._closed:
            return True
        self._closed = True
        for wake in self._wakes:
            wake.set()
        done, pending = await asyncio.wait(self._workers, timeout=drain_timeout) if self._workers else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for item in self.sequences.abandon():
            self._answers.fail(item, UnavailableError(f"model '{self.model_name}' was unloaded"))
        if self._reaper is not None:
            self._reaper.cancel()
        return not pending

    # -- the ways in ------------------------------------------------------------------------

    async def infer(self, payload: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                    timeout_us: int | None = None) -> Any:
        """Queue one request in its sequence and wait for its outputs. Raises Triton's
        InvalidInputError for a request the sequence batcher refuses (sequences.py).
        ``priority`` is ignored, as Triton ignores it for a model without dynamic batching
        (its priority levels are 0: Model::Init, InferenceRequest::SetPriority);
        ``timeout_us`` (0 or None: none) bounds only a wait in the backlog for a slot."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        return await awaited(future, self._enqueue(payload, received_ns, future, timeout_us))

    def submit(self, payload: InferRequest, received_ns: int | None, on_answer: OnAnswer, *, priority: int = 0,
               timeout_us: int | None = None) -> Pending:
        """Queue one request without waiting; ``on_answer(outputs, error)`` is called once."""
        return self._enqueue(payload, received_ns, CallbackAnswer(on_answer), timeout_us)

    async def stream(self, payload: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                     timeout_us: int | None = None) -> AsyncGenerator[Any, None]:
        """A sequence model is never decoupled (config rules): one answer, as one step."""
        yield await self.infer(payload, received_ns, timeout_us=timeout_us)

    def withdraw(self, pending: Pending) -> None:
        """Its caller went away: out of its sequence unexecuted (CANCELED), or no answer
        if it runs already. A queued request cancelled ends its sequence, as in Triton: the
        requests queued behind it fail CANCELED too (sequences.py ``withdraw``)."""
        pending.answer.cancel()
        cancelled = self.sequences.withdraw(pending)
        if cancelled is None:
            return
        self.stats.record_failure(self._clock() - pending.received_ns, "CANCELED")
        for other in cancelled[1:]:
            self._answers.fail(other, RequestCancelledError(
                f"model '{self.model_name}': sequence {_id(other)} was cancelled (a request of it was cancelled "
                "before it ran)"), "CANCELED")
        self._after_batch()  # its slot may have freed

    def _enqueue(self, payload: InferRequest, received_ns: int | None, answer: Answer,
                 timeout_us: int | None) -> Pending:
        if self._closed:
            raise UnavailableError(f"model '{self.model_name}' is not accepting requests")
        now = self._clock()
        received = now if received_ns is None else received_ns
        pending = Pending(1, self._tensors.signature(payload), 0, now, 0, payload, received, answer, self)
        # A refusal is not counted: Triton refuses before the request is enqueued
        # (PrepareForInference, SequenceBatchScheduler::Enqueue) and counts nothing.
        self._tensors.check(payload)
        occupant = self.sequences.admit(pending, payload.sequence, payload.rows, now, timeout_us)
        if occupant.lane >= 0:
            self._wakes[occupant.lane].set()
        elif occupant.expires_ns is not None:
            self._schedule_reaper()
        return pending

    # -- lanes ------------------------------------------------------------------------------

    async def _lane(self, index: int, instance: Instance) -> None:
        """One instance's slots: batch after batch, one at a time."""
        wake = self._wakes[index]
        while True:
            batch, due = self.sequences.take(index, self._clock(), flush=self._closed)
            if not batch:
                if self._closed and not self._lane_has_work(index):
                    return
                wake.clear()
                self._wake_at(index, due)
                await wake.wait()
                continue
            try:
                await self._run(index, instance, batch)
            except asyncio.CancelledError:  # aclose gave up on it: its requests get an answer
                for occupant in batch:
                    if occupant is not None:
                        self._answers.fail(occupant.queue[0], UnavailableError(
                            f"model '{self.model_name}' was unloaded while this request ran in it"))
                raise
            except Exception as exc:  # a bug: it fails this batch, never the lane (its slots would hang)
                _log.exception("internal error in the sequence batcher of model '%s'", self.model_name)
                for occupant in batch:
                    if occupant is not None:
                        self._answers.fail(occupant.queue[0], InternalError(
                            f"internal error in model '{self.model_name}': {type(exc).__name__}: {exc}"))
            finally:
                self.sequences.done(index, batch)
                self._after_batch()

    def _lane_has_work(self, index: int) -> bool:
        """Requests queued in this lane's slots (the backlog's wait for a slot to end: at
        close, those that never get one fail in ``aclose``)."""
        return any(o is not None and o.queue for o in self.sequences.lanes[index].slots)

    def _wake_at(self, index: int, due: int | None) -> None:
        timer = self._timers[index]
        if timer is not None:
            timer.cancel()
        self._timers[index] = None if due is None else self._call_at(due / 1e9, self._wakes[index].set)

    def _after_batch(self) -> None:
        """Slots may have changed hands (ended sequences, the backlog moved in): every lane
        looks again; the idle reaper is rescheduled."""
        for wake in self._wakes:
            wake.set()
        self._schedule_reaper()

    async def _run(self, index: int, instance: Instance, batch: Rows) -> None:
        """Run one batch: each row's request stepped (controls, state), a null request
        in each empty row; answer the real rows only."""
        for occupant in batch:
            if occupant is not None:
                pending = occupant.queue[0]
                pending.request = self._tensors.step(pending.request, occupant.state)
        started = self._clock()
        rows = tuple(self._null(batch, started) if occupant is None else occupant.queue[0] for occupant in batch)
        self._executing += 1
        try:
            outcome = await self._execution.run(instance, rows)
        finally:
            self._executing -= 1
        if outcome is None:  # past the execution timeout: answered already
            return
        self._answer(batch, started, outcome)

    def _null(self, batch: Rows, now: int) -> Pending:
        """The null request of an empty row, shaped after the batch's first real row."""
        model = next(occupant for occupant in batch if occupant is not None).queue[0].request
        return Pending(1, None, 0, now, 0, self._tensors.null(model), now, _DROPPED, self)

    def _answer(self, batch: Rows, started: int, outcome: Outcome) -> None:
        pendings = tuple(occupant.queue[0] for occupant in batch if occupant is not None)
        if outcome.error is not None or outcome.outputs is None:
            error = outcome.error or UnavailableError(f"model '{self.model_name}' returned no outputs")
            self._answers.batch_failed(pendings, error, None)
            return
        answers: list[Any] = []
        for occupant, output in zip(batch, outcome.outputs):
            if occupant is None:  # a null request's outputs: dropped, no state kept
                continue
            if isinstance(output, NereidError):
                answers.append(output)
                continue
            answer, occupant.state = self._tensors.keep(output, occupant.state)
            answers.append(answer)
        self._answers.batch(pendings, started, answers,
                            (outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns), None)

    def _answer_rerun(self, batch: tuple[Pending, ...], started: int, outcome: Outcome) -> None:
        raise AssertionError("a sequence batch is never rerun")  # Execution.execute is not used here

    # -- idle sequences ---------------------------------------------------------------------

    def _schedule_reaper(self) -> None:
        times = [t for t in (self.sequences.next_idle_ns(), self.sequences.next_expiry_ns()) if t is not None]
        at = min(times) if times else None
        if at == self._reaper_at:
            return
        if self._reaper is not None:
            self._reaper.cancel()
        self._reaper_at = at
        self._reaper = None if at is None else self._call_at(at / 1e9, self._reap)

    def _reap(self) -> None:
        self._reaper = self._reaper_at = None
        now = self._clock()
        for occupant in self.sequences.expire_backlog(now):
            # SequenceBatchScheduler::ReaperThread: Status::Code::UNAVAILABLE, FailureReason::REJECTED
            for pending in occupant.queue:
                self._answers.fail(pending, RequestTimeoutError(
                    "timeout of the corresponding sequence has been expired"), "REJECTED")
            occupant.queue.clear()
        released = self.sequences.release_idle(now)
        for occupant in released:
            _log.info("model '%s': sequence %s released after %d us idle", self.model_name, occupant.id,
                      self.sequences.idle_ns // 1000)
        if released:
            for wake in self._wakes:
                wake.set()
        self._schedule_reaper()
