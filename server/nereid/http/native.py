"""NativeServer: nereid's own HTTP/1.1 engine, httptools' parser on the asyncio loop.

Owns connections and HTTP/1.1 framing (keep-alive, pipelining in order, Expect:
100-continue, Content-Length or chunked responses, the request size limit, graceful
shutdown). Infer requests go from the parser straight to ``Endpoints.start_infer`` and
back as one socket write, with no ASGI messages, task or coroutine per request; every
other request, and the lifespan, goes to the ASGI app through a small ASGI 3 bridge.

Why it exists: on the identity benchmark the ASGI layer (scope, messages, a task per
request, the engine's protocol object) was most of nereid's own CPU per request; this
engine answers the same requests for well under half of it (README, Performance).
Knows nothing about models: what an infer request means is ``Endpoints``' business.
"""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import socket
import time
import urllib.parse
from typing import Any, Callable, MutableMapping

import httptools

from nereid.errors import InvalidInputError
from nereid.http._asgi import body_too_large, check_declared_length, error_parts
from nereid.http.app import NereidApp

__all__ = ["NativeServer"]

_log = logging.getLogger("nereid")

#: Complete requests a connection may hold unanswered (pipelining) before it stops reading.
_MAX_PIPELINED = 16
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: URLs whose infer route the server remembers (cleared when full).
_MAX_ROUTES = 1024
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}
_BAD_REQUEST = b'{"error":"Invalid HTTP request received."}'


def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))


_STATUS_LINES = {status: _status_line(status) for status in (200, 400, 404, 405, 500, 501, 503)}


class _Request:
    """One complete request waiting for (or getting) its answer."""

    __slots__ = ("method", "url", "headers", "body", "keep_alive", "http_version", "refusal")

    def __init__(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        keep_alive: bool, http_version: str, refusal: InvalidInputError | None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http_version = http_version
        #: answered with this error instead of being served (size limit, unparsable request).
        self.refusal = refusal


class _Connection(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, server: NativeServer) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self._transport: Any = None
        self._queue: collections.deque[_Request] = collections.deque()
        self._active: _Request | None = None
        self._ticket: Any = None  # the active infer request's ticket (to withdraw on disconnect)
        self._exchange: _AsgiExchange | None = None
        self._gone = False
        self._in_next = False
        self._reading = True
        self._parsing = True  # False after a parse error, an upgrade or a refused body
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        # the request being parsed
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._size = 0
        self._refusal: InvalidInputError | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._gone = True
        self._server.connections.discard(self)
        if self._ticket is not None:
            self._ticket.withdraw()
            self._ticket = None
        if self._exchange is not None:
            self._exchange.disconnect()
        self._queue.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._parsing:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # nereid speaks HTTP/1.1 only: answer the request as is, then close (what
            # follows on the socket would be the other protocol).
            self._parsing = False
            if self._queue:
                self._queue[-1].keep_alive = False
            self._next()
        except httptools.HttpParserError:
            self._parsing = False
            self._queue.append(_Request(b"", b"", [], b"", False, "1.1", None))
            self._next()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._chunks = []
        self._size = 0
        self._refusal = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        limit = self._server.max_request_size
        expect_continue = False
        for name, value in self._headers:
            if name == b"content-length":
                try:
                    check_declared_length(value, limit)
                except InvalidInputError as exc:
                    self._refuse(exc)
                    return
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        if expect_continue and self._active is None and not self._queue and not self._gone:
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refusal is not None:
            return
        self._size += len(body)
        if self._size > self._server.max_request_size:
            self._refuse(body_too_large(self._server.max_request_size))
            return
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        if self._refusal is not None:
            return  # already queued by _refuse
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        parser = self._parser
        self._queue.append(
            _Request(parser.get_method(), self._url, self._headers, body, parser.should_keep_alive(),
                     parser.get_http_version(), None)
        )
        self._chunks = []
        if self._active is None:
            self._next()
        elif len(self._queue) >= _MAX_PIPELINED and self._reading:
            self._reading = False
            self._transport.pause_reading()

    def _refuse(self, error: InvalidInputError) -> None:
        """Answer a request whose body is too large without reading the rest of it, then
        close the connection (the unread body would otherwise be taken as requests)."""
        self._refusal = error
        self._chunks = []
        self._parsing = False
        self._queue.append(_Request(self._parser.get_method(), self._url, self._headers, b"", False, "1.1", error))
        if self._active is None:
            self._next()

    # -- answering -----------------------------------------------------------------------

    def _next(self) -> None:
        """Answer waiting requests in order while each is answered at once (errors,
        refusals); stop at the first that will be answered later. A loop, not recursion:
        one read can hold hundreds of pipelined requests."""
        if self._in_next:
            return  # an outer call is looping: it picks up the next request
        self._in_next = True
        try:
            while self._active is None and self._queue and not self._gone:
                self._start(self._queue.popleft())
        finally:
            self._in_next = False
        if self._active is None and not self._queue and not self._gone:
            if not self._parsing:
                self._transport.close()
            elif not self._reading:
                self._reading = True
                self._transport.resume_reading()

    def _start(self, request: _Request) -> None:
        self._active = request
        if request.refusal is not None:
            self.reply(*error_parts(request.refusal))
            return
        if not request.method:  # the parser gave up on it
            self.reply(400, [(b"content-type", b"application/json")], _BAD_REQUEST)
            return
        if request.method == b"POST":
            server = self._server
            route = server.infer_route(request.url)
            if route is not None:
                ticket = server.app.endpoints.start_infer(
                    route[0], route[1], request.headers, request.body, time.monotonic_ns(), self.reply
                )
                if ticket is not None:  # None: answered already (and maybe the next one started)
                    self._ticket = ticket
                return
        self._exchange = _AsgiExchange(self, request)
        self._server.track(self._loop.create_task(self._exchange.run()))

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write a complete response to the active request and go on with the next one.
        ``headers`` carry content-length when ``body`` is not empty."""
        request = self._active
        assert request is not None
        self._ticket = None
        if self._gone:
            return
        head = [_STATUS_LINES.get(status) or _status_line(status)]
        has_length = False
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
            if name == b"content-length":
                has_length = True
        if not has_length:
            head.append(b"content-length: %d\r\n" % len(body))
        if not request.keep_alive or self._server.closing:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if request.method != b"HEAD":
            head.append(body)
        self._transport.write(b"".join(head))
        self._done()

    def _done(self) -> None:
        request = self._active
        assert request is not None
        self._active = None
        self._exchange = None
        if not request.keep_alive or self._server.closing:
            self._transport.close()
            return
        self._next()

    async def drain(self) -> None:
        """Wait while the client does not read (flow control for streamed responses)."""
        if self._write_paused and not self._gone:
            self._drain = self._loop.create_future()
            await self._drain

    @property
    def idle(self) -> bool:
        return self._active is None and not self._queue

    def close(self) -> None:
        if not self._gone:
            self._transport.close()


class _AsgiExchange:
    """One request answered by the ASGI app: the scope, ``receive`` and ``send``."""

    __slots__ = ("_connection", "_request", "_started", "_complete", "_chunked", "_head", "_disconnected",
                 "_body_given", "_status")

    def __init__(self, connection: _Connection, request: _Request) -> None:
        self._connection = connection
        self._request = request
        self._started = False
        self._complete = False
        self._chunked = False
        self._head: list[bytes] = []
        self._status = 0
        self._body_given = False
        self._disconnected: asyncio.Future[None] = connection._loop.create_future()

    def disconnect(self) -> None:
        if not self._disconnected.done():
            self._disconnected.set_result(None)

    def _scope(self) -> dict[str, Any]:
        request = self._request
        connection = self._connection
        url = httptools.parse_url(request.url)
        raw_path: bytes = url.path
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = urllib.parse.unquote(path)
        transport = connection._transport
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version,
            "server": _address(transport.get_extra_info("sockname")),
            "client": _address(transport.get_extra_info("peername")),
            "scheme": "http",
            "method": request.method.decode("latin-1"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "headers": request.headers,
            "state": dict(connection._server.state),
        }

    async def run(self) -> None:
        try:
            await self._connection._server.app(self._scope(), self._receive, self._send)
        except Exception:
            _log.exception("HTTP %s %s failed", self._request.method.decode("latin-1"), self._request.url.decode("latin-1"))
            if not self._started:
                self._connection.reply(500, [(b"content-type", b"application/json")], b'{"error":"Internal Server Error"}')
            elif not self._complete:
                self._connection.close()
            return
        if not self._started:
            self._connection.reply(500, [(b"content-type", b"application/json")], b'{"error":"Internal Server Error"}')
        elif not self._complete:
            _log.error("HTTP %s: the app returned before finishing its response", self._request.url.decode("latin-1"))
            self._connection.close()

    async def _receive(self) -> dict[str, Any]:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": self._request.body, "more_body": False}
        await self._disconnected
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        connection = self._connection
        kind = message["type"]
        if kind == "http.response.start":
            if self._started:
                raise RuntimeError("ASGI: http.response.start sent twice")
            self._started = True
            self._status = message["status"]
            self._head = [(name.lower(), value) for name, value in message.get("headers", ())]  # type: ignore[misc]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"ASGI: unexpected message {kind!r}")
        if not self._started or self._complete:
            raise RuntimeError("ASGI: http.response.body before http.response.start or after the last body")
        if connection._gone:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        headers: list[tuple[bytes, bytes]] = self._head  # type: ignore[assignment]
        if headers is not None and not more and not self._chunked:
            # the whole response in one message: one write
            self._head = None  # type: ignore[assignment]
            self._complete = True
            self.disconnect()
            connection.reply(self._status, headers, body)
            return
        out = []
        if headers is not None:
            self._head = None  # type: ignore[assignment]
            request = self._request
            lines = [_STATUS_LINES.get(self._status) or _status_line(self._status)]
            has_length = False
            for name, value in headers:
                lines.append(b"%s: %s\r\n" % (name, value))
                has_length = has_length or name == b"content-length"
            if not has_length:
                self._chunked = True
                lines.append(b"transfer-encoding: chunked\r\n")
            if not request.keep_alive or connection._server.closing:
                lines.append(b"connection: close\r\n")
            lines.append(b"\r\n")
            out.append(b"".join(lines))
        if self._request.method != b"HEAD":
            if self._chunked:
                if body:
                    out.append(b"%x\r\n%s\r\n" % (len(body), body))
                if not more:
                    out.append(b"0\r\n\r\n")
            else:
                out.append(body)
        if out:
            connection._transport.write(b"".join(out))
        if not more:
            self._complete = True
            self.disconnect()
            connection._done()
        else:
            await connection.drain()


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return (str(value[0]), int(value[1]))
    return None


class _Lifespan:
    """Runs the ASGI app's lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: Callable[..., Any], state: dict[str, Any]) -> None:
        self._app = app
        self._state = state
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = loop.create_future()
        self._stopped: asyncio.Future[None] = loop.create_future()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run(), name="nereid-lifespan")
        await self._inbox.put({"type": "lifespan.startup"})
        await asyncio.wait({self._started, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not self._started.done():
            raise RuntimeError("the ASGI app's lifespan ended before startup completed")
        self._started.result()

    async def shutdown(self) -> None:
        assert self._task is not None
        if self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait({self._stopped, self._task}, return_when=asyncio.FIRST_COMPLETED)

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self._state}
        try:
            await self._app(scope, self._inbox.get, self._send)
        except BaseException as exc:
            for future in (self._started, self._stopped):
                if not future.done():
                    future.set_exception(RuntimeError(f"the ASGI app's lifespan failed: {exc!r}"))
            if not isinstance(exc, Exception):
                raise
            _log.exception("lifespan failed")

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set_result(None)
        elif kind == "lifespan.startup.failed":
            self._started.set_exception(RuntimeError(message.get("message") or "lifespan startup failed"))
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if not self._stopped.done():
                self._stopped.set_result(None)


class NativeServer:
    """Serves a NereidApp on one listening socket until ``shutdown`` is set, then stops
    taking connections, lets requests in flight finish (``graceful_timeout`` seconds at
    most), closes every connection and runs the app's lifespan shutdown."""

    def __init__(self, app: NereidApp, *, max_request_size: int, graceful_timeout: float) -> None:
        self.app = app
        self.max_request_size = max_request_size
        self.graceful_timeout = graceful_timeout
        self.connections: set[_Connection] = set()
        self.closing = False
        self.state: dict[str, Any] = {}
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by serve()
        self._tasks: set[asyncio.Task[None]] = set()
        self._routes: dict[bytes, tuple[str, str | None] | None] = {}

    def infer_route(self, url: bytes) -> tuple[str, str | None] | None:
        """(model name, version text) when a POST to ``url`` is an infer request the fast
        path takes; None sends it to the ASGI app (which also routes escaped paths and
        query strings). Remembers the answer per URL: clients repeat theirs."""
        routes = self._routes
        try:
            return routes[url]
        except KeyError:
            pass
        route = None
        if url.endswith(b"/infer") and b"%" not in url:
            route = self.app.match_infer(url.decode("latin-1"))
        if len(routes) >= _MAX_ROUTES:
            routes.clear()  # a client inventing URLs cannot grow this without bound
        routes[url] = route
        return route

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep an ASGI request's task until it ends (cancelled at shutdown if it outlives
        its connection)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def serve(
        self, shutdown: asyncio.Event, *, host: str = "127.0.0.1", port: int = 8000, fd: int | None = None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        lifespan = _Lifespan(self.app, self.state)
        await lifespan.startup()
        try:
            if fd is not None:
                sock = socket.socket(fileno=fd)
                listener = await self.loop.create_server(lambda: _Connection(self), sock=sock, backlog=2048)
            else:
                listener = await self.loop.create_server(
                    lambda: _Connection(self), host, port, backlog=2048, reuse_address=True
                )
            try:
                await shutdown.wait()
            finally:
                self.closing = True
                listener.close()
                await self._drain_connections()
                await listener.wait_closed()
        finally:
            await lifespan.shutdown()

    async def _drain_connections(self) -> None:
        """Close idle connections now, busy ones when their answer is out (or at the
        graceful timeout)."""
        deadline = self.loop.time() + self.graceful_timeout
        while True:
            for connection in list(self.connections):
                if connection.idle:
                    connection.close()
            if not self.connections or self.loop.time() >= deadline:
                break
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.close()
        # Handlers still running (a stream whose client never left) end with their connection.
        await asyncio.sleep(0)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
