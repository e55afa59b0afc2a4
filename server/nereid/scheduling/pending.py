"""A pending request, and the one way its answer comes back.

``Pending`` is the record of one request from the moment a DynamicBatcher accepts it
until it is answered: the request, when it was received, how it is answered, and where
it waits in the queue (the fields of ``request_queue.QueuedRequest``, which it extends).
A ``Bundle`` is one record standing for several alike requests of one caller (a
front-end worker's turn), batched as one payload and counted one by one.
``Answers`` is how a batcher answers them, with their statistics: one request failed,
a batch returned or failed whole, preserve_ordering kept (``InOrder``).

Every answer comes back the same way: whoever ends the request (the batch that ran it,
its timeout, its caller withdrawing it, an unload) calls ``set_result(outputs)`` or
``set_exception(error)`` on its ``Answer``; the first call counts, ``done()`` tells.
The batcher never asks which kind of Answer it holds, except that a stream is left out
of preserve_ordering and gets its steps before the last through ``put``:

- ``asyncio.Future``: ``DynamicBatcher.infer`` awaits one (a Future is an Answer as is);
- ``CallbackAnswer``: ``DynamicBatcher.submit(..., on_answer)`` calls ``on_answer`` from
  the batch itself (no Future, no scheduled callback: the native HTTP engine's way);
- ``Stream``: ``DynamicBatcher.stream`` (decoupled models) reads steps as they come.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, cast

from nereid.errors import NereidError
from nereid.inference import InferRequest
from nereid.scheduling.queue import QueuedRequest
from nereid.stats import ModelStats

__all__ = [
    "Answer", "Answers", "Bundle", "BundleAnswer", "BundleSplit", "CallbackAnswer", "InOrder", "OnAnswer", "Pending",
    "Stream", "answer_now", "awaited", "split_bundle",
]

_log = logging.getLogger("nereid")


class Answer(Protocol):
    """How one request's answer comes back (``asyncio.Future`` is one)."""

    def done(self) -> bool:
        """Answered already (or its caller went away)."""

    def set_result(self, outputs: Any, /) -> None:
        """The request's outputs (a stream: its last step)."""

    def set_exception(self, error: BaseException, /) -> None:
        """The request failed."""

    def cancel(self) -> object:
        """Its caller went away: no answer is wanted any more."""


class _Withdrawing(Protocol):
    def withdraw(self, pending: Pending, /) -> None: ...


class _WithdrawingParts(_Withdrawing, Protocol):
    def withdraw_part(self, bundle: Pending, payload: Any, received_ns: int, /) -> bool: ...


@dataclass(slots=True, eq=False)
class Pending(QueuedRequest):
    """One accepted request waiting for its answer: what ``DynamicBatcher.submit`` returns.

    ``request`` is the payload the instance gets (an InferRequest for a model);
    ``received_ns`` when it arrived (statistics count from there); ``answer`` how it is
    answered. ``withdraw()`` when its caller no longer wants it: it leaves the queue
    unexecuted (counted as CANCELED), and a CallbackAnswer is called with CancelledError.
    """

    request: Any
    received_ns: int
    answer: Answer
    batcher: _Withdrawing

    def withdraw(self) -> None:
        self.batcher.withdraw(self)


class BundleAnswer(Answer, Protocol):
    """A Bundle's Answer: answers every request the bundle stands for at once, gives them
    back one by one (``parts``) when a failed batch is rerun a request at a time, and
    gives its first ones up to an Answer of their own (``split``) when a batch takes them
    without the rest."""

    #: the Bundle it answers (set once queued)
    bundle: Bundle | None

    def parts(self, payload: Any, /) -> list[tuple[Any, int, Answer]]:
        """Each request of ``payload`` (the bundle's) still wanted: its own payload (its
        rows), when it was received, its own Answer."""

    def split(self, payload: Any, count: int, /) -> BundleSplit:
        """Its first ``count`` requests (of ``payload``, the waiting bundle's) answered
        apart from now on: their payload, mean received time and BundleAnswer, and what
        this one keeps answering."""


@dataclass(frozen=True, slots=True)
class BundleSplit:
    """A waiting bundle cut in two (``BundleAnswer.split``): its first requests' payload,
    mean received time and Answer, then the rest's payload and mean received time."""

    head: Any
    head_received_ns: int
    head_answer: BundleAnswer
    rest: Any
    rest_received_ns: int


class Bundle(Pending):
    """Several alike requests of one caller (one model version, priority, timeout, kind of
    outputs and rows each) queued as one entry: ``request`` holds all their rows, as one
    request would; ``count`` is how many; ``received_ns`` is their mean. Batched, timed
    out and answered as one entry (its ``answer`` is a ``BundleAnswer``), counted in the
    statistics as ``count`` requests; a request withdrawn while it waits leaves it
    (``withdraw_part``); a batch with room for some of its requests only takes them
    (``split_bundle``), the rest waiting on in its place; a batch that fails is rerun with
    each of its requests alone (``BundleAnswer.parts``)."""

    __slots__ = ()
    answer: BundleAnswer

    def withdraw_part(self, payload: Any, received_ns: int) -> bool:
        """One of its requests (received at ``received_ns``) is no longer wanted: while it
        waits, it holds ``payload`` (the others' rows) from now on (True); else nothing
        changes (``DynamicBatcher.withdraw_part``; ``withdraw``: all of them)."""
        return cast(_WithdrawingParts, self.batcher).withdraw_part(self, payload, received_ns)


def split_bundle(bundle: Pending, count: int, cost_of: Callable[[Any], int]) -> Pending:
    """The queue's ``splitter`` where bundles are allowed: the first ``count`` requests of
    waiting ``bundle`` as a Bundle of their own, for the batch being taken (their rows and
    Answer cut off by its BundleAnswer's ``split``); ``bundle`` holds the rest, whose cost
    and count the queue sets."""
    assert isinstance(bundle, Bundle)
    cut = bundle.answer.split(bundle.request, count)
    head = Bundle(cost_of(cut.head), bundle.signature, bundle.level, bundle.enqueued_ns, bundle.deadline_ns,
                  cut.head, cut.head_received_ns, cut.head_answer, bundle.batcher)
    head.count = count
    head.timeout_action = bundle.timeout_action
    cut.head_answer.bundle = head
    bundle.request, bundle.received_ns = cut.rest, cut.rest_received_ns
    return head


async def awaited(future: asyncio.Future[Any], pending: Pending) -> Any:
    """The answer ``future`` brings to ``pending`` (the batchers' ``infer``). A caller
    cancelled meanwhile withdraws ``pending``: still queued, it leaves unexecuted."""
    try:
        return await future
    except asyncio.CancelledError:
        pending.withdraw()
        raise


#: ``on_answer(outputs, error)``: how ``DynamicBatcher.submit`` answers a callback caller.
OnAnswer = Callable[[Any, "BaseException | None"], None]


class CallbackAnswer:
    """An Answer that calls ``on_answer(outputs, error)`` at once (``error`` None on
    success, a CancelledError when withdrawn). A failing ``on_answer`` is logged: it must
    not stop the batch that answers the other requests."""

    __slots__ = ("_done", "_on_answer")

    def __init__(self, on_answer: OnAnswer) -> None:
        self._on_answer = on_answer
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, outputs: Any, error: BaseException | None = None) -> None:
        """Call ``on_answer(outputs, error)`` unless answered already. Also how
        ``set_exception`` and ``cancel`` answer (one method: the batch calls this one once
        per answered request, so it is not a wrapper)."""
        if self._done:
            return
        self._done = True
        try:
            self._on_answer(outputs, error)
        except Exception:  # noqa: BLE001 - one caller's failure must not fail its batch mates
            _log.exception("answering a request failed")

    def set_exception(self, error: BaseException) -> None:
        self.set_result(None, error)

    def cancel(self) -> None:
        self.set_result(None, asyncio.CancelledError())


class Stream:
    """The Answer of a decoupled model's request, read as an async iterator of its steps.

    ``put`` delivers a step before the last, ``set_result`` the last one, ``finish`` ends
    the stream without one (the model's generator ended), ``set_exception`` ends it with
    an error that the reader gets raised.
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

    def set_result(self, outputs: Any) -> None:
        if not self._done:
            self._queue.put_nowait(outputs)
            self.finish()

    def finish(self) -> None:
        if not self._done:
            self._done = self.finished = True
            self._queue.put_nowait(Stream._END)

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._done = True
            self._queue.put_nowait(error)

    def cancel(self) -> None:
        self._done = True

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        step = await self._queue.get()
        if step is Stream._END:
            raise StopAsyncIteration
        if isinstance(step, BaseException):
            raise step
        return step


def answer_now(answer: Answer, ok: bool, value: Any) -> None:
    """``set_result(value)`` or ``set_exception(value)``, unless answered already."""
    if answer.done():
        return
    if ok:
        answer.set_result(value)
    else:
        answer.set_exception(value)


class InOrder:
    """preserve_ordering: an answer is held back until every request that arrived before
    it has its own (Triton's response ordering). Streams are not held."""

    __slots__ = ("_order", "_held")

    def __init__(self) -> None:
        #: requests in arrival order; the outcomes of those that finished before an
        #: earlier one, by ``seq``.
        self._order: collections.deque[Pending] = collections.deque()
        self._held: dict[int, tuple[bool, Any]] = {}

    def track(self, pending: Pending) -> None:
        """A request arrived."""
        if not isinstance(pending.answer, Stream):
            self._order.append(pending)

    def answer(self, pending: Pending, ok: bool, value: Any) -> None:
        """Answer ``pending`` now if nothing older is unanswered, else once that is."""
        if isinstance(pending.answer, Stream):
            answer_now(pending.answer, ok, value)
            return
        order = self._order
        self._held[pending.seq] = (ok, value)
        while order:
            head = order[0]
            held = self._held.pop(head.seq, None)
            if held is not None:
                answer_now(head.answer, *held)
            elif not head.answer.done():
                return  # an earlier request is still running or queued
            order.popleft()


class Answers:
    """How one batcher answers its requests and counts them in ``stats``: one request
    failed (``fail``), a batch that returned (``batch``) or failed whole
    (``batch_failed``); ``order`` keeps preserve_ordering (None: answers go out at once).
    The time a batch's answers take counts as ``batch_answer``; its statistics are
    counted before any answer goes out (a client that reads them once answered finds
    its request there)."""

    def __init__(self, stats: ModelStats, rows_of: Callable[[Any], int], order: InOrder | None,
                 clock: Callable[[], int]) -> None:
        self.stats = stats
        self._rows_of = rows_of
        self._order = order
        #: the batcher's clock (``time.monotonic_ns`` in real time)
        self.clock = clock

    def fail(self, pending: Pending, error: NereidError, reason: str = "OTHER") -> None:
        """``pending`` fails with ``error`` (unless answered already), counted under
        ``reason`` (Triton's metric label)."""
        if pending.answer.done():
            return
        if self._order is None:
            pending.answer.set_exception(error)
        else:
            self._order.answer(pending, False, error)
        self.stats.record_failure(self.clock() - pending.received_ns, reason, pending.count)

    def batch_failed(self, batch: tuple[Pending, ...], error: NereidError,
                     scheduling: tuple[int, int | None, int] | None) -> None:
        """Every request of ``batch`` fails with ``error`` (``scheduling``: the batch's
        figures for ``ModelStats.record_scheduling``; None: a rerun, not counted)."""
        begun = self.clock()
        stats = self.stats
        if scheduling is not None:
            stats.record_scheduling(*scheduling)
        for pending in batch:
            if pending.answer.done():  # withdrawn while it ran: it failed all the same
                stats.record_failure(begun - pending.received_ns, "BACKEND", pending.count)
            else:
                self.fail(pending, error, "BACKEND")
        stats.record_answer(self.clock() - begun)

    def batch(self, batch: tuple[Pending, ...], started: int, outputs: Sequence[Any], compute: tuple[int, int, int],
              scheduling: tuple[int, int | None, int] | None) -> None:
        """``batch`` returned ``outputs`` (one per request; a NereidError for a request that
        alone failed) after it began on its instance at ``started``; ``compute``: its
        input, infer and output ns."""
        begun = self.clock()
        stats = self.stats
        total_ns = 0
        queue_times: list[int] = []
        for pending, output in zip(batch, outputs):
            if not isinstance(output, NereidError):  # withdrawn while it ran too: executed, so counted
                count = pending.count
                if count == 1:
                    total_ns += begun - pending.received_ns
                    queue_times.append(started - pending.enqueued_ns)
                else:  # a Bundle: its requests waited alike; received_ns is their mean
                    total_ns += (begun - pending.received_ns) * count
                    queue_times += [started - pending.enqueued_ns] * count
                request = pending.request
                if isinstance(request, InferRequest) and request.compute_totals is not None:
                    request.compute_totals.add(*compute)  # an ensemble's step: its ensemble is charged too
        rows_of = self._rows_of
        stats.record_batch(sum(rows_of(pending.request) for pending in batch), total_ns, queue_times, compute, scheduling)
        order = self._order
        for pending, output in zip(batch, outputs):
            answer = pending.answer
            if isinstance(output, NereidError):  # that request alone failed (a Triton model's error response)
                if answer.done():
                    stats.record_failure(begun - pending.received_ns, "BACKEND", pending.count)
                else:
                    self.fail(pending, output, "BACKEND")
            elif answer.done():  # withdrawn while it ran (its client left)
                pass
            elif order is None:
                answer.set_result(output)
            else:
                order.answer(pending, True, output)
        stats.record_answer(self.clock() - begun)
