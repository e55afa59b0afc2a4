"""A fake-transport harness for the native engine's Connection: no socket, no TCP.

``NativeHarness`` builds a real NativeServer and Connection on a stub app: ``StubEndpoints``
stands for ``Endpoints.start_infer`` (it answers an infer request with what it was given,
through ``reply_repeat``, ``reply`` or later), and ``stub_asgi`` is the ASGI app behind
``asgi_bridge`` for every other request. Bytes are fed in reads split wherever a test
likes; ``FakeTransport`` collects what the connection writes and honours pause/resume
reading the way an asyncio transport does (no ``data_received`` while paused).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from typing import Any

from nereid.http.app import NereidApp
from nereid.http.h1.limits import ConnectionLimits
from nereid.http.h1.server import NativeServer
from nereid.http.h1.connection import Connection

from tests.unit.manual_clock import next_turn

__all__ = ["FakeTransport", "NativeHarness", "StubEndpoints", "get", "infer", "responses", "split_at", "stub_asgi"]


class FakeTransport:
    """What a Connection needs of an asyncio transport; ``written`` is every byte written."""

    def __init__(self, eof_capable: bool = False) -> None:
        self.written = bytearray()
        self.writes = 0
        self.reading = True
        self.closed = False
        self.aborted = False
        #: like an SSL transport by default (no half-close): close() closes at once
        self.eof_capable = eof_capable
        self.eof_written = False

    def can_write_eof(self) -> bool:
        return self.eof_capable

    def write_eof(self) -> None:
        assert self.eof_capable and not self.closed
        self.eof_written = True

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.written += data
        self.writes += 1

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50123)}.get(name, default)


class _Ticket:
    def __init__(self) -> None:
        self.withdrawn = False

    def withdraw(self) -> None:
        self.withdrawn = True


class StubEndpoints:
    """Stands for ``Endpoints.start_infer``. The answer's body is what the request brought
    (route, the InferHeaders fields, body), so a repeat given the wrong head or body shows.
    A body starting with ``bad`` gets a 400 through ``reply``; one starting with ``later``
    is answered by ``release`` (as a model would, on the loop, later); any other at once
    through ``reply_repeat`` (one headers object per answer length, like known answers)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, bytes]] = []
        self.pending: collections.deque[tuple[_Ticket, Callable[[], None]]] = collections.deque()
        self._known: dict[int, tuple[tuple[bytes, bytes], ...]] = {}

    def start_infer(
        self, name: str, version_text: str | None, headers: Any, body: bytes, received_ns: int, responder: Any
    ) -> _Ticket | None:
        self.calls.append((name, version_text, body))
        if body.startswith(b"bad"):
            responder.reply(400, [(b"content-type", b"application/json")], b'{"error":"bad request"}')
            return None
        fields = (name, version_text, headers.header_length, headers.content_encoding, headers.accept_encoding)
        answer = ("|".join(str(field) for field in fields) + "|").encode() + body
        known = self._known.get(len(answer))
        if known is None:
            known = self._known[len(answer)] = (
                (b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % len(answer)))
        parts = [answer[:7], answer[7:]]
        if not body.startswith(b"later"):
            responder.reply_repeat(known, parts)
            return None
        ticket = _Ticket()
        self.pending.append((ticket, lambda: responder.reply_repeat(known, parts)))
        return ticket

    def release(self) -> bool:
        """Answer the oldest deferred request (unless withdrawn); False when none waits."""
        if not self.pending:
            return False
        ticket, answer = self.pending.popleft()
        if not ticket.withdrawn:
            answer()
        return True


async def stub_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every request that is not a fast-path infer: echoes method, path, query and body;
    ``/stream`` answers in three parts without a content-length (chunked)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    message = await receive()
    echo = b"%s %s ?%s %s" % (scope["method"].encode(), scope["path"].encode(), scope["query_string"], message["body"])
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one,", b"two,", echo):
            await send({"type": "http.response.body", "body": part, "more_body": part is not echo})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": echo})


class NativeHarness:
    """One Connection of a NativeServer on a FakeTransport, inside a running loop.
    ``match_repeats=False``: every request goes through the parser (the reference path)."""

    def __init__(self, *, match_repeats: bool = True, max_request_size: int = 1 << 20, eof_capable: bool = False,
                 **limits: Any) -> None:
        self.endpoints = StubEndpoints()
        app = NereidApp(starlette=stub_asgi, endpoints=self.endpoints)  # type: ignore[arg-type]
        self.time = 100.0  # the server's clock: moved by ``advance`` only
        self.server = NativeServer(app, limits=ConnectionLimits(max_request_size=max_request_size, **limits),
                                   graceful_timeout=1.0, match_repeats=match_repeats, clock=lambda: self.time)
        self.server.loop = asyncio.get_running_loop()
        self.transport = FakeTransport(eof_capable)
        self.connection = Connection(self.server)
        self.connection.connection_made(self.transport)
        self._inbox: collections.deque[bytes] = collections.deque()

    @property
    def written(self) -> bytes:
        return bytes(self.transport.written)

    def feed(self, *reads: bytes) -> None:
        """Deliver each of ``reads`` as one ``data_received`` (held while reading is paused)."""
        self._inbox.extend(reads)
        self._deliver()

    def _deliver(self) -> None:
        while self._inbox and self.transport.reading and not self.transport.closed:
            self.connection.data_received(self._inbox.popleft())

    async def settle(self, *, release: bool = True) -> None:
        """Let the loop run ASGI requests, answer deferred infer requests (``release``) and
        deliver held reads, until nothing moves."""
        for _ in range(10_000):
            await next_turn()
            self._deliver()
            if self.server._tasks:
                continue
            if release and self.endpoints.release():
                continue
            if self._inbox and self.transport.reading and not self.transport.closed:
                continue
            return
        raise AssertionError("the connection never settled")

    def advance(self, seconds: float) -> None:
        """Move the server's clock on and let it sweep its connections' timers."""
        self.time += seconds
        self.server.sweep()

    def lose(self) -> None:
        """The client goes away."""
        self.transport.closed = True
        self.connection.connection_lost(None)


def infer(body: bytes, *, url: bytes = b"/v2/models/m/infer", extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    """A Content-Length infer POST; the same ``url``, ``extra`` and body length give the same head."""
    return b"POST %s HTTP/%s\r\nHost: x\r\nInference-Header-Content-Length: 3\r\n%sContent-Length: %d\r\n\r\n%s" % (
        url, version, extra, len(body), body)


def get(path: bytes = b"/v2/health/live", extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path, extra)


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (sorted, deduplicated, inside 1..len-1) into reads."""
    points = sorted({cut for cut in cuts if 0 < cut < len(data)})
    return [data[start:end] for start, end in zip([0, *points], [*points, len(data)])]


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in ``data`` (Content-Length or chunked bodies; 100 Continue included,
    with an empty body). Fails on bytes that are not whole responses."""
    found: list[tuple[int, dict[str, str], bytes]] = []
    while data:
        head, separator, data = data.partition(b"\r\n\r\n")
        assert separator, f"an incomplete head: {head!r}"
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
        if "content-length" in headers:
            length = int(headers["content-length"])
            assert len(data) >= length, "an incomplete body"
            body, data = data[:length], data[length:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, _, data = data.partition(b"\r\n")
                size = int(size_line, 16)
                chunk, data = data[:size], data[size + 2:]
                if not size:
                    break
                body += chunk
        else:
            body = b""
        found.append((status, headers, body))
    return found
