"""How the main process answers each kind of request a front-end worker hands over.

``DecodedAnswer``: a request the worker decoded itself, queued with its model as an
``Answer`` (pending.py); ``InferAnswer``: the Responder of a raw infer request
(``Endpoints.start_infer``); ``ForwardedExchange``: the Responder (asgi_bridge's) of any
other request. Each answers through its ``WorkerLink`` (link.py), which writes it into
the arena and the messages back to the worker.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from nereid.errors import InternalError, NereidError
from nereid.frontends.messages import Kind
from nereid.http.h1.asgi_bridge import AsgiExchange
from nereid.models.serving import ServingModel

if TYPE_CHECKING:
    from nereid.frontends.link import WorkerLink

__all__ = ["DecodedAnswer", "ForwardedExchange", "InferAnswer"]

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
        if self.answered:
            return
        self.answered = True
        link = self.link
        link.tickets.pop(self.id, None)
        if isinstance(error, asyncio.CancelledError):
            link.send((_DONE, self.id))  # the server is stopping: nobody to answer
        elif isinstance(error, NereidError):
            link.send_error(self.id, error)
        else:
            link.send_error(self.id, InternalError(f"internal error in infer on model '{self.serving.name}': {error}"))

    def cancel(self) -> None:
        """Withdrawn (its client went away): the worker may reuse its block."""
        self.set_exception(asyncio.CancelledError())


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
