"""A pending request, and the one way its answer comes back.

``Pending`` is the record of one request from the moment a DynamicBatcher accepts it
until it is answered: the request, when it was received, how it is answered, and where
it waits in the queue (the fields of ``request_queue.QueuedRequest``, which it extends).

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
from typing import Any, Callable, Protocol

from nereid.scheduling.queue import QueuedRequest

__all__ = ["Answer", "CallbackAnswer", "InOrder", "OnAnswer", "Pending", "Stream", "answer_now"]

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
