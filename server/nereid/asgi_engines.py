"""The ASGI engines nereid can serve its HTTP app on besides its own (``--http-server``
uvicorn, hypercorn or granian): each configured from ServerOptions with the limits it has
(README, "Limits on other engines"), run until a shutdown event. Only ``server.py`` calls
these; the engines' libraries are imported here, lazily, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from typing import Any, Iterator

from nereid.network.tls import TlsFiles
from nereid.options import ServerOptions

__all__ = ["serve_granian", "serve_hypercorn", "serve_uvicorn"]


async def serve_uvicorn(
    app: Any, fd: int | None, options: ServerOptions, tls: TlsFiles | None, shutdown: asyncio.Event
) -> None:
    """uvicorn on the listening socket ``fd`` until ``shutdown`` is set."""
    import uvicorn

    assert fd is not None
    config = uvicorn.Config(
        app,
        fd=fd,
        http=_coalescing_httptools_protocol(),
        loop="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        proxy_headers=False,  # nereid is not behind a proxy by default; saves a layer per request
        timeout_graceful_shutdown=int(options.exit_timeout_secs),
        # the limits uvicorn has (README, "Limits on other engines")
        timeout_keep_alive=max(1, math.ceil(options.http_keepalive_timeout_secs)),
        limit_concurrency=options.http_max_connections,
        **_uvicorn_tls(tls),
    )
    server = _quiet_uvicorn(config)
    watcher = asyncio.create_task(shutdown.wait())
    serving = asyncio.create_task(server.serve())
    await asyncio.wait({watcher, serving}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    watcher.cancel()


async def serve_hypercorn(
    app: Any, fd: int | None, options: ServerOptions, tls: TlsFiles | None, shutdown: asyncio.Event
) -> None:
    """hypercorn on the listening socket ``fd`` until ``shutdown`` is set."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("nereid.hypercorn")
    config.graceful_timeout = options.exit_timeout_secs
    config.include_server_header = False
    # the limits hypercorn has (README, "Limits on other engines")
    config.keep_alive_timeout = options.http_keepalive_timeout_secs
    config.h11_max_incomplete_size = options.http_max_header_size
    config.read_timeout = math.ceil(options.http_body_timeout_secs)
    if tls is not None:
        config.certfile = str(tls.cert)
        config.keyfile = str(tls.key)
        if tls.root is not None:
            config.ca_certs = str(tls.root)
        if tls.mutual:
            config.verify_mode = ssl.CERT_REQUIRED
    await serve(app, config, shutdown_trigger=shutdown.wait)


async def serve_granian(app: Any, options: ServerOptions, tls: TlsFiles | None, shutdown: asyncio.Event) -> None:
    """granian on --http-address:--http-port (it binds by address only) until ``shutdown`` is set."""
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server as GranianServer

    if options.http_fd is not None:
        raise ValueError("--http-server granian cannot serve on a file descriptor; give --http-port")
    server = GranianServer(
        app,
        address=options.http_address,
        port=options.http_port,
        interface=Interfaces.ASGI,
        log_level=LogLevels.warning,
        websockets=False,
        **_granian_tls(tls),
    )
    serving = asyncio.create_task(server.serve())
    watcher = asyncio.create_task(shutdown.wait())
    await asyncio.wait({watcher, serving}, return_when=asyncio.FIRST_COMPLETED)
    if not serving.done():
        server.stop()  # type: ignore[no-untyped-call]
        await serving
    watcher.cancel()


def _uvicorn_tls(tls: TlsFiles | None) -> dict[str, Any]:
    if tls is None:
        return {}
    settings: dict[str, Any] = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.root is not None:
        settings["ssl_ca_certs"] = str(tls.root)
    if tls.mutual:
        settings["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return settings


def _granian_tls(tls: TlsFiles | None) -> dict[str, Any]:
    if tls is None:
        return {}
    settings: dict[str, Any] = {"ssl_cert": tls.cert, "ssl_key": tls.key}
    if tls.root is not None:
        settings["ssl_ca"] = tls.root
    if tls.mutual:
        settings["ssl_client_verify"] = True
    return settings


def _quiet_uvicorn(config: Any) -> Any:
    """A uvicorn.Server without its own signal handling (nereid owns the signals)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return _Server(config)


class _CoalescingTransport:
    """Wraps a socket transport so that the writes made in one event-loop iteration go
    out in one ``write`` (one syscall, one TCP segment).

    uvicorn writes a response's status line and headers, then its body, in two calls; on
    loopback each send runs the receiver's network stack on the sender's CPU, and the two
    writes were 40% of the server's time per request (py-spy, identity model, c=16).
    Everything else is delegated; ``close()`` flushes first.
    """

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending = self._pending
        if pending:
            self._pending = []
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _coalescing_httptools_protocol() -> type:
    """uvicorn's httptools protocol with coalesced response writes."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _Protocol(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:  # uvloop's transports are not asyncio.Transport subclasses
            super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]

    return _Protocol
