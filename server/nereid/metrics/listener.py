"""MetricsListener: the metrics port, a minimal HTTP/1.1 responder on
``asyncio.start_server`` in the server's own event loop, so it works the same under
every HTTP engine and reads the statistics on the thread that writes them. It answers
exactly what Triton's metrics port answers: ``GET /metrics`` (or ``/metrics/``) the
text, any other GET path 200 with an empty body, any other method 405. Knows nothing
about Prometheus: it serves what ``render`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Callable

from nereid.metrics.collector import CONTENT_TYPE
from nereid.network.access import Refusals, Restriction

__all__ = ["MetricsListener"]

_log = logging.getLogger("nereid.metrics")

# -- the listener -------------------------------------------------------------------------

_MAX_HEADER_LINES = 100
_MAX_BODY = 1 << 20
_IDLE_SECONDS = 75.0
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed"}


class MetricsListener:
    """A minimal HTTP/1.1 server for the metrics port, on the running event loop.

    ``await listener.start(host, port)`` binds (port 0 picks one; ``listener.port``
    tells which); ``await listener.aclose()`` stops listening and drops connections.
    Keep-alive and pipelined requests are served in order; request bodies are read and
    ignored; anything unparsable gets 400 and the connection is closed.
    """

    def __init__(
        self, render: Callable[[], bytes], restriction: Restriction | None = None, refusals: Refusals | None = None,
    ) -> None:
        self._render = render
        #: --metrics-restricted-api: the header every request needs (None: none)
        self._restriction = restriction
        self._refusals = refusals if refusals is not None else Refusals()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._connection, host, port, limit=64 * 1024)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True to keep the connection for the next one."""
        line = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        while line in (b"\r\n", b"\n"):  # stray CRLF between requests (RFC 9112 §2.2)
            line = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        if not line:
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _respond(writer, 400, b"", close=True)
            return False
        method, target, version = parts
        head = await _read_headers(reader, version == "HTTP/1.1", self._restriction)
        if head is None:
            await _respond(writer, 400, b"", close=True)
            return False
        if head.chunked or head.length > _MAX_BODY:
            head.keep_alive = False  # the body is not read: the connection cannot be reused
        elif head.length:
            await reader.readexactly(head.length)
        await self._answer(writer, method, target, head)
        return head.keep_alive

    async def _answer(self, writer: asyncio.StreamWriter, method: str, target: str, head: _Head) -> None:
        """What Triton's metrics port answers ``method`` on ``target``."""
        path = target.split("?", 1)[0]
        if "://" in path:  # absolute-form target
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        close = not head.keep_alive
        restriction = self._restriction
        if restriction is not None and not restriction.allows(head.presented):
            self._refusals.count("metrics", "metrics")
            body = json.dumps({"error": restriction.http_message()}, separators=(",", ":")).encode()
            await _respond(writer, 403, body, close=close, content_type="application/json",
                           head_only=method == "HEAD")
        elif method != "GET":
            await _respond(writer, 405, b'{"error":"Method Not Allowed"}', close=close,
                           content_type="application/json", head_only=method == "HEAD")
        elif path in ("/metrics", "/metrics/"):
            await _respond(writer, 200, self._render(), close=close)
        else:
            await _respond(writer, 200, b"", close=close)


@dataclass(slots=True)
class _Head:
    """What the listener reads of a request's headers."""

    keep_alive: bool
    length: int = 0
    chunked: bool = False
    #: the value of the restricted group's key header, when the metrics API is restricted
    presented: str | None = None


async def _read_headers(
    reader: asyncio.StreamReader, keep_alive: bool, restriction: Restriction | None
) -> _Head | None:
    """A request's headers, read up to the blank line; None for a bad request (a bad
    Content-Length, or more than _MAX_HEADER_LINES lines)."""
    head = _Head(keep_alive)
    for _ in range(_MAX_HEADER_LINES):
        header = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        if header in (b"\r\n", b"\n", b""):
            return head
        name, _, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length":
            if not value.isdigit():
                return None
            head.length = int(value)
        elif name == "transfer-encoding":
            head.chunked = "chunked" in value.lower()
        elif restriction is not None and name == restriction.name and head.presented is None:
            head.presented = value
        elif name == "connection":
            tokens = {t.strip().lower() for t in value.split(",")}
            if "close" in tokens:
                head.keep_alive = False
            elif "keep-alive" in tokens:
                head.keep_alive = True
    return None


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    *,
    close: bool,
    content_type: str = CONTENT_TYPE,
    head_only: bool = False,
) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    writer.write(head.encode("latin-1") + (b"" if head_only else body))
    await writer.drain()
