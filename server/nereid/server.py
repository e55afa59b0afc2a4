"""Server: the composition root. Builds the ModelManager and the HTTP app, and runs them
on the chosen HTTP engine (nereid's native one, uvicorn, granian or hypercorn) until a
shutdown signal.

The only module that knows the engines. Everything it wires is built here and passed
down: no globals, so two servers can run in one process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
import sys
import time
from typing import TYPE_CHECKING, Any, Sequence

from nereid.asgi_engines import serve_granian, serve_hypercorn, serve_uvicorn
from nereid.network.access import Refusals, restriction_table
from nereid.network.listening import StartupError, fit_open_file_limit, listen, listen_error
from nereid.frontends.shared_limits import SharedLimits, SharedRequestBudget
from nereid.http import create_app
from nereid.http.app import NereidApp
from nereid.local import InProcessServer
from nereid.log import configure_logging
from nereid.metrics import Metrics, MetricsListener
from nereid.models.manager import IndexEntry
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager
from nereid.network.request_budget import RequestBudget
from nereid.network.tls import TlsFiles, reload_certificate, server_context

if TYPE_CHECKING:
    from nereid.frontends import FrontEnds
    from nereid.grpc.native import NativeGrpcServer
    from nereid.grpc.grpcio_server import GrpcServer

__all__ = ["Server", "StartupError", "format_model_table"]

_log = logging.getLogger("nereid")


def format_model_table(entries: list[IndexEntry]) -> str:
    """tritonserver's start-up table: Model | Version | Status (status carries the reason)."""
    rows = [("Model", "Version", "Status")]
    for entry in entries:
        status = entry.state or "UNAVAILABLE"
        if entry.reason and status != "READY":
            status = f"{status}: {entry.reason}"
        rows.append((entry.name, "" if entry.version is None else str(entry.version), status))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for index, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
        if index == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)


class Server(InProcessServer):
    """One nereid server: the in-process server (``infer``, ``stream``, ``with`` /
    ``async with``) plus HTTP.

    ``nereid.Server("model_repository")`` used as a context manager serves Python
    callers only; ``await server.serve()`` (or ``run()``, which also handles SIGINT and
    SIGTERM) serves HTTP until ``server.shutdown()``. ``server.started`` is set once the
    initial model load is done.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | ServerOptions = "model_repository",
        **options: Any,
    ) -> None:
        super().__init__(model_repository, **options)
        options_ = self.options
        _check_workers(options_)
        self.shm = SharedMemoryManager()
        #: with front-end workers: the connections and request bytes each process holds,
        #: for limits held server-wide (None: one process)
        self.shared_limits: SharedLimits | None = None
        #: request bytes held at once over HTTP and gRPC (--max-request-bytes-in-flight)
        self.request_budget = RequestBudget(self.options.max_request_bytes_in_flight)
        if options_.http_server == "native" and options_.http_workers > 1:
            self.shared_limits = SharedLimits.create(options_.http_workers + 1)  # the last row: this process's gRPC
            self.request_budget = SharedRequestBudget(
                options_.max_request_bytes_in_flight, self.shared_limits, options_.http_workers)
        #: requests refused for want of a restricted group's key (counted in /metrics)
        self.refusals = Refusals()
        self.metrics = Metrics(self.manager, self.refusals)
        #: the bound metrics port while serving (None when metrics are off or failed to bind).
        self.metrics_port: int | None = None
        #: the bound gRPC port while serving (None when gRPC is off).
        self.grpc_port: int | None = None
        #: the gRPC server that answers the calls front-end workers relay (--http-workers > 1)
        self._relayed_grpc: Any = None
        self.app: NereidApp = create_app(
            self.manager, options_, on_started=self._on_started, shm=self.shm, refusals=self.refusals
        )
        restriction_table(options_.grpc_restricted_protocol, "--grpc-restricted-protocol")  # refused now, not at serve()
        #: HTTPS and gRPC TLS settings (None: plaintext); files are read at serve()
        self.http_tls = _tls_files(options_, "http")
        self.grpc_tls = _tls_files(options_, "grpc")
        self._shutdown: asyncio.Event | None = None
        self.started: asyncio.Event | None = None
        #: the TLS contexts nereid's own engines listen with, which SIGHUP reloads
        self._reloadable: list[tuple[TlsFiles, ssl.SSLContext]] = []
        #: the front-end workers while they serve (--http-workers > 1)
        self._frontends: FrontEnds | None = None

    def _on_started(self) -> None:
        table = format_model_table(self.manager.states())
        _log.info("models:\n%s", table)
        ready = self.manager.is_ready(self.options.strict_readiness)
        _log.info("server is %s", "ready" if ready else "NOT ready (a model is unavailable)")
        # What startup made (modules, models) lives as long as the server: out of the
        # collector's sight, full collections stay short (about 20 ms each otherwise,
        # every few seconds under load: perf/README.md, "Garbage collection").
        gc.collect()
        gc.freeze()
        if self.started is not None:
            self.started.set()

    def reload_certificates(self) -> None:
        """Read the server certificates and keys again (SIGHUP): connections made after
        this use them. Only nereid's own engines can (the ASGI engines and grpcio read
        theirs at start); a pair that cannot be used is logged and the old one kept."""
        for files, context in self._reloadable:
            try:
                reload_certificate(context, files)
            except StartupError as exc:
                _log.error("TLS: %s; still serving the certificate read before", exc)
            else:
                _log.info("TLS: %s-server-cert and %s-server-key read again", files.prefix, files.prefix)
        if self._frontends is not None and self.http_tls is not None:
            self._frontends.reload_certificates()  # each reads them, as this process just did
        reloaded = [files for files, _ in self._reloadable]
        for settings in (self.http_tls, self.grpc_tls):
            if settings is not None and settings not in reloaded:
                _log.warning("TLS: %s certificates are read at start only by this engine (restart to replace them)",
                             settings.prefix)

    def shutdown(self) -> None:
        """Ask the server to stop (safe to call from a signal handler on the loop)."""
        if self._shutdown is not None and not self._shutdown.is_set():
            self.manager.set_shutdown_deadline(time.monotonic() + self.options.exit_timeout_secs)
            self._shutdown.set()

    async def serve(self) -> None:
        """Serve until shutdown(); then drain and unload the models. Raises StartupError
        when the HTTP port cannot be bound (before any model loads)."""
        self._shutdown = asyncio.Event()
        self.started = asyncio.Event()
        self.bind_bls()  # Triton models calling other models
        options = self.options
        engine = options.http_server
        if engine not in ("native", "uvicorn", "hypercorn", "granian"):
            raise ValueError(f"unknown HTTP server {engine!r} (expected native, uvicorn, granian or hypercorn)")
        http_tls, grpc_tls = self._read_certificates()
        listener, fd, where = _http_listener(options)
        fit_open_file_limit(options.http_max_connections)
        if where:
            _log.info(
                "nereid serving %s on %s (HTTP engine: %s%s)", _folders(options), where, engine,
                ", HTTPS" if http_tls is not None else "",
            )
        grpc_server = await self._start_grpc(grpc_tls)
        metrics = await self._start_metrics()
        stopping = asyncio.create_task(self._stop_grpc_on_shutdown(grpc_server))
        try:
            if engine == "native" and options.http_workers > 1:
                await self._serve_workers()
            elif engine == "native":
                await self._serve_native(fd, http_tls)
            elif engine == "uvicorn":
                await serve_uvicorn(self.app, fd, options, self.http_tls, self._shutdown)
            elif engine == "hypercorn":
                await serve_hypercorn(self.app, fd, options, self.http_tls, self._shutdown)
            else:
                await serve_granian(self.app, options, self.http_tls, self._shutdown)
        finally:
            stopping.cancel()
            if grpc_server is not None:
                await grpc_server.stop(0)
                self.grpc_port = None
            if listener is not None:
                listener.close()
            if metrics is not None:
                await metrics.aclose()
                self.metrics_port = None
            self.shm.close()
        _log.info("nereid stopped")

    def _read_certificates(self) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
        """The HTTP and gRPC TLS contexts (None: plaintext), read once, here: a bad
        certificate stops the server before any port is bound. Those nereid's own engines
        listen with are kept for SIGHUP's reload."""
        options = self.options
        http_tls = server_context(self.http_tls, ("http/1.1",)) if self.http_tls is not None else None
        grpc_tls = server_context(self.grpc_tls, ("h2",)) if self.grpc_tls is not None else None
        self._reloadable = []
        if self.http_tls is not None and http_tls is not None and options.http_server == "native":
            self._reloadable.append((self.http_tls, http_tls))
        if self.grpc_tls is not None and grpc_tls is not None and options.grpc_server == "native" and options.allow_grpc:
            self._reloadable.append((self.grpc_tls, grpc_tls))
        return http_tls, grpc_tls

    async def _start_grpc(self, tls: ssl.SSLContext | None) -> GrpcServer | NativeGrpcServer | None:
        """gRPC on --grpc-port (same address as HTTP), bound before any model loads; a
        port that cannot be bound stops the server with one line, as for HTTP. ``tls``:
        over TLS (--grpc-use-ssl)."""
        options = self.options
        if not options.allow_grpc:
            return None
        from nereid.grpc.native import NativeGrpcServer  # gRPC's modules load only when serving gRPC
        from nereid.grpc.grpcio_server import GrpcServer
        from nereid.grpc.service import InferenceService

        service = InferenceService(self.manager, options, self.shm)
        server: GrpcServer | NativeGrpcServer
        if options.grpc_server == "grpcio":
            server = GrpcServer(service, options, tls=self.grpc_tls if tls is not None else None, refusals=self.refusals)
        else:
            server = NativeGrpcServer(service, options, budget=self.request_budget, tls=tls, refusals=self.refusals)
            if options.http_server == "native" and options.http_workers > 1 and tls is None:
                # the front-end workers serve the port; this server answers what they relay
                self._relayed_grpc = server
                return server
        try:
            self.grpc_port = await server.start()
        except StartupError as exc:
            raise StartupError(f"{exc} (or --allow-grpc false)") from exc
        except OSError as exc:
            raise StartupError(f"{exc} (another server is running there? choose another --grpc-port, or --allow-grpc false)") from exc
        _log.info("gRPC on %s:%d%s", options.http_address, self.grpc_port, " (TLS)" if tls is not None else "")
        return server

    async def _stop_grpc_on_shutdown(self, server: GrpcServer | NativeGrpcServer | None) -> None:
        """At shutdown, gRPC stops taking calls and lets those in flight finish (up to
        --exit-timeout-secs), alongside HTTP's drain."""
        if server is None or self._shutdown is None:
            return
        await self._shutdown.wait()
        await server.stop(self.options.exit_timeout_secs)

    async def _start_metrics(self) -> MetricsListener | None:
        """The metrics port on this event loop (same address as HTTP). A port that cannot
        be bound is logged and skipped rather than fatal: HTTP serving matters more."""
        options = self.options
        if not options.allow_metrics:
            return None
        listener = MetricsListener(self.metrics.render, options.metrics_restricted_api, self.refusals)
        try:
            await listener.start(options.http_address, options.metrics_port)
        except OSError as exc:
            _log.error(
                "metrics: cannot listen on %s:%d (%s); serving without metrics "
                "(choose another --metrics-port, or --allow-metrics false)",
                options.http_address, options.metrics_port, exc.strerror or exc,
            )
            return None
        self.metrics_port = listener.port
        _log.info("metrics on http://%s:%d/metrics", options.http_address, listener.port)
        return listener

    async def _serve_native(self, fd: int | None, tls: ssl.SSLContext | None) -> None:
        from nereid.http.h1.limits import ConnectionLimits
        from nereid.http.h1.server import NativeServer

        options = self.options
        server = NativeServer(
            self.app, limits=ConnectionLimits.from_options(options), graceful_timeout=options.exit_timeout_secs,
            budget=self.request_budget,
        )
        assert self._shutdown is not None
        where = f"fd {fd}" if fd is not None else f"{options.http_address}:{options.http_port}"

        bound = False

        def listening(listener: asyncio.AbstractServer) -> None:
            nonlocal bound
            bound = True
            if fd is None:  # the port actually bound (0 picks one)
                host, port = list(listener.sockets)[0].getsockname()[:2]  # type: ignore[attr-defined]
                _log.info(
                    "nereid serving %s on %s:%d (HTTP engine: native%s)", _folders(options), host, port,
                    ", HTTPS" if tls is not None else "",
                )

        try:
            await server.serve(
                self._shutdown, host=options.http_address, port=options.http_port, fd=fd, on_listening=listening,
                tls=tls,
            )
        except OSError as exc:
            if not bound:  # a busy port, a bad address: one line, before any model loads
                raise listen_error(where, exc) from exc
            raise

    async def _serve_workers(self) -> None:
        """HTTP served by --http-workers front-end processes (frontends/): this process
        keeps the models and answers what the workers hand over."""
        from nereid.frontends import FrontEnds
        from nereid.http.h1.asgi_bridge import Lifespan

        options = self.options
        assert self._shutdown is not None
        state: dict[str, Any] = {}
        assert self.shared_limits is not None
        frontends = FrontEnds(
            self.app, options, state, options.http_workers, self.shared_limits, self.http_tls, self._relayed_grpc,
            # statistics answered in the workers only when every answer leaves through them
            statistics=self._relayed_grpc is not None or not options.allow_grpc,
        )
        try:
            await frontends.start()
        except StartupError as exc:
            if self._relayed_grpc is not None and "--grpc-port" in str(exc):
                raise StartupError(f"{exc} (or --allow-grpc false)") from exc
            raise
        except OSError as exc:
            raise listen_error(f"{options.http_address}:{options.http_port}", exc) from exc
        grpc_address = frontends.grpc_address
        if grpc_address is not None:
            self.grpc_port = grpc_address[1]
            _log.info("gRPC on %s:%d (served by the front-end workers)", options.http_address, self.grpc_port)
        host, port = frontends.address
        _log.info("nereid serving %s on %s:%d (HTTP engine: native%s)", _folders(options), host, port,
                  ", HTTPS" if self.http_tls is not None else "")
        _log.info("HTTP served by %d front-end workers (pids %s)", options.http_workers,
                  ", ".join(str(pid) for pid in frontends.pids))
        lifespan = Lifespan(self.app, state)
        self._frontends = frontends
        try:
            await lifespan.startup()
            await self._shutdown.wait()
        finally:
            self._frontends = None
            await frontends.stop(options.exit_timeout_secs)
            await lifespan.shutdown()

    def run(self) -> int:
        """Run in the current thread with uvloop (when installed) until SIGINT/SIGTERM;
        the exit status (1: the port could not be bound). When shutdown had to abandon a
        batch stuck in model code, the process exits here with status 1."""
        options = self.options
        configure_logging(
            options.log_verbose, options.log_format,
            info=options.log_info, warning=options.log_warning, error=options.log_error,
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.shutdown)
            loop.add_signal_handler(signal.SIGHUP, self.reload_certificates)
            await self.serve()

        try:
            try:
                import uvloop
            except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
                asyncio.run(main())
            else:
                uvloop.run(main())
        except StartupError as exc:
            print(f"nereid: {exc}", file=sys.stderr)
            return 1
        if self.manager.abandoned:
            # A thread may still be stuck in model code: exit now rather than let the
            # interpreter's shutdown meet it (nothing else is left to run).
            _log.error("exiting with status 1: work abandoned in %s (see above)", ", ".join(self.manager.abandoned))
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        return 0


def _check_workers(options: ServerOptions) -> None:
    """--http-workers > 1 needs what the workers have: the native engine."""
    if options.http_workers > 1 and options.http_server != "native":
        raise ValueError(f"--http-workers {options.http_workers}: needs --http-server native, got {options.http_server}")


def _folders(options: ServerOptions) -> str:
    """The model repository folders, for the log line."""
    return ", ".join(str(path) for path in options.model_repositories)


def _http_listener(options: ServerOptions) -> tuple[socket.socket | None, int | None, str]:
    """The socket the HTTP engine serves on, if nereid binds it (closed after serving), its
    file descriptor, and where it listens ("": the native engine says so itself)."""
    fd = options.http_fd
    if fd is not None:
        return None, fd, f"fd {fd}"
    if options.http_server == "native":
        # The native engine listens itself (its loop's own socket served faster than one
        # handed over) and says where; this probe makes a busy port one line before
        # anything else starts.
        listen(options.http_address, options.http_port).close()
        return None, None, ""
    listener = listen(options.http_address, options.http_port)
    host, port = listener.getsockname()[:2]
    if options.http_server == "granian":  # binds by address only: hand the port back to it
        listener.close()
        return None, None, f"{host}:{port}"
    return listener, listener.fileno(), f"{host}:{port}"


def _tls_files(options: ServerOptions, protocol: str) -> TlsFiles | None:
    """The TLS settings of ``protocol`` (http or grpc) from its --<protocol>-* flags, None
    for plaintext (mutual TLS implies TLS)."""
    def get(name: str) -> Any:
        return getattr(options, f"{protocol}_{name}")

    if not (get("use_ssl") or get("use_ssl_mutual")):
        return None
    return TlsFiles(f"--{protocol}", get("server_cert"), get("server_key"), get("root_cert"), get("use_ssl_mutual"))
