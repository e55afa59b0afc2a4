"""The ASGI 3 side of the native engine: one request answered by an ASGI app (scope,
``receive``, ``send``), and the app's lifespan protocol.

Owns ASGI semantics only: message order, the one-shot request body, ``http.disconnect``,
errors before and after the response started. HTTP framing (status line, Content-Length
or chunked, keep-alive) belongs to the connection behind ``Responder``.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any, Callable, MutableMapping, Protocol

import httptools

from nereid.http.errors import error_json, internal_error_message

__all__ = ["AsgiExchange", "Lifespan", "Responder", "http_scope"]

_log = logging.getLogger("nereid")

_JSON = (b"content-type", b"application/json")


class Responder(Protocol):
    """What an exchange needs of its connection."""

    @property
    def gone(self) -> bool: ...

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A complete response in one write."""

    def start_response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The head of a response whose body comes in parts."""

    def send_body(self, body: bytes, more: bool) -> None:
        """One part of that body (``more=False``: the last)."""

    async def drain(self) -> None:
        """Wait while the client does not read."""

    def close(self) -> None:
        """Close the connection (a response that cannot be finished)."""


def http_scope(
    *, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], http_version: str,
    server: Any, client: Any, state: dict[str, Any],
) -> dict[str, Any]:
    """The ASGI HTTP scope of one request (path percent-decoded, query string apart)."""
    parsed = httptools.parse_url(url)
    raw_path: bytes = parsed.path
    path = raw_path.decode("latin-1")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": http_version,
        "server": _address(server),
        "client": _address(client),
        "scheme": "http",
        "method": method.decode("latin-1"),
        "root_path": "",
        "path": path,
        "raw_path": raw_path,
        "query_string": parsed.query or b"",
        "headers": headers,
        "state": dict(state),
    }


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return (str(value[0]), int(value[1]))
    return None


class AsgiExchange:
    """One request answered by an ASGI app through a Responder."""

    __slots__ = ("_connection", "_app", "_scope", "_started", "_complete", "_headers", "_status",
                 "_body_given", "_disconnected")

    def __init__(self, connection: Responder, app: Callable[..., Any], scope: dict[str, Any]) -> None:
        self._connection = connection
        self._app = app
        self._scope = scope
        self._started = False
        self._complete = False
        self._headers: list[tuple[bytes, bytes]] | None = None
        self._status = 0
        self._body_given = False
        self._disconnected: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def disconnect(self) -> None:
        """The response is complete or the client left: ``receive`` answers http.disconnect."""
        if not self._disconnected.done():
            self._disconnected.set_result(None)

    async def run(self, body: bytes) -> None:
        """Run the app on this request (``body``: the whole request body)."""
        what = f"{self._scope['method']} {self._scope['path']}"
        try:
            await self._app(self._scope, lambda: self._receive(body), self._send)
        except Exception as exc:  # NereidApp answers its own; another app's bug: a JSON 500
            _log.error("internal error in %s", what, exc_info=exc)
            if not self._started:
                self._connection.reply(500, [_JSON], error_json(internal_error_message(what, exc)))
            elif not self._complete:
                self._connection.close()
            return
        if not self._started:
            message = f"internal error in {what}: the app returned without a response"
            _log.error("%s", message)
            self._connection.reply(500, [_JSON], error_json(message))
        elif not self._complete:
            _log.error("HTTP %s: the app returned before finishing its response", what)
            self._connection.close()

    async def _receive(self, body: bytes) -> dict[str, Any]:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self._disconnected
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._started:
                raise RuntimeError("ASGI: http.response.start sent twice")
            self._started = True
            self._status = message["status"]
            self._headers = [(name.lower(), value) for name, value in message.get("headers", ())]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"ASGI: unexpected message {kind!r}")
        if not self._started or self._complete:
            raise RuntimeError("ASGI: http.response.body before http.response.start or after the last body")
        connection = self._connection
        if connection.gone:
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        headers = self._headers
        if not more:
            self._complete = True
            self.disconnect()
        if headers is not None:
            self._headers = None
            if not more:
                connection.reply(self._status, headers, body)  # the whole response at once: one write
                return
            connection.start_response(self._status, headers)
        connection.send_body(body, more)
        if more:
            await connection.drain()


class Lifespan:
    """Runs an ASGI app's lifespan protocol: startup before serving, shutdown after."""

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
