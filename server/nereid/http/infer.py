"""POST /v2/models/{name}[/versions/{v}]/infer: the one infer flow of the HTTP surface.

Every engine goes through ``InferEndpoint.start``: the native engine calls it from its
parser with a ``Responder``; the ASGI engines (uvicorn, granian, hypercorn) call it from
``asgi`` with a responder that hands the answer back to their coroutine.

    start:   decode the body (compression) -> InferMemo.parse, else the full parser
             (infer_request) and InferMemo.learn_request -> ServingModel.submit
             (a heavy body, large compressed or large JSON, is decoded off the loop
             first: heavy_bodies)
    answer:  (called once, on the loop, from the batch that ran it)
             InferMemo.answer, else the full encoder (infer_response) and
             InferMemo.learn_answer -> Responder.reply_repeat / Responder.reply
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Iterable, Protocol

from nereid.models.admin import parse_version
from nereid.errors import InternalError, NereidError, UnsupportedError
from nereid.http import infer_response
from nereid.http._asgi import ClientGone, Receive, Scope, Send, error_parts, read_body, send_error
from nereid.http.compression import decode_body, parse_accept_encoding
from nereid.http.heavy_bodies import INFLATE_OFF_LOOP_BYTES, JSON_OFF_LOOP_BYTES, HeavyBodies
from nereid.http.infer_request import ShmResolver, parse_infer_body
from nereid.http.infer_memo import HttpTablesCache, HttpModelTables
from nereid.inference import InferRequest, InferResult
from nereid.models.manager import ModelManager, ServingModel, Ticket
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager
from nereid.tensors.wire_inputs import RegionLeaseOnDemand

__all__ = ["InferEndpoint", "InferHeaders", "Responder", "encode_answer", "parse_version", "read_request"]

_log = logging.getLogger("nereid")

class Responder(Protocol):
    """How an engine is handed an infer answer (once, on the loop)."""

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Any answer: its status, headers (without content-length: the engine adds it
        from ``body``) and body."""

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        """A 200 answer made by ``InferMemo.answer``: ``headers`` (content-length included)
        are the same object for every answer of its kind, so the engine may remember their
        encoding; the body is ``parts`` joined."""


class InferHeaders:
    """The request headers the infer path reads (names are lowercase, as ASGI gives them).
    Read-only once made: requests with the same header lines may share one."""

    __slots__ = ("header_length", "content_encoding", "accept_encoding", "content_length")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.header_length = self.content_encoding = self.accept_encoding = None
        self.content_length: bytes | None = None
        for key, value in raw:
            if key == b"inference-header-content-length":
                self.header_length = value.decode("latin-1")
            elif key == b"content-encoding":
                self.content_encoding = value.decode("latin-1")
            elif key == b"accept-encoding":
                self.accept_encoding = value.decode("latin-1")
            elif key == b"content-length":
                self.content_length = value


class InferEndpoint:
    """The infer handler of one server: its model manager, options, shared memory and
    the per-model tables (with their memo)."""

    def __init__(self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager) -> None:
        self.manager = manager
        self.options = options
        self.model_tables = HttpTablesCache()
        self.heavy = HeavyBodies()
        self._shm = shm
        self._decoding: set[asyncio.Task[None]] = set()

    def start(
        self,
        name: str,
        version_text: str | None,
        headers: InferHeaders,
        body: bytes,
        received_ns: int,
        responder: Responder,
    ) -> Ticket | None:
        """Parse and queue one infer request now; ``responder`` is called once, on the
        loop, with its answer (at once for a bad request). Returns the ticket to withdraw
        if the client goes away first (None when already answered). Never raises."""
        # a heavy body is decoded off the loop first (heavy_bodies); the size test is inline
        if len(body) > (INFLATE_OFF_LOOP_BYTES if headers.content_encoding else JSON_OFF_LOOP_BYTES):
            return self._start_heavy(name, version_text, headers, body, received_ns, responder)
        call = _InferCall(name, headers.accept_encoding, self._shm, responder)
        try:
            serving = call.serving = self._serving(name, version_text)
            tables = call.tables = self.model_tables.get(serving)
            if headers.content_encoding:
                body = decode_body(body, headers.content_encoding, max_size=self.options.max_request_size)
            call.request = read_request(
                body, headers.header_length, tables, name, serving.version, self.options.http_max_input_size,
                call.resolve_shm,
            )
            return serving.submit(call.request, received_ns, call.answer)
        except Exception as exc:  # a bug must cost one request, not the connection
            call.refuse(exc)
        return None

    def _serving(self, name: str, version_text: str | None) -> ServingModel:
        manager = self.manager
        serving = manager.latest.get(name) if version_text is None else None  # a dict read, the common case
        if serving is None:  # a version named, or none ready: get() raises Triton's error for why
            serving = manager.get(name, parse_version(version_text) if version_text is not None else None)
        if serving.config.decoupled:
            raise UnsupportedError("HTTP end point doesn't support models with decoupled transaction policy")
        return serving

    def _start_heavy(
        self, name: str, version_text: str | None, headers: InferHeaders, body: bytes, received_ns: int,
        responder: Responder,
    ) -> Ticket | None:
        """``start`` for a heavy body: decoded off the loop (heavy_bodies), then queued;
        the returned ticket withdraws it at whichever stage it is."""
        started = _HeavyStart()
        task = asyncio.get_running_loop().create_task(
            self._decode_heavy(name, version_text, headers, body, received_ns, responder, started)
        )
        started.task = task
        self._decoding.add(task)
        task.add_done_callback(self._decoding.discard)
        return started  # a Ticket (it has withdraw())

    async def _decode_heavy(
        self, name: str, version_text: str | None, headers: InferHeaders, body: bytes, received_ns: int,
        responder: Responder, started: _HeavyStart,
    ) -> None:
        call = _InferCall(name, headers.accept_encoding, self._shm, responder)
        try:
            serving = call.serving = self._serving(name, version_text)
            tables = call.tables = self.model_tables.get(serving)
            options = self.options
            decoded = await self.heavy.decode(
                body, headers.content_encoding, headers.header_length, tables, name, serving.version,
                options.max_request_size, options.http_max_input_size,
            )
            del body
            call.request = decoded if isinstance(decoded, InferRequest) else read_request(
                decoded, headers.header_length, tables, name, serving.version, options.http_max_input_size,
                call.resolve_shm,
            )
            started.ticket = serving.submit(call.request, received_ns, call.answer)
        except asyncio.CancelledError:  # withdrawn: the client went away
            call.release()
            raise
        except Exception as exc:  # a bug, or the decode process died: one request fails
            call.refuse(exc)

    async def aclose(self) -> None:
        """Cancel the decoding still running and stop the decode process."""
        for task in list(self._decoding):
            task.cancel()
        await asyncio.gather(*self._decoding, return_exceptions=True)
        self.heavy.close()

    async def asgi(self, scope: Scope, receive: Receive, send: Send, name: str, version_text: str | None) -> None:
        """The same flow for the ASGI engines: the answer comes back to this coroutine,
        which watches for its client going away meanwhile."""
        received_ns = time.monotonic_ns()
        headers = InferHeaders(scope["headers"])
        try:
            body = await read_body(receive, headers.content_length, self.options.max_request_size)
        except NereidError as exc:
            await send_error(send, exc)
            return
        except ClientGone:
            return
        responder = _AsgiResponder()
        ticket = self.start(name, version_text, headers, body, received_ns, responder)
        try:
            status, response_headers, payload = await _answer_watching_disconnect(responder.answer, ticket, receive)
        except ClientGone:
            return
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})


def read_request(
    body: bytes,
    header_length: str | None,
    tables: HttpModelTables,
    name: str,
    version: int | None,
    max_json_size: int,
    resolve_shm: ShmResolver | None = None,
) -> InferRequest:
    """How every infer body is read: a repeat from its plan, else the full parser, whose
    result the memo learns from."""
    memo = tables.memo
    request = memo.parse(body, header_length, name, version, max_json_size)
    if request is None:
        parsed = parse_infer_body(body, header_length, tables, name, version, max_json_size, resolve_shm)
        request = parsed.request
        memo.learn_request(body, parsed.json_length, max_json_size, request, parsed.inputs, parsed.prefix)
    return request


def encode_answer(
    tables: HttpModelTables, result: InferResult, request: InferRequest, *, labels: Any = None, write_shm: Any = None
) -> infer_response.EncodedAnswer:
    """The full encoder, whose reusable answers the memo learns from."""
    encoded = infer_response.encode_answer(result, request, tables, labels=labels, write_shm=write_shm)
    if encoded.learnt is not None:
        tables.memo.learn_answer(request, result.outputs, result.model_version, encoded.learnt)
    return encoded


def _internal_error(model: str, exc: BaseException) -> InternalError:
    """A bug met while answering an infer request: it fails that request, not the server."""
    return InternalError(f"internal error in infer on model '{model}': {exc}")


class _InferCall(RegionLeaseOnDemand):
    """One infer request on its way through the model (``serving``, ``tables`` and
    ``request`` are set as it is parsed); ``answer`` gets its outcome. A lease on the
    server's shared-memory regions is taken only when the request names one."""

    __slots__ = ("name", "accept_encoding", "responder", "serving", "tables", "request")

    def __init__(self, name: str, accept_encoding: str | None, regions: SharedMemoryManager, responder: Responder) -> None:
        self.name = name
        self.accept_encoding = accept_encoding
        self.regions = regions
        self.responder = responder
        self.serving: ServingModel
        self.tables: HttpModelTables
        self.request: InferRequest
        self.lease = None

    def refuse(self, exc: Exception) -> None:
        """The request failed before it was queued: its regions let go, its error answered
        (a bug, anything but a NereidError, is logged and answered as internal)."""
        self.release()
        if not isinstance(exc, NereidError):
            _log.exception("infer on model %r failed unexpectedly", self.name)
            exc = _internal_error(self.name, exc)
        self.responder.reply(*error_parts(exc))

    def answer(self, outputs: Any, error: BaseException | None) -> None:
        """The outcome of the submitted request: ``responder`` gets its answer or its
        error; nothing when it was withdrawn (the client is gone)."""
        responder = self.responder
        try:
            if error is None:
                if self.accept_encoding is None or parse_accept_encoding(self.accept_encoding) is None:
                    repeat = self.tables.memo.answer(self.request, outputs, self.serving.version)
                    if repeat is not None:
                        responder.reply_repeat(*repeat)
                        return
                responder.reply(*self._encode(outputs))
            elif isinstance(error, asyncio.CancelledError):
                return
            elif isinstance(error, NereidError):
                responder.reply(*error_parts(error))
            else:
                responder.reply(*error_parts(_internal_error(self.name, error)))
        except NereidError as exc:  # encoding the response failed
            responder.reply(*error_parts(exc))
        except Exception as exc:  # a bug: this request fails, loudly (never a silent fallback)
            _log.exception("answering infer on model %r failed unexpectedly", self.name)
            responder.reply(*error_parts(_internal_error(self.name, exc)))
        finally:
            if self.lease is not None:
                self.lease.release()

    def _encode(self, outputs: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        serving = self.serving
        request = self.request
        encoded = encode_answer(
            self.tables, InferResult(self.name, serving.version, outputs, request.id), request,
            labels=serving.labels, write_shm=self.write_shm,
        )
        payload, headers = infer_response.finish(encoded, self.accept_encoding)
        headers.append((b"content-length", str(len(payload)).encode()))
        return 200, headers, payload


class _HeavyStart:
    """The ticket of a request decoded off the loop: withdrawing it stops the decoding,
    or withdraws the request once queued."""

    __slots__ = ("task", "ticket")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.ticket: Ticket | None = None

    def withdraw(self) -> None:
        if self.ticket is not None:
            self.ticket.withdraw()
        elif self.task is not None:
            self.task.cancel()


class _AsgiResponder:
    """A Responder for a coroutine: the answer as (status, headers, body) in a future."""

    __slots__ = ("answer",)

    def __init__(self) -> None:
        self.answer: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] = (
            asyncio.get_running_loop().create_future()
        )

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if not self.answer.done():  # done: the client went away first
            if not any(key == b"content-length" for key, _ in headers):
                headers = [*headers, (b"content-length", str(len(body)).encode())]
            self.answer.set_result((status, headers, body))

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        if not self.answer.done():
            self.answer.set_result((200, list(headers), b"".join(parts)))


#: A request still waiting after this long starts watching for its client going away
#: (a task per request costs more than most requests take; a timer handle does not).
_DISCONNECT_WATCH_AFTER_S = 0.02


async def _answer_watching_disconnect(answer: asyncio.Future[Any], ticket: Ticket | None, receive: Receive) -> Any:
    """Await the answer; if the client disconnects first, withdraw the request (it leaves
    the queue unexecuted) and raise ClientGone."""
    if answer.done() or ticket is None:
        return await answer
    loop = asyncio.get_running_loop()
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    def arm() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())
        watcher.add_done_callback(lambda _: None if answer.done() else answer.cancel())

    timer = loop.call_later(_DISCONNECT_WATCH_AFTER_S, arm)
    try:
        return await answer
    except asyncio.CancelledError:
        if watcher is not None and watcher.done() and not watcher.cancelled():
            ticket.withdraw()
            raise ClientGone() from None
        raise
    finally:
        timer.cancel()
        if watcher is not None and not watcher.done():
            watcher.cancel()
