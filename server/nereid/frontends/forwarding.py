"""The worker's side of a front-end worker: ``MainLink``, its end of the link to the
main process, and ``WorkerApp``, what the worker's native HTTP engine serves.

An infer request goes from the engine's parser to ``MainLink.start_infer``: its body is
written into the arena's request half and a small INFER message says where; the ANSWER
comes back the same way and is written by the connection as the engine always does.
Health, metadata and config are answered here from the main process's picture of the
models (local_answers.py, directory_sync.py) while it is current. Every other request
(statistics, model control, repository index, shared-memory registration, generate, and
those when the picture is not current) is forwarded whole to the main process's app
(ASGI), whose response parts come back as START / BODY / ANSWER messages: so the server
behaves as one. Runs no model code.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from nereid.frontends.arena import Arena, Ring
from nereid.frontends.decoding import Announced, answer, decode, lay_out
from nereid.frontends.directory_sync import DirectoryCopy
from nereid.frontends.local_answers import LocalAnswers
from nereid.frontends.layout import read_arrays
from nereid.frontends.messages import FrameReader, Kind, Outbox
from nereid.http._asgi import Receive, Scope, Send
from nereid.http.app import infer_route
from nereid.http.errors import error_json
from nereid.http.infer import InferHeaders, Responder

__all__ = ["MainLink", "WorkerApp"]

_log = logging.getLogger("nereid")

_INFER, _ASGI, _WITHDRAW, _FREED = Kind.INFER.value, Kind.ASGI.value, Kind.WITHDRAW.value, Kind.FREED.value
_ANSWER, _START, _BODY, _CLOSE = Kind.ANSWER.value, Kind.START.value, Kind.BODY.value, Kind.CLOSE.value
_DONE, _STOP, _OPTIONS = Kind.DONE.value, Kind.STOP.value, Kind.OPTIONS.value
_DECODED, _MODEL, _FORGET, _RESULT, _RETRY, _RESULTS = (
    Kind.DECODED.value, Kind.MODEL.value, Kind.FORGET.value, Kind.RESULT.value, Kind.RETRY.value,
    Kind.RESULTS.value)
_DIRECTORY, _CREDIT = Kind.DIRECTORY.value, Kind.CREDIT.value
#: templates a worker names by number (past this many, new ones travel whole each time)
_MAX_TEMPLATES = 4096

_MAIN_GONE = error_json("the server's main process is gone (it is restarting or stopping)")
_JSON = (b"content-type", b"application/json")


class _InferCall:
    """An infer request sent to the main process: who to answer, the arena block that
    holds its body (-1: sent inline) and whether its client went away."""

    __slots__ = ("link", "id", "responder", "offset", "withdrawn")

    def __init__(self, link: MainLink, id: int, responder: Responder, offset: int) -> None:
        self.link = link
        self.id = id
        self.responder = responder
        self.offset = offset
        self.withdrawn = False

    def withdraw(self) -> None:
        """The Ticket of the native engine: the client went away before its answer."""
        if not self.withdrawn:
            self.withdrawn = True
            self.link.send((_WITHDRAW, self.id))


class _DecodedCall(_InferCall):
    """An infer request decoded here: what its answer is encoded with, and its raw body
    (sent again if the main process asks: its model changed meanwhile)."""

    __slots__ = ("name", "model", "request", "accept_encoding", "headers", "body", "received_ns")

    def __init__(
        self, link: MainLink, id: int, responder: Responder, offset: int, name: str, model: Announced,
        request: Any, headers: InferHeaders, body: bytes, received_ns: int,
    ) -> None:
        super().__init__(link, id, responder, offset)
        self.name = name
        self.model = model
        self.request = request
        self.accept_encoding = headers.accept_encoding
        self.headers = headers
        self.body = body
        self.received_ns = received_ns


class _AsgiCall:
    """A request forwarded to the main app: its response's messages, in order."""

    __slots__ = ("id", "events")

    def __init__(self, id: int) -> None:
        self.id = id
        self.events: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()


class MainLink(asyncio.Protocol):
    """The worker's end of the socket pair to the main process, with the arena they share.
    ``options`` resolves with the first message (the server's options, this worker's
    index and its HTTPS settings or None); ``stopped`` is set on STOP or when the main process goes away."""

    def __init__(self, arena: Arena, directory: DirectoryCopy) -> None:
        self.arena = arena
        #: the main process's picture of the models (DIRECTORY messages)
        self.directory = directory
        self.ring = Ring(len(arena.requests))
        loop = asyncio.get_running_loop()
        self.options: asyncio.Future[tuple[Any, int, Any]] = loop.create_future()
        self.stopped = asyncio.Event()
        self.main_gone = False
        self._loop = loop
        self._reader = FrameReader()
        self._outbox: Outbox | None = None
        self._calls: dict[int, _InferCall | _AsgiCall] = {}
        self._next_id = 0
        self._freed: list[int] = []
        #: bytes of streamed responses handed to their clients' connections this turn,
        #: by id: given back to the main process at the turn's end (CREDIT)
        self._credits: dict[int, int] = {}
        #: the model versions the main process announced, by name
        self.models: dict[str, Announced] = {}
        #: tensors' templates sent, by their number
        self._templates: dict[tuple[Any, ...], int] = {}
        #: JSON header limit (--http-max-input-size), set with the options
        self.max_json_size = 64 * 1024 * 1024

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._outbox = Outbox(transport.write, self._loop.call_soon)

    def connection_lost(self, exc: Exception | None) -> None:
        """The main process is gone: what it held cannot be answered by it any more."""
        self.main_gone = True
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if isinstance(call, _InferCall):
                if not call.withdrawn:
                    call.responder.reply(503, [_JSON], _MAIN_GONE)
            else:
                call.events.put_nowait((_CLOSE, call.id))
        self.stopped.set()

    def data_received(self, data: bytes) -> None:
        for message in self._reader.feed(data):
            self._dispatch(message)
        if self._freed:
            freed, self._freed = self._freed, []
            self.send((_FREED, freed))

    def send(self, message: tuple[Any, ...]) -> None:
        if self._outbox is not None and not self.main_gone:
            self._outbox.send(message)

    def credit(self, id: int, size: int) -> None:
        """``size`` bytes of call ``id``'s streamed response left this worker's queue for
        its client's connection: the main process may send as much more (send_windows.py).
        Given back with the others of this loop turn, in one CREDIT message."""
        outbox = self._outbox
        if outbox is None or self.main_gone or size <= 0:
            return
        credits = self._credits
        if not credits:
            outbox.before_flush(self._send_credits)
        credits[id] = credits.get(id, 0) + size

    def _send_credits(self) -> None:
        credits, self._credits = self._credits, {}
        if credits:
            self.send((_CREDIT, tuple(credits.items())))

    # -- what the engine hands over --------------------------------------------------------

    def start_infer(
        self, name: str, version_text: str | None, headers: InferHeaders, body: bytes, received_ns: int,
        responder: Responder,
    ) -> _InferCall | None:
        """``Endpoints.start_infer`` for the worker's engine: the body goes into the arena
        (inline when it has no room) and the request to the main process."""
        if self.main_gone:
            responder.reply(503, [_JSON], _MAIN_GONE)
            return None
        id = self._next_id = self._next_id + 1
        model = self.models.get(name) if version_text is None else None
        if model is not None:
            decoded = decode(model, name, headers, body, self.max_json_size)
            if decoded is not None:
                offset = self.ring.allocate(decoded.size)
                if offset is not None:
                    template = lay_out(decoded, self.arena.requests[offset:offset + decoded.size])
                    call = _DecodedCall(self, id, responder, offset, name, model, decoded.request, headers, body,
                                        received_ns)
                    self._calls[id] = call
                    self._send_decoded(call, model.token, template, offset)
                    return call
        # the main process's own infer flow takes what the worker does not decode
        return self._start_raw(id, name, version_text, headers, body, received_ns, responder)

    def _send_decoded(self, call: _DecodedCall, token: int, template: tuple[Any, ...], offset: int) -> None:
        number, whole = self._numbered(template)
        self.send((_DECODED, call.id, token, number, whole, offset, call.request.id, call.received_ns))

    def _numbered(self, template: tuple[Any, ...]) -> tuple[int, tuple[Any, ...] | None]:
        """The number ``template`` goes to the main process by, and the template itself
        when the main process does not know it by that number yet (a new number, or -1:
        sent whole each time, once ``_MAX_TEMPLATES`` are numbered or when it cannot be a
        key)."""
        templates = self._templates
        try:
            number = templates.get(template)
        except TypeError:  # a parameter value that cannot be a key
            return -1, template
        if number is not None:
            return number, None
        number = len(templates) if len(templates) < _MAX_TEMPLATES else -1
        if number >= 0:
            templates[template] = number
        return number, template

    def _start_raw(
        self, id: int, name: str, version_text: str | None, headers: InferHeaders, body: bytes, received_ns: int,
        responder: Responder,
    ) -> _InferCall:
        length = len(body)
        offset = self.ring.allocate(length)
        inline: bytes | None = None
        if offset is None:
            offset, inline = -1, body
        else:
            self.arena.requests[offset:offset + length] = body
        call = self._calls[id] = _InferCall(self, id, responder, offset)
        fields = (headers.header_length, headers.content_encoding, headers.accept_encoding)
        self.send((_INFER, id, name, version_text, fields, received_ns, offset, length, inline))
        return call

    def forward(self, scope: dict[str, Any], body: bytes) -> _AsgiCall:
        """Send any other request to the main app; its response comes as the call's events."""
        id = self._next_id = self._next_id + 1
        call = self._calls[id] = _AsgiCall(id)
        if self.main_gone:
            call.events.put_nowait((_CLOSE, id))
        else:
            self.send((_ASGI, id, scope, body))
        return call

    def withdraw(self, call: _AsgiCall) -> None:
        if self._calls.pop(call.id, None) is not None:
            self.send((_WITHDRAW, call.id))

    # -- what the main process sends -------------------------------------------------------

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == _RESULTS:
            self._results(*message[1:])
        elif kind == _RESULT:
            self._result(*message[1:])
        elif kind == _ANSWER:
            self._answer(*message[1:])
        elif kind in (_START, _BODY, _CLOSE):
            call = self._calls.get(message[1])
            if isinstance(call, _AsgiCall):
                if kind == _CLOSE or (kind == _BODY and not message[3]):
                    del self._calls[message[1]]
                call.events.put_nowait(message)
        elif kind == _DONE:
            self._release(self._calls.pop(message[1], None))
        elif kind == _STOP:
            self.stopped.set()
        elif kind == _MODEL:
            _, name, token, version, config, labels = message
            self.models[name] = Announced.of(token, version, config, labels)
        elif kind == _FORGET:
            known = self.models.get(message[1])
            if known is not None and known.token == message[2]:
                del self.models[message[1]]
        elif kind == _RETRY:
            self._retry(message[1])
        elif kind == _DIRECTORY:
            self.directory.update(*message[1:])
        elif kind == _OPTIONS and not self.options.done():
            self.options.set_result((message[1], message[2], message[3]))
        else:
            _log.error("front-end worker: unexpected message %r from the main process", message[:2])

    def _answer(
        self, id: int, status: int, headers: Any, offset: int, length: int, inline: bytes | None, repeat: bool
    ) -> None:
        call = self._calls.pop(id, None)
        if inline is None:
            body = bytes(self.arena.answers[offset:offset + length])
            self._freed.append(offset)
        else:
            body = inline
        if isinstance(call, _AsgiCall):
            call.events.put_nowait((_ANSWER, id, status, headers, body))
            return
        self._release(call)
        if call is None or call.withdrawn:
            return
        if repeat:
            call.responder.reply_repeat(headers, [body])
        else:
            call.responder.reply(status, headers, body)

    def _result(
        self, id: int, version: int, offset: int, layout: Any, inline: dict[str, Any] | None
    ) -> None:
        """A decoded request's outputs: encoded here, then the arena block is let go."""
        call = self._calls.pop(id, None)
        self._release(call)
        try:
            if isinstance(call, _InferCall) and not call.withdrawn:
                outputs = inline if inline is not None else read_arrays(self.arena.answers, offset, layout)
                self._answer_decoded(call, version, outputs)
        finally:
            if inline is None:
                self._freed.append(offset)

    def _results(self, version: int, offset: int, layout: Any, entries: tuple[tuple[int, int], ...]) -> None:
        """Several decoded requests' outputs in one block, their rows one after the other:
        each encoded here, then the block is let go."""
        calls = self._calls
        try:
            joined = read_arrays(self.arena.answers, offset, layout)
            start = 0
            for id, rows in entries:
                call = calls.pop(id, None)
                self._release(call)
                end = start + rows
                if isinstance(call, _InferCall) and not call.withdrawn:
                    self._answer_decoded(call, version, {name: array[start:end] for name, array in joined.items()})
                start = end
        finally:
            self._freed.append(offset)

    def _answer_decoded(self, call: _InferCall, version: int, outputs: dict[str, Any]) -> None:
        """Encode a decoded request's outputs for its client (at once: they are views on
        the arena); a request the main process took raw is answered by ANSWER instead."""
        if isinstance(call, _DecodedCall):
            answer(call.model, call.name, call.request, call.accept_encoding, version, outputs, call.responder)

    def _retry(self, id: int) -> None:
        """The main process no longer serves what this request was decoded for: it goes
        again as a raw body, under the same id."""
        call = self._calls.pop(id, None)
        if not isinstance(call, _DecodedCall):
            return
        self._release(call)
        if not call.withdrawn:  # else its WITHDRAW is on its way, and nobody waits
            self._start_raw(id, call.name, None, call.headers, call.body, call.received_ns, call.responder)

    def _release(self, call: _InferCall | _AsgiCall | None) -> None:
        if isinstance(call, _InferCall) and call.offset >= 0:
            self.ring.free(call.offset)
            call.offset = -1


class WorkerApp:
    """What the worker's NativeServer serves in place of NereidApp: infer requests through
    ``endpoints.start_infer`` (MainLink's), health, metadata and config through ``local``
    when it can, everything else (and infer requests when the inference group is
    restricted, so the main app's guard checks and counts them) as ASGI requests
    forwarded to the main app. Its lifespan does nothing: the models live
    in the main process."""

    #: restricted inference is checked by the main app (forwarded requests)
    infer_guard = None

    def __init__(self, link: MainLink, *, restricted_inference: bool, local: LocalAnswers | None = None) -> None:
        self._link = link
        self._restricted = restricted_inference
        #: what this worker answers itself (health, metadata, config)
        self.local = local
        self.endpoints = self
        self.start_infer: Callable[..., _InferCall | None] = link.start_infer

    def match_infer(self, path: str) -> tuple[str, str | None] | None:
        return None if self._restricted else infer_route(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        parts = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was read
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if self.local is not None and await self.local.answer(scope, send):
            return
        link = self._link
        call = link.forward({key: value for key, value in scope.items() if key != "state"}, b"".join(parts))
        disconnected = asyncio.ensure_future(receive())
        try:
            await _relay(call, disconnected, send, link)
        finally:
            disconnected.cancel()


async def _relay(call: _AsgiCall, disconnected: asyncio.Future[Any], send: Send, link: MainLink) -> None:
    """Hand the main app's response messages to the engine until the last one (or the
    client leaves: the main app is told)."""
    while True:
        event = asyncio.ensure_future(call.events.get())
        await asyncio.wait({event, disconnected}, return_when=asyncio.FIRST_COMPLETED)
        if not event.done():
            event.cancel()
            link.withdraw(call)
            return
        message = event.result()
        kind = message[0]
        if kind == _ANSWER:
            await send({"type": "http.response.start", "status": message[2], "headers": message[3]})
            await send({"type": "http.response.body", "body": message[4], "more_body": False})
            return
        if kind == _START:
            await send({"type": "http.response.start", "status": message[2], "headers": message[3]})
        elif kind == _BODY:
            await send({"type": "http.response.body", "body": message[2], "more_body": message[3]})
            if not message[3]:
                return
            link.credit(call.id, len(message[2]))  # the engine's writer took it (drained)
        else:  # CLOSE: returning unfinished makes the engine close the connection
            return
