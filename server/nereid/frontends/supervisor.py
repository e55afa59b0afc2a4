"""FrontEnds: the main process's front-end workers, started, watched, restarted and
stopped.

Owns the listening sockets (one per worker with SO_REUSEPORT, so the kernel spreads
connections over the workers; one shared socket when the server is handed a descriptor or
the system has no SO_REUSEPORT), each worker's process, arena and link. The sockets stay
open in the main process for the server's life: a worker that dies is replaced on the
same socket, and connections that arrive meanwhile wait in its backlog.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nereid
from nereid.frontends.arena import Arena
from nereid.frontends.directory_sync import DirectoryPublisher, SharedGeneration
from nereid.frontends.link import WorkerLink
from nereid.frontends.messages import Kind
from nereid.frontends.shared_limits import SharedLimits
from nereid.frontends.shared_stats import StatsPublisher, StatsTable
from nereid.http.app import NereidApp
from nereid.network.listening import listen
from nereid.network.tls import TlsFiles
from nereid.options import ServerOptions

__all__ = ["FrontEnds"]

_log = logging.getLogger("nereid")

_WORKER_COMMAND = "from nereid.frontends.worker import main; main()"
#: restart delays of a worker that keeps dying at once (seconds), the last one repeated
_BACKOFF = (0.0, 0.1, 0.5, 1.0, 2.0, 5.0)
#: a worker that lived this long before dying is restarted at once again
_HEALTHY_AFTER_S = 10.0


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process
    link: WorkerLink
    arena: Arena
    started: float
    #: a reload (SIGHUP) asked for before the worker was armed, passed on once it is
    reload_when_armed: bool = False


class FrontEnds:
    """``count`` front-end worker processes serving HTTP for ``app`` (the main process's
    app, whose lifespan ``state`` forwarded requests see). ``await start()`` binds and
    starts them (raises StartupError when the port cannot be bound); ``await stop()``
    lets them drain and waits for them (killing those past ``exit_timeout_secs``).
    ``tls``: they serve HTTPS with these settings (each worker reads the files).
    ``statistics``: the workers answer statistics themselves (shared_stats.py); only when
    every answer leaves through them (not when this process serves the gRPC port)."""

    def __init__(
        self, app: NereidApp, options: ServerOptions, state: dict[str, Any], count: int, limits: SharedLimits,
        tls: TlsFiles | None = None,
        grpc_server: Any = None,
        statistics: bool = False,
    ) -> None:
        self.app = app
        #: the main process's NativeGrpcServer (listening on no port) when the workers
        #: serve gRPC too: their relayed calls go into it (grpc_link.py)
        self.grpc_server = grpc_server
        self._grpc_sockets: list[socket.socket] = []
        self.options = options
        self.count = count
        self.tls = tls
        #: the connection and request-bytes rows: one per worker (its index), the main
        #: process's last
        self.limits = limits
        self._state = state
        self._sockets: list[socket.socket] = []
        self._workers: dict[int, _Worker] = {}
        self._failures: dict[int, int] = {}
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        #: requests that came through workers that have since been replaced
        self._past_requests = [0] * count
        #: what the models show, kept in every worker (health, metadata, config)
        self._generation = SharedGeneration.create()
        manager = app.endpoints.manager
        #: every served version's statistics, kept in shared memory for the workers
        self.statistics = StatsPublisher(manager, StatsTable.create()) if statistics else None
        self.directory = DirectoryPublisher(
            manager, self._generation, self.statistics.sync if self.statistics is not None else None)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def grpc_address(self) -> tuple[str, int] | None:
        """Where the workers serve gRPC (None: they do not)."""
        if not self._grpc_sockets:
            return None
        host, port = self._grpc_sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers.values()]

    def requests(self) -> list[int]:
        """Requests each worker slot has passed on (over its restarts)."""
        return [self._past_requests[index] + (self._workers[index].link.requests if index in self._workers else 0)
                for index in range(self.count)]

    async def start(self) -> None:
        self._sockets = self._listen()
        self.directory.start()
        if self.grpc_server is not None:
            try:
                self._grpc_sockets = self._listen_grpc()
            except BaseException:
                for sock in self._sockets:
                    sock.close()
                raise
        for index in range(self.count):
            self._workers[index] = await self._spawn(index)
        self._watchers = [asyncio.create_task(self._watch(index), name=f"nereid-http-worker-{index}")
                          for index in range(self.count)]
        if self.statistics is not None:
            self._watchers.append(asyncio.create_task(self.statistics.keep_publishing(), name="nereid-statistics"))

    def _listen(self) -> list[socket.socket]:
        options = self.options
        if options.http_fd is not None:
            return [socket.socket(fileno=os.dup(options.http_fd))]
        if not hasattr(socket, "SO_REUSEPORT"):  # pragma: no cover - Linux has it
            return [listen(options.http_address, options.http_port)]
        first = listen(options.http_address, options.http_port, reuse_port=True)
        port = first.getsockname()[1]  # --http-port 0: the port the first socket got
        return [first] + [listen(options.http_address, port, reuse_port=True) for _ in range(self.count - 1)]

    def _listen_grpc(self) -> list[socket.socket]:
        """The gRPC port's sockets, one per worker (SO_REUSEPORT), as HTTP's."""
        options = self.options
        if not hasattr(socket, "SO_REUSEPORT"):  # pragma: no cover - Linux has it
            return [listen(options.http_address, options.grpc_port, "--grpc-port")]
        first = listen(options.http_address, options.grpc_port, "--grpc-port", reuse_port=True)
        port = first.getsockname()[1]
        return [first] + [listen(options.http_address, port, "--grpc-port", reuse_port=True)
                          for _ in range(self.count - 1)]

    async def _spawn(self, index: int) -> _Worker:
        loop = asyncio.get_running_loop()
        listener = self._sockets[index % len(self._sockets)]
        arena = Arena.create()
        ours, theirs = socket.socketpair()
        fds = (listener.fileno(), theirs.fileno(), arena.fd)
        generation = self._generation.fd
        stats_fd = self.statistics.table.fd if self.statistics is not None else -1
        grpc_fd = self._grpc_sockets[index % len(self._grpc_sockets)].fileno() if self._grpc_sockets else -1
        self.limits.clear(index)  # what a worker before it held went with it
        # the worker imports nereid from where this process did, whatever its sys.path
        package_root = str(Path(nereid.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _WORKER_COMMAND, *(str(fd) for fd in fds), str(arena.size),
                str(self.limits.fd), str(self.limits.rows), str(generation), str(grpc_fd), str(stats_fd),
                pass_fds=(*fds, self.limits.fd, generation, *(fd for fd in (grpc_fd, stats_fd) if fd >= 0)),
                stdin=asyncio.subprocess.DEVNULL, env=env,
            )
        finally:
            theirs.close()
        _, link = await loop.create_unix_connection(lambda: self._link(arena, index), sock=ours)
        link.send((Kind.OPTIONS.value, self.options, index, self.tls))
        self.directory.join(index, link)
        _log.debug("HTTP front-end worker %d started (pid %d)", index, process.pid)
        worker = _Worker(index, process, link, arena, time.monotonic())
        link.on_armed = lambda: self._armed(worker)
        return worker

    def reload_certificates(self) -> None:
        """Every worker reads its server certificate and key again (SIGHUP passed on).
        A worker still starting (its handlers not in place: SIGHUP would end it) is
        signalled once it says it is armed (it may have read the files before now)."""
        for worker in self._workers.values():
            if worker.process.returncode is not None:
                continue
            if worker.link.armed:
                worker.process.send_signal(signal.SIGHUP)
            else:
                worker.reload_when_armed = True

    def _armed(self, worker: _Worker) -> None:
        if worker.reload_when_armed and worker.process.returncode is None:
            worker.reload_when_armed = False
            worker.process.send_signal(signal.SIGHUP)

    def _link(self, arena: Arena, index: int) -> WorkerLink:
        if self.grpc_server is None:
            link = WorkerLink(self.app, arena, self._state, index)
        else:
            from nereid.frontends.grpc_link import GrpcWorkerLink  # gRPC's modules load only when serving gRPC
            link = GrpcWorkerLink(self.app, arena, self._state, index, self.grpc_server)
        if self.statistics is not None:
            link.before_write = self.statistics.publish
        return link

    async def _watch(self, index: int) -> None:
        """Restart worker ``index`` whenever it exits before the server stops."""
        while True:
            worker = self._workers[index]
            status = await worker.process.wait()
            await worker.link.closed
            if self._stopping:
                return
            self._past_requests[index] += worker.link.requests
            lived = time.monotonic() - worker.started
            failures = 0 if lived >= _HEALTHY_AFTER_S else self._failures.get(index, 0) + 1
            self._failures[index] = failures
            delay = _BACKOFF[min(failures, len(_BACKOFF) - 1)]
            _log.error(
                "HTTP front-end worker %d (pid %d) exited with status %d; the requests it held failed; "
                "starting another%s", index, worker.process.pid, status, f" in {delay:g} s" if delay else "",
            )
            worker.arena.close()
            if delay:
                await asyncio.sleep(delay)
            if self._stopping:
                return
            self._workers[index] = await self._spawn(index)

    async def stop(self, timeout: float) -> None:
        """Ask every worker to stop taking connections and finish what it holds; wait for
        them (``timeout`` seconds, then kill); close the sockets."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        workers = list(self._workers.values())
        for worker in workers:
            worker.link.send((Kind.STOP.value,))
        waits = [asyncio.ensure_future(worker.process.wait()) for worker in workers]
        if waits:
            _, late = await asyncio.wait(waits, timeout=timeout + 1.0)
            for worker in workers:
                if worker.process.returncode is None:
                    _log.error("HTTP front-end worker %d (pid %d) did not stop in time; killing it",
                               worker.index, worker.process.pid)
                    worker.process.kill()
            await asyncio.gather(*waits, return_exceptions=True)
        for worker in workers:
            await worker.link.aclose()
            worker.arena.close()
        for sock in self._sockets + self._grpc_sockets:
            sock.close()
        self.directory.close()
        self._generation.close()
        if self.statistics is not None:
            self.statistics.table.close()
        _log.info("HTTP front-end workers stopped; requests through each: %s (decoded there: %s)",
                  ", ".join(str(count) for count in self.requests()),
                  ", ".join(str(worker.link.decoded) for worker in workers))
