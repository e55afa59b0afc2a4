"""NativeServer: nereid's own HTTP/1.1 engine, httptools' parser on the asyncio loop.

Owns the listening socket, the lifespan, the state shared by its connections (infer
routes by URL, encoded ``reply_repeat`` heads, the ShortcutCounters) and graceful shutdown.
One ``native_connection.Connection`` per socket does the HTTP/1.1 framing: infer requests
go from the parser straight to ``Endpoints.start_infer`` and back as one socket write,
with no ASGI messages, task, coroutine or Future per request; every other request, and the
lifespan, goes to the ASGI app through ``asgi_bridge``. A request that repeats the head of
its connection's last infer request byte for byte skips the parser (``repeat_matcher``).

Why it exists: on the identity benchmark the ASGI layer (scope, messages, a task per
request, the engine's protocol object) was most of nereid's own CPU per request; this
engine answers the same requests for well under half of it (README, Performance).
Knows nothing about models: what an infer request means is ``Endpoints``' business.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

from nereid.http.app import NereidApp
from nereid.http.h1.asgi_bridge import Lifespan
from nereid.http.h1.limits import ConnectionLimits
from nereid.http.h1.connection import Connection
from nereid.http.h1.heads import encode_repeat_head
from nereid.network.connections import ConnectionRefusals, drain
from nereid.network.request_budget import RequestBudget

__all__ = ["NativeServer", "ShortcutCounters"]

#: URLs whose infer route the server remembers, and reply_repeat heads it keeps encoded
#: (each cleared when full).
_MAX_ROUTES = 1024


@dataclass(slots=True)
class ShortcutCounters:
    """Requests that skipped the usual path, over all of a server's connections."""

    #: requests taken by the RepeatedHead instead of the parser (answered unless their
    #: connection closes first)
    repeats: int = 0
    #: repeats started at once, nothing else being in flight on their connection
    direct_starts: int = 0


class NativeServer:
    """Serves a NereidApp on one listening socket until ``shutdown`` is set, then stops
    taking connections, lets requests in flight finish (``graceful_timeout`` seconds at
    most), closes every connection and runs the app's lifespan shutdown.
    ``match_repeats=False`` sends every request through the parser (no RepeatedHead).
    ``limits`` are what each client may hold (connection_limits), ``budget`` the server-wide
    request bytes (shared with gRPC); ``clock`` is read once
    per sweep into ``now``, the time the connections' timers use."""

    def __init__(
        self, app: NereidApp, *, limits: ConnectionLimits | None = None, graceful_timeout: float,
        match_repeats: bool = True, clock: Callable[[], float] = time.monotonic, budget: RequestBudget | None = None,
    ) -> None:
        self.app = app
        self.limits = limits if limits is not None else ConnectionLimits()
        #: request bytes held, shared with the server's gRPC engine when it passes its own
        self.body_budget = budget if budget is not None else RequestBudget(self.limits.max_body_bytes_in_flight)
        self.clock = clock
        #: the coarse time of the connections' timers (set by ``sweep``)
        self.now = clock()
        #: connections refused at the connection limit
        self.refusals = ConnectionRefusals("HTTP", "--http-max-connections", "503", self.limits.max_connections, clock)
        self.graceful_timeout = graceful_timeout
        self.match_repeats = match_repeats
        self.connections: set[Connection] = set()
        self.closing = False
        self.state: dict[str, Any] = {}
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by serve()
        #: requests that skipped the parser, and those of them started at once
        self.shortcuts = ShortcutCounters()
        self._tasks: set[asyncio.Task[None]] = set()
        self._routes: dict[bytes, tuple[str, str | None] | None] = {}
        #: keep-alive 200 heads of reply_repeat answers, by their headers object.
        self.repeat_heads: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}

    def add_repeat_head(self, headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
        """The encoded keep-alive 200 head for ``headers`` (which hold content-length)."""
        head = encode_repeat_head(headers)
        if len(self.repeat_heads) >= _MAX_ROUTES:
            self.repeat_heads.clear()  # answers of ever-changing shapes must not pile up
        self.repeat_heads[headers] = head
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

    def open_connections(self) -> int:
        """Connections open now, as ``limits.max_connections`` counts them (a front-end
        worker counts every worker's)."""
        return len(self.connections)

    @property
    def refused_connections(self) -> int:
        return self.refusals.count

    def refused_connection(self) -> None:
        """A connection arrived past ``limits.max_connections`` (it gets 503): logged,
        at most once a minute, with how many were refused."""
        self.refusals.refused()

    def sweep(self) -> None:
        """Move ``now`` and let every connection check its timers (head, body, reading,
        keep-alive)."""
        self.now = now = self.clock()
        for connection in list(self.connections):
            connection.check_timeouts(now)

    def _sweep_periodically(self) -> None:
        self.sweep()
        if not self.closing:
            self._sweeper = self.loop.call_later(self.limits.sweep_interval, self._sweep_periodically)

    def track(self, task: asyncio.Task[None]) -> None:
        """Keep an ASGI request's task until it ends (cancelled at shutdown if it outlives
        its connection)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def serve(
        self, shutdown: asyncio.Event, *, host: str = "127.0.0.1", port: int = 8000, fd: int | None = None,
        on_listening: Callable[[asyncio.AbstractServer], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """Listen (by address: the loop's own listening socket, which served measurably
        faster here than one bound beforehand and handed over), tell ``on_listening``,
        then start the app (the models load) and serve until ``shutdown``. An OSError
        from listening comes before any model loads. With ``tls`` the socket speaks
        HTTPS; a connection's TLS handshake must be done within the header timeout (the
        loop does handshakes without blocking, so a flood of unfinished ones delays
        nobody else), and its HTTP timers start once it is."""
        self.loop = asyncio.get_running_loop()
        secure: dict[str, Any] = {}
        if tls is not None:
            secure = {"ssl": tls, "ssl_handshake_timeout": self.limits.header_timeout}
        if fd is not None:  # a duplicate: the caller keeps (and closes) its own
            sock = socket.socket(fileno=os.dup(fd))
            listener = await self.loop.create_server(lambda: Connection(self), sock=sock, backlog=2048, **secure)
        else:
            listener = await self.loop.create_server(
                lambda: Connection(self), host, port, backlog=2048, reuse_address=True, **secure
            )
        if on_listening is not None:
            on_listening(listener)
        self._sweeper = self.loop.call_later(self.limits.sweep_interval, self._sweep_periodically)
        lifespan = Lifespan(self.app, self.state)
        try:
            await lifespan.startup()
            try:
                await shutdown.wait()
            finally:
                self.closing = True
                self._sweeper.cancel()
                listener.close()
                await self._drain_connections()
                await listener.wait_closed()
        finally:
            listener.close()
            await lifespan.shutdown()

    async def _drain_connections(self) -> None:
        """Close idle connections now, busy ones when their answer is out (or at the
        graceful timeout)."""
        # Handlers still running (a stream whose client never left) end with their connection.
        await drain(
            self.connections, self.graceful_timeout, idle=lambda connection: connection.idle,
            close=lambda connection: connection.close(), force=lambda connection: connection.force_close(),
            tasks=self._tasks,
        )
