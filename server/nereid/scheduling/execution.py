"""What the batcher needs of an instance, and what it does when a batch goes wrong.

What the batcher uses of an instance (``Instance``) and what an instance reports for a
batch (``Outcome``); a failure the instance raised instead of reporting it, contained in
one (``Failed``); the execution timeout, past which an instance stuck in model code
leaves rotation until its batch returns; a failed batch rerun a request at a time to
find the culprit; and a decoupled model's batch, streamed. The common path (hand a batch
over, answer it) is the batcher's own (batcher.py). Knows nothing about queues, nor
about when a batch is formed or handed over (batcher.py, staging.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Protocol, Sequence

import numpy as np

from nereid.errors import ExecutionTimeoutError, InternalError, ModelExecutionError, NereidError
from nereid.inference import InferRequest
from nereid.scheduling.pending import Answers, Bundle, Pending, Stream

__all__ = ["Execution", "Failed", "Instance", "Outcome", "StepSink"]

_log = logging.getLogger("nereid")

#: Receives one streamed step on the event loop: each request's part (None: nothing for
#: it this time; a NereidError: it alone fails) and whether it is finished with this step.
StepSink = Callable[[list[Any], list[bool]], None]


class Outcome(Protocol):
    """What an instance reports for one batch: per-payload results (a NereidError for a
    payload that alone failed), or one error for the whole batch; the three compute
    durations; and when the instance began and ended it (``time.monotonic_ns``; 0: not
    known, the batcher then counts the times it saw itself)."""

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
    @property
    def began_ns(self) -> int: ...
    @property
    def ended_ns(self) -> int: ...


class Instance(Protocol):
    """Everything the batcher uses of an instance (``instances.thread.ModelInstance`` and
    ``instances.process.ProcessInstance`` are ones)."""

    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> int:
        """How many batches it may run at once (the batcher runs one slot per batch)."""
    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None: ...
    @property
    def sees_requests(self) -> bool:
        """Its model is given a batch's requests one by one, so it sees how they were
        grouped (a Bundle would be one request to it)."""
    @property
    def enforces_timeout(self) -> bool:
        """It ends a batch past the execution timeout itself (else the batcher times it)."""
    @property
    def queues_batches(self) -> bool:
        """A batch handed over while another runs waits in the instance and starts the
        moment that one returns (else the batcher hands batches over one at a time)."""
    @property
    def problem(self) -> str | None:
        """Why it cannot serve now (None: it can)."""
    @problem.setter
    def problem(self, problem: str | None) -> None:
        """Set by the batcher while a batch is stuck past the execution timeout."""

    def run_batch(self, requests: Sequence[Any], /) -> Awaitable[Outcome]:
        """Run one batch (a coroutine, or a future when the batch is handed over at once)."""

    async def run_stream(self, requests: Sequence[Any], sink: StepSink, abandoned: Callable[[], bool], /) -> Outcome:
        """Run one batch of a decoupled model: each step goes to ``sink``; stop early once
        ``abandoned()``."""


class Failed:
    """The Outcome of a batch whose instance raised instead of reporting one: its error,
    no outputs, no compute or instance times."""

    __slots__ = ("error",)

    outputs = None
    compute_input_ns = compute_infer_ns = compute_output_ns = began_ns = ended_ns = 0

    def __init__(self, error: NereidError) -> None:
        self.error = error


#: ``answer(batch, started, outcome)``: answer a batch that returned (the batcher's).
AnswerBatch = Callable[[tuple[Pending, ...], int, Outcome], None]


class Execution:
    """What one model's batcher does when a batch does not simply run and return.

    ``answers`` fail requests and count them, ``answer`` answers a batch (the batcher's,
    through ``answers``: they keep preserve_ordering and the statistics);
    ``execution_timeout_ms`` (0: none) bounds a batch on an instance that does not
    enforce it itself."""

    def __init__(self, model_name: str, answers: Answers, rows_of: Callable[[Any], int], answer: AnswerBatch,
                 execution_timeout_ms: int) -> None:
        self.model_name = model_name
        self._answers = answers
        self._rows_of = rows_of
        self._answer = answer
        self._timeout_s = execution_timeout_ms / 1000 if execution_timeout_ms > 0 else None

    def timed(self, instance: Instance) -> bool:
        """Whether the batcher times ``instance``'s batches (an execution timeout it does
        not enforce itself): they then run through ``run``."""
        return self._timeout_s is not None and not instance.enforces_timeout

    async def run(self, instance: Instance, batch: tuple[Pending, ...]) -> Outcome | None:
        """Run ``batch`` on ``instance``: its Outcome (what the instance raised, contained in
        one), or None when it ran past the execution timeout (its requests are answered)."""
        if self._timeout_s is not None and self.timed(instance):
            return await self.contain(instance, self._run_timed(instance, batch, self._timeout_s))
        try:
            running = instance.run_batch([pending.request for pending in batch])
        except BaseException as exc:  # the instance's to report, never to end a worker with
            return self.contained(instance, exc)
        return await self.contain(instance, running)

    async def contain(self, instance: Instance, running: Awaitable[Outcome | None]) -> Outcome | None:
        """``running``'s Outcome, or what it raised contained in one (a coroutine run as a
        task must not raise a SystemExit & co: the loop would stop)."""
        try:
            return await running
        except BaseException as exc:  # the instance's to report, never to end a worker with
            return self.contained(instance, exc)

    async def _run_timed(self, instance: Instance, batch: tuple[Pending, ...], timeout_s: float) -> Outcome | None:
        """``run_batch`` under the execution timeout. Past it the batch's requests fail at
        once, and the instance (a thread stuck in model code: nothing can stop it) stays
        out of rotation, its worker waiting, until the batch returns; its ``problem``
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
            self._answers.fail(pending, error, "BACKEND")
        instance.problem = f"instance {instance.name} is stuck in a batch past execution_timeout_ms ({ms} ms)"
        try:
            await asyncio.wait((run,))
        finally:
            instance.problem = None
        if not run.cancelled() and run.exception() is None:
            _log.warning("model '%s' instance %s: the batch that ran past its execution timeout returned; "
                         "the instance is back in rotation", self.model_name, instance.name)
        return None

    def contained(self, instance: Instance, exc: BaseException) -> Failed:
        """The outcome of a batch whose instance raised ``exc`` (it reports model errors in
        its outcome; this is a bug, or a SystemExit & co that got through): logged, and
        failing that batch only. The loop cancelling the running task goes on up."""
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is None or task.cancelling() > 0:
                raise exc
        _log.error("internal error in model '%s' (instance %s)", self.model_name, instance.name, exc_info=exc)
        text = str(exc)
        return Failed(InternalError(
            f"internal error in model '{self.model_name}': {type(exc).__name__}" + (f": {text}" if text else "")
        ))

    @staticmethod
    def retries(outcome: Outcome, batch: tuple[Pending, ...]) -> bool:
        """Whether a failed batch is rerun a request at a time to find the culprit."""
        return isinstance(outcome.error, ModelExecutionError) and (len(batch) > 1 or isinstance(batch[0], Bundle))

    async def execute(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """Run ``batch`` and answer it, nothing pipelined (a failed batch's reruns)."""
        started = self._answers.clock()
        outcome = await self.run(instance, batch)
        if outcome is None:
            return
        if self.retries(outcome, batch):
            await self.rerun_each(instance, batch)
        else:
            self._answer(batch, started, outcome)

    async def rerun_each(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """Find the culprit of a failed batch: rerun one request at a time so only it fails
        (a Bundle's requests too, each alone)."""
        for pending in batch:
            if isinstance(pending, Bundle):
                await self._rerun_parts(instance, pending)
            elif not pending.answer.done():
                await self.execute(instance, (pending,))
            else:  # withdrawn while its batch ran (its client left): not rerun
                self._answers.stats.record_failure(self._answers.clock() - pending.received_ns, "CANCELED")

    async def _rerun_parts(self, instance: Instance, bundle: Bundle) -> None:
        """Rerun each request of ``bundle`` still wanted alone; those withdrawn while it ran
        are not rerun (CANCELED)."""
        parts = bundle.answer.parts(bundle.request)
        gone = bundle.count - len(parts)
        if gone > 0:
            self._answers.stats.record_failure(self._answers.clock() - bundle.received_ns, "CANCELED", gone)
        for payload, received_ns, answer in parts:
            part = Pending(self._rows_of(payload), bundle.signature, bundle.level, bundle.enqueued_ns,
                           bundle.deadline_ns, payload, received_ns, answer, bundle.batcher)
            await self.execute(instance, (part,))

    async def execute_stream(self, instance: Instance, batch: tuple[Pending, ...]) -> None:
        """One batch of a decoupled model: every step reaches each request still listening;
        a request leaves when the model marks it finished; the generator is closed once
        nobody listens. A failure fails every request not finished yet (no retry: some
        may already have received steps)."""
        started = self._answers.clock()
        payloads = [pending.request for pending in batch]
        streams: list[Stream] = [pending.answer for pending in batch]  # type: ignore[misc]  # a streaming batch: all Streams
        try:
            outcome = await instance.run_stream(payloads, _sink_for(streams), lambda: all(s.done() for s in streams))
        except BaseException as exc:  # the instance's to report, never to end a worker with
            outcome = self.contained(instance, exc)
        # Steps from a sync generator reach the sink through call_soon_threadsafe, in order
        # and before the instance's completion, so every step is delivered by now.
        end = self._answers.clock()
        stats = self._answers.stats
        if outcome.error is None:
            rows = sum(self._rows_of(payload) for payload in payloads)
            stats.record_execution(rows, outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
        for pending, stream in zip(batch, streams):
            if outcome.error is not None:
                stream.set_exception(outcome.error)
            else:
                stream.finish()  # the generator ended: so does every open stream
            if stream.finished:
                stats.record_success(end - pending.received_ns, started - pending.enqueued_ns,
                                     outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
                request = pending.request
                if isinstance(request, InferRequest) and request.compute_totals is not None:
                    request.compute_totals.add(  # an ensemble's step: its ensemble is charged too
                        outcome.compute_input_ns, outcome.compute_infer_ns, outcome.compute_output_ns)
            else:
                stats.record_failure(end - pending.received_ns, "BACKEND" if outcome.error is not None else "CANCELED")


def _sink_for(streams: list[Stream]) -> StepSink:
    """The sink of a streaming batch: each step's part goes to its request's stream."""

    def sink(parts: list[Any], finished: list[bool]) -> None:
        # A part may be None (nothing for that request this time: finished alone ends
        # it) or a NereidError (that request alone fails).
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

    return sink
