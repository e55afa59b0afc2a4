"""WorkerLink: the main process's end of one front-end worker's link.

Takes the worker's INFER messages into the main app's infer flow
(``Endpoints.start_infer``, the same call the native engine makes, so the request joins
the same queue and batches as every other) and its ASGI messages into the main app
(``AsgiExchange``, as the native engine runs any other request); answers go back as
ANSWER messages, their bodies written into the arena's answer half. Counts the requests
that came through the worker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nereid.frontends.arena import Arena, Ring
from nereid.frontends.messages import FrameReader, Kind, Outbox
from nereid.http.app import NereidApp
from nereid.http.h1.asgi_bridge import AsgiExchange
from nereid.http.infer import InferHeaders

__all__ = ["WorkerLink"]

_log = logging.getLogger("nereid")

_INFER, _ASGI, _WITHDRAW, _FREED = Kind.INFER.value, Kind.ASGI.value, Kind.WITHDRAW.value, Kind.FREED.value
_ANSWER, _START, _BODY, _CLOSE = Kind.ANSWER.value, Kind.START.value, Kind.BODY.value, Kind.CLOSE.value
_DONE = Kind.DONE.value


class _InferAnswer:
    """The Responder of one forwarded infer request."""

    __slots__ = ("link", "id")

    def __init__(self, link: WorkerLink, id: int) -> None:
        self.link = link
        self.id = id

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.link.answer(self.id, status, headers, [body], False)

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        self.link.answer(self.id, 200, headers, parts, True)


class _ForwardedExchange:
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
        if not more:
            self.link.finished(self.id)
        self.link.send((_BODY, self.id, bytes(body), more))

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.link.finished(self.id)
        self.link.send((_CLOSE, self.id))


class WorkerLink(asyncio.Protocol):
    """One worker's link, in the main process: ``app`` answers what the worker hands
    over, ``state`` is the app's lifespan state, ``arena`` the region they share.
    ``closed`` resolves when the worker's end goes away (it stopped or died); what it
    held is then withdrawn."""

    def __init__(self, app: NereidApp, arena: Arena, state: dict[str, Any], index: int) -> None:
        self.app = app
        self.arena = arena
        self.index = index
        #: requests that came through this worker (infer and any other)
        self.requests = 0
        self.ring = Ring(len(arena.answers))
        self._state = state
        self._reader = FrameReader()
        self._outbox: Outbox | None = None
        self._transport: Any = None
        self._tickets: dict[int, Any] = {}
        self._exchanges: dict[int, _ForwardedExchange] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._headers: dict[tuple[Any, ...], InferHeaders] = {}
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._outbox = Outbox(transport.write, self._loop.call_soon)

    def connection_lost(self, exc: Exception | None) -> None:
        """The worker is gone: its requests are withdrawn (their clients' connections went
        with it); answers still to come are dropped."""
        self._outbox = None
        tickets, self._tickets = self._tickets, {}
        for ticket in tickets.values():
            ticket.withdraw()
        exchanges, self._exchanges = self._exchanges, {}
        for exchange in exchanges.values():
            exchange.gone = True
            if exchange.exchange is not None:
                exchange.exchange.disconnect()
        self.ring.reset()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            kind = message[0]
            if kind == _INFER:
                self._infer(*message[1:])
            elif kind == _ASGI:
                self._forwarded(*message[1:])
            elif kind == _WITHDRAW:
                self._withdraw(message[1])
            elif kind == _FREED:
                for offset in message[1]:
                    self.ring.free(offset)
            else:
                _log.error("HTTP worker %d: unexpected message %r", self.index, message[:2])

    def send(self, message: tuple[Any, ...]) -> None:
        if self._outbox is not None:
            self._outbox.send(message)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- requests --------------------------------------------------------------------------

    def _infer(
        self, id: int, name: str, version_text: str | None, fields: tuple[Any, ...], received_ns: int,
        offset: int, length: int, inline: bytes | None,
    ) -> None:
        self.requests += 1
        # a copy out of the arena: the parsed request's arrays are views on it, and the
        # worker reuses the block once it has the answer
        body = inline if inline is not None else bytes(self.arena.requests[offset:offset + length])
        headers = self._headers.get(fields)
        if headers is None:
            headers = InferHeaders(())
            headers.header_length, headers.content_encoding, headers.accept_encoding = fields
            if len(self._headers) >= 256:
                self._headers.clear()
            self._headers[fields] = headers
        answer = _InferAnswer(self, id)
        ticket = self.app.endpoints.start_infer(name, version_text, headers, body, received_ns, answer)
        if ticket is not None and self._outbox is not None:
            self._tickets[id] = ticket

    def answer(self, id: int, status: int, headers: Any, parts: list[Any], repeat: bool) -> None:
        """Send an infer answer: its body into the arena (inline when it has no room)."""
        self._tickets.pop(id, None)
        if self._outbox is None:
            return  # the worker is gone
        views = [memoryview(part).cast("B") for part in parts]
        length = sum(view.nbytes for view in views)
        offset = self.ring.allocate(length)
        if offset is None:
            self.send((_ANSWER, id, status, headers, -1, length, b"".join(views), repeat))
            return
        answers = self.arena.answers
        at = offset
        for view in views:
            answers[at:at + view.nbytes] = view
            at += view.nbytes
        self.send((_ANSWER, id, status, headers, offset, length, None, repeat))

    def _forwarded(self, id: int, scope: dict[str, Any], body: bytes) -> None:
        self.requests += 1
        scope["state"] = dict(self._state)
        responder = _ForwardedExchange(self, id)
        exchange = responder.exchange = AsgiExchange(responder, self.app, scope)
        self._exchanges[id] = responder
        task = self._loop.create_task(exchange.run(body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def finished(self, id: int) -> None:
        self._exchanges.pop(id, None)

    def _withdraw(self, id: int) -> None:
        ticket = self._tickets.pop(id, None)
        if ticket is not None:
            ticket.withdraw()
        exchange = self._exchanges.pop(id, None)
        if exchange is not None:
            exchange.gone = True
            if exchange.exchange is not None:
                exchange.exchange.disconnect()
        self.send((_DONE, id))

    async def aclose(self) -> None:
        """Close the link and end the forwarded requests still running."""
        self.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
