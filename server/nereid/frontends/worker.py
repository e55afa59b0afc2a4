"""One front-end worker process: nereid's native HTTP engine on the shared listening
socket, and its native gRPC engine on the gRPC one when the main process passes it, with
infer requests and everything else handed to the main process (forwarding.py,
grpc_front.py). Started and restarted by supervisor.py; runs no model code.

Its command line (supervisor.py writes it): listening socket, link socket and arena file
descriptors, the arena's size, the shared limits' descriptor and row count, and the
shared generation's descriptor (directory_sync.py), the gRPC socket's and the statistics
table's (shared_stats.py; -1: none). The server's options (and its HTTPS
settings, when it serves HTTPS) come as the link's first message; with HTTPS the worker
reads the certificates itself and wraps its connections as the single-process server
does (network/tls.py), and reads them again on SIGHUP (the main process passes its own
SIGHUP on). Health, metadata, config and (with the table) statistics it answers itself
(local_answers.py; gRPC's ModelStatistics: grpc_calls.py). It stops on
STOP (draining its connections), on SIGTERM the same way, and when the main process goes
away; SIGINT is the main process's to handle.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import sys
from typing import Any, cast

from nereid.frontends.arena import Arena
from nereid.frontends.directory_sync import DirectoryCopy, SharedGeneration
from nereid.frontends.forwarding import MainLink, WorkerApp
from nereid.frontends.local_answers import LocalAnswers
from nereid.frontends.messages import Kind
from nereid.frontends.shared_stats import StatisticsCopy, StatsTable
from nereid.frontends.shared_limits import CountedConnections, SharedLimits, SharedRequestBudget
from nereid.http.app import NereidApp
from nereid.http.h1.limits import ConnectionLimits
from nereid.http.h1.server import NativeServer
from nereid.log import configure_logging
from nereid.network.listening import StartupError
from nereid.network.tls import TlsFiles, reload_certificate, server_context
from nereid.options import ServerOptions

__all__ = ["main"]

_log = logging.getLogger("nereid")


class _WorkerServer(NativeServer):
    """The native engine, counting connections against the limit server-wide."""

    shared: SharedLimits

    def open_connections(self) -> int:
        return self.shared.connections()


def main(argv: list[str] | None = None) -> None:
    """The worker's entry point:
    ``main([listen_fd, link_fd, arena_fd, arena_size, limits_fd, limits_rows, generation_fd, grpc_fd, stats_fd])``
    (grpc_fd -1: the main process serves gRPC itself; stats_fd -1: statistics are forwarded to it)."""
    fds = [int(arg) for arg in (argv if argv is not None else sys.argv[1:])]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the main process decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the loop handles it: a reload must not end the worker
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(_serve(*fds))
    else:
        uvloop.run(_serve(*fds))


async def _serve(
    listen_fd: int, link_fd: int, arena_fd: int, arena_size: int, limits_fd: int, rows: int, generation_fd: int,
    grpc_fd: int = -1, stats_fd: int = -1,
) -> None:
    loop = asyncio.get_running_loop()
    arena = Arena.attach(arena_fd, arena_size)
    directory = DirectoryCopy(SharedGeneration.attach(generation_fd))
    statistics = StatisticsCopy(StatsTable.attach(stats_fd), directory) if stats_fd >= 0 else None
    link_type = MainLink
    if grpc_fd >= 0:  # gRPC's modules load only when serving gRPC
        from nereid.frontends.grpc_front import GrpcMainLink
        link_type = GrpcMainLink
    _, link = await loop.create_unix_connection(lambda: link_type(arena, directory), sock=socket.socket(fileno=link_fd))
    options, index, tls_files = await link.options
    assert isinstance(options, ServerOptions)
    configure_logging(
        options.log_verbose, options.log_format, info=options.log_info, warning=options.log_warning,
        error=options.log_error,
    )
    tls = _tls_context(tls_files, index)
    if tls is not None:
        loop.add_signal_handler(signal.SIGHUP, _reload, tls, tls_files, index)
    loop.add_signal_handler(signal.SIGTERM, link.stopped.set)
    link.send((Kind.ARMED.value,))  # the main process may pass SIGHUP on from now
    link.max_json_size = options.http_max_input_size
    restricted = any("inference" in restriction.groups for restriction in options.http_restricted_api)
    app = WorkerApp(link, restricted_inference=restricted, local=LocalAnswers(directory, options, statistics))
    shared = SharedLimits.attach(limits_fd, rows)
    budget = SharedRequestBudget(options.max_request_bytes_in_flight, shared, index)
    server = _WorkerServer(
        # NativeServer uses of its app only what WorkerApp has: match_infer, infer_guard,
        # endpoints.start_infer and the ASGI call
        cast(NereidApp, app), limits=ConnectionLimits.from_options(options), graceful_timeout=options.exit_timeout_secs,
        budget=budget,
    )
    server.shared = shared
    server.connections = CountedConnections(shared, index)
    grpc_server: Any = None
    if grpc_fd >= 0:
        from nereid.frontends.grpc_front import GrpcMainLink, WorkerGrpcServer
        assert isinstance(link, GrpcMainLink)
        grpc_server = WorkerGrpcServer(link, options, budget, shared, index, statistics)
        await grpc_server.start(socket.socket(fileno=grpc_fd))
    _log.debug("HTTP front-end worker %d serving%s", index, " (and gRPC)" if grpc_server is not None else "")
    stopping = asyncio.create_task(_stop_grpc(grpc_server, link.stopped, options)) if grpc_server else None
    try:
        await server.serve(link.stopped, fd=listen_fd, tls=tls)
        if stopping is not None:
            await stopping  # gRPC drains alongside HTTP
    finally:
        if stopping is not None and not stopping.done():
            stopping.cancel()
            await grpc_server.stop(0)
        socket.socket(fileno=listen_fd).close()
    answered = app.local.answered if app.local is not None else 0
    _log.debug("HTTP front-end worker %d stopped (%d requests answered here)", index, answered)


def _tls_context(files: TlsFiles | None, index: int) -> ssl.SSLContext | None:
    """The HTTPS context of ``files`` (None: plain HTTP). The main process read the same
    files a moment ago; a worker that cannot (they changed meanwhile) says so and exits."""
    if files is None:
        return None
    try:
        return server_context(files, ("http/1.1",))
    except StartupError as exc:
        _log.error("HTTP front-end worker %d: TLS: %s", index, exc)
        raise SystemExit(1) from None


def _reload(context: ssl.SSLContext, files: TlsFiles, index: int) -> None:
    """SIGHUP: read the server certificate and key again (Server.reload_certificates'
    rule: a pair that cannot be used is logged, the old one kept)."""
    try:
        reload_certificate(context, files)
    except StartupError as exc:
        _log.error("HTTP front-end worker %d: TLS: %s; still serving the certificate read before", index, exc)
    else:
        _log.info("HTTP front-end worker %d: TLS: %s-server-cert and %s-server-key read again", index,
                   files.prefix, files.prefix)


async def _stop_grpc(server: Any, stopped: asyncio.Event, options: ServerOptions) -> None:
    """gRPC stops taking calls with HTTP and lets those in flight finish."""
    await stopped.wait()
    await server.stop(options.exit_timeout_secs)
