"""NativeServer: nereid's own HTTP/1.1 engine, httptools' parser on the asyncio loop.

Owns connections and HTTP/1.1 framing (keep-alive, pipelining in order, Expect:
100-continue, Content-Length or chunked responses, the request size limit, graceful
shutdown). Infer requests go from the parser straight to ``Endpoints.start_infer`` and
back as one socket write, with no ASGI messages, task, coroutine or Future per request; every
other request, and the lifespan, goes to the ASGI app through ``asgi_bridge``. A connection
that repeats its last infer request's head byte for byte skips the parser for it (_Lane).

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
import os
import socket
import time
from typing import Any

import httptools

from nereid.errors import InvalidInputError
from nereid.http._asgi import body_too_large, check_declared_length, error_parts
from nereid.http.app import NereidApp
from nereid.http.asgi_bridge import AsgiExchange, Lifespan, http_scope
from nereid.http.endpoints import InferHeaders

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


#: Bodies up to this size may teach a connection its repeated request head (_Lane).
_LANE_MAX_BODY = 64 << 10


class _Lane:
    """A connection's last plain infer request head, byte for byte, and what the parser
    made of it. Clients repeat the same head (perf_analyzer and tritonclient send the
    same URL, headers and Content-Length with every request of a given shape), and the
    same bytes read from a message boundary parse the same way: a request that starts
    with ``head`` is that head followed by ``length`` body bytes, without asking the
    parser (whose Python callbacks cost more than the rest of the request's reading).
    Learnt only from a read that held exactly one complete POST to an infer route with a
    Content-Length body (at most _LANE_MAX_BODY), no Expect and no Transfer-Encoding."""

    __slots__ = ("head", "length", "request", "route")

    def __init__(self, head: bytes, length: int, request: _Request, route: tuple[str, str | None]) -> None:
        self.head = head
        self.length = length
        self.request = request  # method, url, headers, keep_alive, http_version to reuse
        self.route = route  # the infer route of request.url


class _Request:
    """One complete request waiting for (or getting) its answer."""

    __slots__ = ("method", "url", "headers", "body", "keep_alive", "http_version", "refusal", "infer_headers")

    def __init__(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        keep_alive: bool, http_version: str, refusal: InvalidInputError | None,
        infer_headers: InferHeaders | None = None,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http_version = http_version
        #: answered with this error instead of being served (size limit, unparsable request).
        self.refusal = refusal
        #: what the infer path reads of ``headers`` (made when first needed, by
        #: ``parsed_infer_headers``; a lane's repeats share their head's).
        self.infer_headers = infer_headers

    def parsed_infer_headers(self) -> InferHeaders:
        """``infer_headers``, made from ``headers`` the first time."""
        parsed = self.infer_headers
        if parsed is None:
            parsed = self.infer_headers = InferHeaders(self.headers)
        return parsed


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
        self._exchange: AsgiExchange | None = None
        self._head = b""  # a streamed response's head, sent with its first part
        self._chunked = False
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
        # the repeated request head (see _Lane) and what learning it needs
        self._lane: _Lane | None = None
        self._in_message = False  # the parser is inside a request (not at a boundary)
        self._begun = 0  # requests begun during the current read
        self._completed: _Request | None = None  # the last request the parser completed

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
        if self._lane is not None and not self._in_message:
            data = self._take_repeated(data, self._lane)
            if not data or not self._parsing:
                return
        self._begun = 0
        self._completed = None
        try:
            self._parser.feed_data(data)
            if self._begun == 1 and self._completed is not None and not self._in_message:
                self._learn(data, self._completed)
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
        self._in_message = True
        self._begun += 1
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
        self._in_message = False
        if self._refusal is not None:
            return  # already queued by _refuse
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        parser = self._parser
        request = _Request(parser.get_method(), self._url, self._headers, body, parser.should_keep_alive(),
                           parser.get_http_version(), None)
        self._completed = request
        self._chunks = []
        self._take(request)

    def _take(self, request: _Request) -> None:
        """Queue a complete request; start it when nothing is being answered."""
        self._queue.append(request)
        if self._active is None:
            self._next()
        elif len(self._queue) >= _MAX_PIPELINED and self._reading:
            self._reading = False
            self._transport.pause_reading()

    # -- the repeated request head -------------------------------------------------------

    def _take_repeated(self, data: bytes, lane: _Lane) -> bytes:
        """Take the complete requests at the start of ``data`` that repeat ``lane``'s head;
        the rest (a different request, or an incomplete one) is for the parser."""
        head = lane.head
        start, end = len(head), len(head) + lane.length
        known = lane.request
        pos = 0
        while data.startswith(head, pos) and len(data) >= pos + end and self._parsing and not self._gone:
            body = data[pos + start : pos + end]
            if self._active is None and not self._queue:
                # Nothing before it: start it now, with no _Request of its own. The lane's
                # request stands in as the active one: what answering reads of it (method,
                # keep-alive) is the repeat's too.
                self._active = known
                self._start_infer(lane.route, known, body)
            else:
                self._take(_Request(known.method, known.url, known.headers, body,
                                    known.keep_alive, known.http_version, None, known.infer_headers))
            pos += end
        return data[pos:] if pos else data

    def _learn(self, data: bytes, request: _Request) -> None:
        """Remember ``request``'s head when ``data`` (one read from a message boundary) was
        exactly that one request, and it is a plain infer request (see _Lane)."""
        body = request.body
        if (
            request.method != b"POST" or request.refusal is not None
            or len(body) > _LANE_MAX_BODY or self._gone or not self._parsing
        ):
            return
        length = None
        for name, value in request.headers:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return
                length = int(value)
            elif name in (b"transfer-encoding", b"expect", b"upgrade"):
                return
        route = self._server.infer_route(request.url)
        if length != len(body) or route is None:
            return
        head = data[: len(data) - len(body)]
        # A head ends at its first empty line. If the read held more than this request's
        # head and body (line breaks after the body, which the parser skips), "the read
        # minus the body" runs past that line: then nothing is learnt.
        if head.find(b"\r\n\r\n") != len(head) - 4:
            return
        request.parsed_infer_headers()  # now, for its repeats (it may wait behind another)
        self._lane = _Lane(head, length, request, route)

    def _refuse(self, error: InvalidInputError) -> None:
        """Answer a request whose body is too large without reading the rest of it, then
        close the connection (the unread body would otherwise be taken as requests)."""
        self._refusal = error
        self._chunks = []
        self._parsing = False
        self._in_message = False
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
                self.close()
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
                self._start_infer(route, request, request.body)
                return
        self._exchange = AsgiExchange(self, self._server.app, self._asgi_scope(request))
        self._server.track(self._loop.create_task(self._exchange.run(request.body)))

    def _start_infer(self, route: tuple[str, str | None], request: _Request, body: bytes) -> None:
        """Hand the active infer request to the endpoints; its answer comes back through
        ``reply`` or ``reply_known`` (maybe at once)."""
        ticket = self._server.app.endpoints.start_infer(
            route[0], route[1], request.parsed_infer_headers(), body, time.monotonic_ns(), self
        )
        if ticket is not None:  # None: answered already (and maybe the next one started)
            self._ticket = ticket

    def reply_known(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        """A 200 answer whose ``headers`` object repeats (Responder.reply_known): its head
        is encoded once per server and reused while the connection stays open."""
        request = self._active
        assert request is not None
        if not request.keep_alive or self._server.closing or request.method == b"HEAD":
            self.reply(200, list(headers), b"".join(parts))
            return
        self._ticket = None
        if self._gone:
            return
        head = self._server.known_heads.get(headers)
        if head is None:
            head = self._server.remember_head(headers)
        self._transport.write(b"".join([head, *parts]))
        self._done()

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write a complete response to the active request and go on with the next one."""
        self._ticket = None
        if self._gone:
            return
        head, _ = self._head_lines(status, headers, len(body))
        assert self._active is not None
        if self._active.method != b"HEAD":
            head.append(body)
        self._transport.write(b"".join(head))
        self._done()

    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Begin a response whose body comes in parts (``send_body``): Content-Length when
        ``headers`` give one, else chunked. The head goes out with the first part."""
        head, self._chunked = self._head_lines(status, headers, None)
        self._head = b"".join(head)

    def _head_lines(
        self, status: int, headers: list[tuple[bytes, bytes]], body_length: int | None
    ) -> tuple[list[bytes], bool]:
        """The active response's head, and whether its body is chunked: without a
        content-length in ``headers`` it gets ``body_length``, or chunked when that is None;
        ``connection: close`` when the connection ends after it."""
        request = self._active
        assert request is not None
        head = [_STATUS_LINES.get(status) or _status_line(status)]
        has_length = False
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
            if name == b"content-length":
                has_length = True
        chunked = False
        if not has_length:
            if body_length is None:
                chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
            else:
                head.append(b"content-length: %d\r\n" % body_length)
        if not request.keep_alive or self._server.closing:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        return head, chunked

    def send_body(self, body: bytes, more: bool) -> None:
        """One part of a response begun with ``start_response``; the last one
        (``more=False``) ends it and goes on with the next request."""
        if self._gone:
            return
        out = [self._head] if self._head else []
        self._head = b""
        if self._active is not None and self._active.method != b"HEAD":
            if not self._chunked:
                out.append(body)
            else:
                if body:
                    out.append(b"%x\r\n%s\r\n" % (len(body), body))
                if not more:
                    out.append(b"0\r\n\r\n")
        if out:
            self._transport.write(b"".join(out))
        if not more:
            self._done()

    def _asgi_scope(self, request: _Request) -> dict[str, Any]:
        transport = self._transport
        return http_scope(
            method=request.method, url=request.url, headers=request.headers, http_version=request.http_version,
            server=transport.get_extra_info("sockname"), client=transport.get_extra_info("peername"),
            state=self._server.state,
        )

    @property
    def gone(self) -> bool:
        return self._gone

    def _done(self) -> None:
        request = self._active
        assert request is not None
        self._active = None
        self._exchange = None
        if not request.keep_alive or self._server.closing:
            self.close()
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
        """Close after what is written goes out; nothing more is started or written
        (pipelined requests already parsed are dropped)."""
        if not self._gone:
            self._gone = True
            self._parsing = False
            self._queue.clear()
            self._transport.close()


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
        #: keep-alive 200 heads of remembered answers, by their headers (reply_known).
        self.known_heads: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}

    def remember_head(self, headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
        """The encoded keep-alive 200 head for ``headers`` (which hold content-length)."""
        head = _STATUS_LINES[200] + b"".join(b"%s: %s\r\n" % pair for pair in headers) + b"\r\n"
        if len(self.known_heads) >= _MAX_ROUTES:
            self.known_heads.clear()  # answers of ever-changing shapes must not pile up
        self.known_heads[headers] = head
        return head

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
        lifespan = Lifespan(self.app, self.state)
        await lifespan.startup()
        try:
            if fd is not None:  # a duplicate: the caller keeps (and closes) its own
                sock = socket.socket(fileno=os.dup(fd))
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
