"""How the main process answers each kind of request a front-end worker hands over.

``DecodedAnswer``: a request the worker decoded itself, queued with its model as an
``Answer`` (pending.py); ``BundleAnswer``: several such requests queued as one entry (a
``Bundle``, pending.py); ``InferAnswer``: the Responder of a raw infer request
(``Endpoints.start_infer``); ``ForwardedExchange``: the Responder (asgi_bridge's) of any
other request. Each answers through its ``WorkerLink`` (link.py), which writes it into
the arena and the messages back to the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from nereid.errors import InternalError, NereidError
from nereid.frontends.messages import Kind
from nereid.http.h1.asgi_bridge import AsgiExchange
from nereid.inference import InferRequest
from nereid.models.serving import ServingModel
from nereid.scheduling.pending import Answer, Bundle, BundleSplit

if TYPE_CHECKING:
    from nereid.frontends.link import WorkerLink

__all__ = ["BundleAnswer", "DecodedAnswer", "ForwardedExchange", "InferAnswer"]

_ANSWER, _START, _BODY, _CLOSE, _DONE = (
    Kind.ANSWER.value, Kind.START.value, Kind.BODY.value, Kind.CLOSE.value, Kind.DONE.value)


class InferAnswer:
    """The Responder of one forwarded infer request."""

    __slots__ = ("link", "id")

    def __init__(self, link: WorkerLink, id: int) -> None:
        self.link = link
        self.id = id

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.link.answer(self.id, status, headers, [body], False)

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        self.link.answer(self.id, 200, headers, parts, True)


class DecodedAnswer:
    """How a request the worker decoded is answered (an ``Answer``, pending.py): its
    outputs into the arena with the others of this loop turn (RESULTS), its error as a
    whole response (ANSWER), or, withdrawn, DONE. The first answer counts."""

    __slots__ = ("link", "id", "serving", "answered")

    def __init__(self, link: WorkerLink, id: int, serving: ServingModel) -> None:
        self.link = link
        self.id = id
        self.serving = serving
        self.answered = False

    def done(self) -> bool:
        return self.answered

    def set_result(self, outputs: Any) -> None:
        if not self.answered:
            self.answered = True
            self.link.answered(self.id, self.serving.version, outputs)

    def set_exception(self, error: BaseException) -> None:
        if not self.answered:
            self.answered = True
            _fail(self.link, self.id, self.serving, error)

    def cancel(self) -> None:
        """Withdrawn (its client went away): the worker may reuse its block."""
        self.set_exception(asyncio.CancelledError())


class BundleAnswer:
    """How a bundle is answered: requests of one template the worker decoded and sent in
    one frame (``ids``, received at ``received``, ``rows`` rows each), queued as one entry
    (``ServingModel.submit_bundle``; ``bundle`` once it is). Its outputs, the requests'
    rows one after the other, go into the turn's RESULTS as one group; an error goes to
    each request; a request withdrawn (``withdraw_member``) leaves the bundle while it
    waits, and once it runs is in ``gone``: it gets nothing more (the worker had DONE for
    it). The first answer counts."""

    __slots__ = ("link", "ids", "received", "rows", "serving", "answered", "gone", "bundle")

    def __init__(self, link: WorkerLink, ids: list[int], received: list[int], rows: int, serving: ServingModel) -> None:
        self.link = link
        self.ids = ids
        self.received = received
        self.rows = rows
        self.serving = serving
        self.answered = False
        #: the requests withdrawn while the bundle ran (None: none)
        self.gone: set[int] | None = None
        self.bundle: Bundle | None = None

    def done(self) -> bool:
        return self.answered

    def set_result(self, outputs: Any) -> None:
        if not self.answered:
            self.answered = True
            self.link.answered_rows(self.ids, self.rows, self.serving.version, outputs)

    def set_exception(self, error: BaseException) -> None:
        if self.answered:
            return
        self.answered = True
        gone = self.gone or ()
        for id in self.ids:
            if id not in gone:
                _fail(self.link, id, self.serving, error)

    def cancel(self) -> None:
        """Withdrawn whole (the server is stopping, or the last request left)."""
        self.set_exception(asyncio.CancelledError())

    def withdraw(self) -> None:
        """Every request of the bundle is withdrawn (the worker went away)."""
        if self.bundle is not None:
            self.bundle.withdraw()

    def withdraw_member(self, id: int) -> None:
        """Request ``id`` is no longer wanted (its client went away). While the bundle
        waits, it leaves it (its rows taken out, counted as CANCELED: ``Bundle.withdraw_part``,
        which takes the bundle out with its last request); once the bundle runs, its answer
        is dropped."""
        if self.answered:
            return
        bundle = self.bundle
        index = self.ids.index(id)
        if bundle is not None and not bundle.removed:
            rows = self.rows
            request = bundle.request
            kept = {name: np.delete(array, np.s_[index * rows:(index + 1) * rows], axis=0)
                    for name, array in request.inputs.items()}
            if bundle.withdraw_part(dataclasses.replace(request, inputs=kept, rows=request.rows - rows),
                                    self.received[index]):
                del self.ids[index], self.received[index]
                return
        gone = self.gone
        if gone is None:
            gone = self.gone = set()
        gone.add(id)
        if len(gone) == len(self.ids):
            self.answered = True

    def split(self, payload: InferRequest, count: int) -> BundleSplit:
        """Its first ``count`` requests answered apart from now on (a batch takes them
        while the rest wait on: ``split_bundle``), their tickets with them: their rows of
        ``payload`` (views), mean received time and BundleAnswer, and the rest's."""
        head = BundleAnswer(self.link, self.ids[:count], self.received[:count], self.rows, self.serving)
        del self.ids[:count], self.received[:count]
        tickets = self.link.tickets
        for id in head.ids:
            if tickets.get(id) is self:
                tickets[id] = head
        cut = count * self.rows
        return BundleSplit(_rows_between(payload, 0, cut), sum(head.received) // count, head,
                           _rows_between(payload, cut, payload.rows), sum(self.received) // len(self.received))

    def parts(self, payload: InferRequest) -> list[tuple[Any, int, Answer]]:
        """Each request still wanted alone (a failed batch's reruns): its rows of
        ``payload``, when it was received, a DecodedAnswer. The bundle answers no more."""
        self.answered = True
        rows = self.rows
        gone = self.gone or ()
        parts: list[tuple[Any, int, Answer]] = []
        for index, id in enumerate(self.ids):
            if id in gone:
                continue
            parts.append((_rows_between(payload, index * rows, (index + 1) * rows), self.received[index],
                          DecodedAnswer(self.link, id, self.serving)))
        return parts


def _rows_between(payload: InferRequest, start: int, stop: int) -> InferRequest:
    """``payload`` with only its rows ``start`` to ``stop`` (views on its inputs)."""
    inputs = {name: array[start:stop] for name, array in payload.inputs.items()}
    return dataclasses.replace(payload, inputs=inputs, rows=stop - start)


def _fail(link: WorkerLink, id: int, serving: ServingModel, error: BaseException) -> None:
    """Request ``id`` failed with ``error`` (a CancelledError: it was withdrawn, or the
    server is stopping, and nobody waits: DONE lets the worker reuse its block)."""
    link.tickets.pop(id, None)
    if isinstance(error, asyncio.CancelledError):
        link.send((_DONE, id))
    elif isinstance(error, NereidError):
        link.send_error(id, error)
    else:
        link.send_error(id, InternalError(f"internal error in infer on model '{serving.name}': {error}"))


class ForwardedExchange:
    """The Responder (asgi_bridge's) of one forwarded request: its parts go back as messages."""

    __slots__ = ("link", "id", "gone", "exchange")

    def __init__(self, link: WorkerLink, id: int) -> None:
        self.link = link
        self.id = id
        self.gone = False
        self.exchange: AsgiExchange | None = None

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.link.finished(self.id)
        self.link.send((_ANSWER, self.id, status, headers, -1, len(body), bytes(body), False))

    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.link.send((_START, self.id, status, headers))

    def send_body(self, body: bytes, more: bool) -> None:
        data = bytes(body)
        if more:
            self.link.windows.sent(self.id, len(data))
        else:
            self.link.finished(self.id)
        self.link.send((_BODY, self.id, data, more))

    async def drain(self) -> None:
        """Wait while the worker holds this response's share of parts its client has
        not read (send_windows.py)."""
        await self.link.windows.wait(self.id)

    def close(self) -> None:
        self.link.finished(self.id)
        self.link.send((_CLOSE, self.id))
