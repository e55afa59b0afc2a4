"""Connection: one client socket of the native engine, HTTP/1.1.

Owns one connection's answering: its requests (read by its ``RequestReader``, within the
limits) answered one at a time, in order, pipelined ones waiting (reading pauses when too
many wait, and while the client does not read its answers), keep-alive and ``connection:
close``, the keep-alive timer, and the response bytes (Content-Length or chunked; a
``reply_repeat`` head encoded once per headers object and server). Infer requests go
straight to ``Endpoints.start_infer`` (the connection is their ``Responder``); every other
request goes to the ASGI app through ``asgi_bridge`` (the connection is that exchange's
``Responder`` too).

A request that repeats the head of the connection's last plain infer request byte for
byte is taken without the parser (a repeat: ``RepeatedHead``); when nothing else is in
flight on the connection it is started at once, without a ``Request`` of its own (a
direct start). ``ShortcutCounters`` counts both.

Its life is a ``ConnectionState`` (``state.py``, with the moves it may make): OPEN while it
reads requests; LAST_REQUEST once reading stopped (a parse error, an upgrade, a refused
request), answering what was read before closing; LINGERING after our FIN; CLOSED. Apart
from it, two back-pressure signals: reading paused by us (MAX_PIPELINED requests wait)
and writing paused by the transport (the client does not read its answers).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import TYPE_CHECKING, Any

import httptools

from nereid.http.h1.asgi_bridge import AsgiExchange, http_scope
from nereid.http.h1.heads import response_head
from nereid.http.h1.request_reader import RepeatedHead, Request, RequestReader, refusal
from nereid.http.h1.state import TRANSITIONS, ConnectionState

if TYPE_CHECKING:
    from nereid.http.h1.server import NativeServer

__all__ = ["Connection", "MAX_PIPELINED"]

#: Complete requests a connection may hold unanswered (pipelining) before it stops reading.
MAX_PIPELINED = 16
#: How long a closing connection reads and drops what its client still sends (close()).
LINGER_S = 2.0
_BAD_REQUEST = b'{"error":"Invalid HTTP request received."}'


_OPEN = ConnectionState.OPEN
_LAST_REQUEST = ConnectionState.LAST_REQUEST
_LINGERING = ConnectionState.LINGERING
_CLOSED = ConnectionState.CLOSED
#: the states in which requests are still answered (tuples: the hot path tests membership)
_ANSWERING = (_OPEN, _LAST_REQUEST)
_GONE = (_LINGERING, _CLOSED)

class Connection(asyncio.Protocol):
    """One client connection: parses requests and answers them one at a time, in order."""

    def __init__(self, server: NativeServer) -> None:
        self._server = server
        self._loop = server.loop
        self._limits = server.limits
        self._shortcuts = server.shortcuts
        #: checks infer requests when the inference group is restricted (else None)
        self._infer_guard = server.app.infer_guard
        self._reader: RequestReader = None  # type: ignore[assignment]  # set by connection_made
        self._transport: Any = None
        self._queue: collections.deque[Request] = collections.deque()
        self._active: Request | None = None
        self._ticket: Any = None  # the active infer request's ticket (to withdraw on disconnect)
        self._exchange: AsgiExchange | None = None
        self._head = b""  # a streamed response's head, sent with its first part
        self._chunked = False  # the streamed response's framing: chunked, or Content-Length
        self._state = _OPEN
        self._in_next = False  # _next is looping (a re-entrancy guard, not connection state)
        # back-pressure, apart from the state: we paused reading (MAX_PIPELINED wait);
        # the transport paused writing (the client does not read its answers)
        self._reading_paused = False
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        # timers (NativeServer.now's coarse clock): idle since, not read from since
        self._idle_since = server.now
        self._paused_since = 0.0
        #: while LINGERING: when to stop waiting for the client's FIN
        self._linger_until = 0.0
        # repeats: the learnt head, the request it came with and its infer route
        self._learns_heads = server.match_repeats
        self._repeats: RepeatedHead | None = None
        self._repeated: Request | None = None
        self._repeated_route: tuple[str, str | None] = ("", None)

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        server = self._server
        if server.open_connections() >= self._limits.max_connections:
            server.refused_connection()
            status, headers, body = refusal(503, self._limits.told("max_connections"))
            head, _ = response_head(status, headers, len(body), True)
            transport.write(b"".join([*head, body]))
            self._enter(_CLOSED)
            transport.close()
            return
        self._reader = RequestReader(self, server, transport)
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        """Withdraw what is in flight and let go of every buffer now (the reader's parser
        refers back to it: without this a closed connection's request bodies would wait
        for Python's cyclic garbage collector)."""
        self._enter(_CLOSED)
        self._server.connections.discard(self)
        if self._ticket is not None:
            self._ticket.withdraw()
            self._ticket = None
        if self._exchange is not None:
            self._exchange.disconnect()
        self._queue.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._reader is not None:
            self._reader.close()
        self._repeats = self._repeated = None
        if self._active is not None:
            self._active.body = b""

    def data_received(self, data: bytes) -> None:
        """Take the repeats a read starts with (when it starts at a message boundary), give
        the rest to the parser, and learn the head of a read that was one whole request."""
        if self._state is not _OPEN:
            return
        repeats = self._repeats
        reader = self._reader
        if repeats is not None and not reader.in_message:
            bodies = repeats.match(data)
            if bodies:
                request = self._repeated
                assert request is not None
                direct = 0
                for body in bodies:
                    if self._state is not _OPEN:
                        break
                    if self._active is None and not self._queue and not self._write_paused:
                        # Nothing before it: start it now, with no Request of its own. The
                        # repeated request stands in as the active one: what answering reads
                        # of it (method, keep-alive) is the repeat's too.
                        direct += 1
                        self._active = request
                        self._start_infer(self._repeated_route, request, body)
                    else:
                        self.take(Request(request.method, request.url, request.headers, body,
                                            request.keep_alive, request.http_version, None, request.infer_headers))
                shortcuts = self._shortcuts
                shortcuts.repeats += len(bodies)
                shortcuts.direct_starts += direct
                taken = len(bodies) * repeats.size
                if taken == len(data) or self._state is not _OPEN:
                    return
                data = data[taken:]
        try:
            whole = reader.feed(data)
            if whole is not None:
                self._learn(data, whole)
        except httptools.HttpParserUpgrade:
            # nereid speaks HTTP/1.1 only: answer the request as is, then close (what
            # follows on the socket would be the other protocol).
            self._enter(_LAST_REQUEST)
            if self._queue:
                self._queue[-1].keep_alive = False
            self._next()
        except httptools.HttpParserError:
            self._enter(_LAST_REQUEST)
            self._queue.append(Request(b"", b"", [], b"", False, "1.1", None))
            self._next()

    def pause_writing(self) -> None:
        """The client does not read fast enough: no further request is started (and
        reading stops once MAX_PIPELINED wait) until it catches up."""
        self._write_paused = True
        self._paused_since = self._server.now

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._active is None and self._queue:
            self._next()

    def check_timeouts(self, now: float) -> None:
        """Called by the server's sweep: close (with 408 where an answer can be given) a
        connection whose head, body or reading of answers stalled past its limit, or
        that stayed idle past the keep-alive timeout."""
        state = self._state
        if state is not _OPEN and state is not _LAST_REQUEST:
            if state is _LINGERING and now >= self._linger_until:
                self._enter(_CLOSED)
                self._transport.close()
            return
        limits = self._limits
        if self._write_paused and now - self._paused_since > limits.body_timeout:
            self._transport.abort()  # it reads nothing: an answer would not reach it
            return
        reader = self._reader
        if reader.in_message:
            reader.timed_out(now)
        elif self._active is None and not self._queue and now - self._idle_since > limits.keepalive_timeout:
            self.close()

    # -- what the RequestReader hands over -----------------------------------------------

    def take(self, request: Request) -> None:
        """Queue a complete request; start it when nothing is being answered."""
        self._queue.append(request)
        if self._active is None and not self._write_paused:
            self._next()
        elif len(self._queue) >= MAX_PIPELINED and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def take_refusal(self, request: Request) -> None:
        """Answer a request that broke a limit (in its turn), then close: nothing more is read."""
        if self._state is _OPEN:
            self._enter(_LAST_REQUEST)
        self._queue.append(request)
        if self._active is None:
            self._next()

    def may_continue(self) -> bool:
        return self._active is None and not self._queue and self._state in _ANSWERING

    def _learn(self, read: bytes, request: Request) -> None:
        """Learn ``request``'s head for its repeats when ``read`` (one read from a message
        boundary) was exactly that request, a plain keep-alive infer POST
        (RepeatedHead.learn says which heads qualify)."""
        if not self._learns_heads or not request.keep_alive or self._state is not _OPEN:
            return
        repeats = RepeatedHead.learn(read, request.method, request.headers, request.body)
        if repeats is None:
            return
        route = self._server.infer_route(request.url)
        if route is None:
            return
        guard = self._infer_guard
        if guard is not None and not guard.permits(request.headers):
            return  # its repeats would skip the check: they are parsed (and refused) instead
        request.parsed_infer_headers()  # now, for its repeats (it may wait behind another)
        self._repeats = repeats
        self._repeated = request
        self._repeated_route = route

    # -- answering -----------------------------------------------------------------------

    def _next(self) -> None:
        """Answer waiting requests in order while each is answered at once (errors,
        refusals); stop at the first that will be answered later. A loop, not recursion:
        one read can hold hundreds of pipelined requests."""
        if self._in_next:
            return  # an outer call is looping: it picks up the next request
        self._in_next = True
        try:
            while self._active is None and self._queue and self._state in _ANSWERING and not self._write_paused:
                self._start(self._queue.popleft())
        finally:
            self._in_next = False
        if self._active is None and not self._queue:
            state = self._state
            if state is _LAST_REQUEST:
                self.close()
            elif state is _OPEN and self._reading_paused:
                self._reading_paused = False
                self._transport.resume_reading()

    def _start(self, request: Request) -> None:
        self._active = request
        if request.refusal is not None:
            self.reply(*request.refusal)
            return
        if not request.method:  # the parser gave up on it
            self.reply(400, [(b"content-type", b"application/json")], _BAD_REQUEST)
            return
        if request.method == b"POST":
            route = self._server.infer_route(request.url)
            if route is not None:
                guard = self._infer_guard  # None unless inference is restricted
                if guard is not None and not guard.allows(request.headers):
                    self.reply(*guard.refusal)
                    return
                self._start_infer(route, request, request.body)
                return
        try:
            scope = self._asgi_scope(request)
        except httptools.HttpParserInvalidURLError as exc:  # e.g. past parse_url's 65535 bytes
            request.keep_alive = False
            self.reply(*refusal(400, f"invalid request URL: {exc}"))
            return
        self._exchange = AsgiExchange(self, self._server.app, scope)
        self._server.track(self._loop.create_task(self._exchange.run(request.body)))

    def _start_infer(self, route: tuple[str, str | None], request: Request, body: bytes) -> None:
        """Hand the active infer request to the endpoints; its answer comes back through
        ``reply`` or ``reply_repeat`` (maybe at once)."""
        ticket = self._server.app.endpoints.start_infer(
            route[0], route[1], request.parsed_infer_headers(), body, time.monotonic_ns(), self
        )
        if ticket is not None:  # None: answered already (and maybe the next one started)
            self._ticket = ticket

    def reply_repeat(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        """A 200 answer whose ``headers`` are one object per kind of answer
        (Responder.reply_repeat): their head is encoded once per server, then reused."""
        self._ticket = None
        if self._state in _GONE:
            return
        request = self._active
        assert request is not None
        if not request.keep_alive or self._server.closing or request.method == b"HEAD":
            self.reply(200, list(headers), b"".join(parts))
            return
        head = self._server.repeat_heads.get(headers)
        if head is None:
            head = self._server.add_repeat_head(headers)
        self._transport.write(b"".join([head, *parts]))
        self._done()

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write a complete response to the active request and go on with the next one."""
        self._ticket = None
        if self._state in _GONE:
            return
        request = self._active
        assert request is not None
        head, _ = response_head(status, headers, len(body), not request.keep_alive or self._server.closing)
        if request.method != b"HEAD":
            head.append(body)
        self._transport.write(b"".join(head))
        self._done()

    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Begin a response whose body comes in parts (``send_body``): Content-Length when
        ``headers`` give one, else chunked. The head goes out with the first part."""
        request = self._active
        assert request is not None
        head, self._chunked = response_head(status, headers, None, not request.keep_alive or self._server.closing)
        self._head = b"".join(head)

    def send_body(self, body: bytes, more: bool) -> None:
        """One part of a response begun with ``start_response``; the last one
        (``more=False``) ends it and goes on with the next request."""
        if self._state in _GONE:
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

    def _asgi_scope(self, request: Request) -> dict[str, Any]:
        transport = self._transport
        return http_scope(
            method=request.method, url=request.url, headers=request.headers, http_version=request.http_version,
            server=transport.get_extra_info("sockname"), client=transport.get_extra_info("peername"),
            state=self._server.state,
        )

    @property
    def gone(self) -> bool:
        return self._state in _GONE

    @property
    def state(self) -> ConnectionState:
        return self._state

    def _enter(self, state: ConnectionState) -> None:
        """Move to ``state``; a move TRANSITIONS does not list is a bug."""
        if state not in TRANSITIONS[self._state]:
            raise RuntimeError(f"HTTP/1.1 connection: no transition from {self._state.name} to {state.name}")
        self._state = state

    def _done(self) -> None:
        request = self._active
        assert request is not None
        self._active = None
        self._exchange = None
        if request.reserved:
            self._reader.release(request)
        self._idle_since = self._server.now  # the keep-alive wait begins
        if not request.keep_alive or self._server.closing:
            self.close()
            return
        self._next()

    async def drain(self) -> None:
        """Wait while the client does not read (flow control for streamed responses)."""
        if self._write_paused and self._state in _ANSWERING:
            self._drain = self._loop.create_future()
            await self._drain

    @property
    def idle(self) -> bool:
        return self._active is None and not self._queue

    def close(self) -> None:
        """Close after what is written goes out; nothing more is started or written
        (pipelined requests already parsed are dropped). A lingering close: the answer is
        followed by our FIN, and what the client still sends is read and dropped until it
        closes too (or LINGER_S pass): closing with its data unread would make the kernel
        reset the connection, and a client still sending (a refused 70 KB URL, a body
        past the limit) would get the reset instead of the answer."""
        if self._state in _ANSWERING:
            self._queue.clear()
            transport = self._transport
            if self._server.closing or not transport.can_write_eof():
                self._enter(_CLOSED)
                transport.close()
                return
            transport.write_eof()
            self._linger_until = self._server.now + LINGER_S
            self._enter(_LINGERING)

    def force_close(self) -> None:
        """Close now, lingering or not (shutdown)."""
        self.close()
        if self._state is _LINGERING:
            self._enter(_CLOSED)
        self._transport.close()

    def eof_received(self) -> bool:
        """The client is done sending: the transport closes (at once when we were lingering)."""
        return False
