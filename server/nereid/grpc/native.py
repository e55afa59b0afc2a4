"""NativeGrpcServer: the InferenceService on nereid's own gRPC transport (``h2/``).

Owns the listening socket, the calls of every connection and graceful shutdown, and
routes each call by its ``:path`` to the service's method. The routes table, built here
once, sends ModelInfer (unless its group is restricted) straight from the connection to
``infer.ModelInferCalls``: from the bytes received to the batcher, and its answer back
through ``GrpcConnection.respond``, with no task, Future or context per call and without
coming through here. Every other unary RPC runs its coroutine in a task with an
``AbortContext``, and ModelStreamInfer runs the service's generator over the messages as
they arrive. The message size limit and the keep-alive PINGs of tritonserver's flags
apply here (``grpc-timeout`` deadlines, in the transport). ``--grpc-server grpcio`` serves the same service on
grpcio's server instead (``grpcio_server.GrpcServer``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from nereid.network.access import Refusals, Restriction, restriction_table
from nereid.errors import NereidError
from nereid.grpc.infer import ModelInferCalls
from nereid.grpc.service import METHOD_GROUPS, AbortContext, CallAborted, InferenceService
from nereid.grpc.h2.limits import TransportLimits
from nereid.grpc.h2.calls import CallHandler
from nereid.grpc.h2.connection import GrpcConnection, GrpcStream, Keepalive, PingPolicy, Status
from nereid.grpc.h2.stream import StreamState
from nereid.network.connections import ConnectionRefusals, drain
from nereid.network.listening import listen
from nereid.options import ServerOptions
from nereid.network.request_budget import RequestBudget

__all__ = ["NativeGrpcServer"]

_log = logging.getLogger("nereid")

_SERVICE = "inference.GRPCInferenceService"
_SWEEP_S = 1.0


class _Method:
    """One RPC: its request type, the service's implementation, the handler of its calls
    (None: the server's own) and, when its group is restricted
    (--grpc-restricted-protocol), the restriction and its metadata key."""

    __slots__ = ("name", "request_type", "implementation", "streaming", "group", "restriction", "key", "handler")

    def __init__(
        self, name: str, request_type: Any, implementation: Any, streaming: bool, restriction: Restriction | None,
        handler: CallHandler | None = None,
    ) -> None:
        self.handler = handler
        self.name = name
        self.request_type = request_type
        self.implementation = implementation
        self.streaming = streaming
        self.group = METHOD_GROUPS[name]
        self.restriction = restriction
        self.key = restriction.name.encode("latin-1") if restriction is not None else b""


class _TlsConnection(GrpcConnection):
    """A connection over TLS: the server counts it (and sweeps it) once its TLS handshake
    is done, so one whose handshake fails or times out (the loop drops it without telling
    the protocol) is never left behind in ``connections``."""

    def __init__(self, server: NativeGrpcServer, refusal: str | None) -> None:
        super().__init__(server, refusal=refusal)
        self._server = server

    def connection_made(self, transport: Any) -> None:
        self._server.connections.add(self)
        super().connection_made(transport)


class _Call:
    """One stream's call: its method, the request (unary) or the queue of requests
    (streaming), and the task that runs it."""

    __slots__ = ("method", "request", "requests", "running")

    def __init__(self, method: _Method) -> None:
        self.method = method
        self.request: bytes | None = None
        self.requests: asyncio.Queue[bytes | None] | None = None
        self.running: asyncio.Task[None] | None = None


class NativeGrpcServer:
    """The gRPC listener of one nereid server on its event loop (the ``Calls`` of its
    connections)."""

    def __init__(
        self, service: InferenceService, options: ServerOptions, clock: Callable[[], float] = time.monotonic,
        budget: RequestBudget | None = None, tls: ssl.SSLContext | None = None, refusals: Refusals | None = None,
    ) -> None:
        self.service = service
        #: the TLS context (--grpc-use-ssl; ALPN h2), None for plaintext
        self.tls = tls
        #: calls refused for want of a restricted group's key
        self.refusals = refusals if refusals is not None else Refusals()
        self.limits = TransportLimits.from_options(options)
        #: request bytes held, shared with the server's HTTP engine when it passes its own
        self.budget = budget if budget is not None else RequestBudget(options.max_request_bytes_in_flight)
        #: inflates large compressed messages off the loop (two at a time at most)
        self._inflater: ThreadPoolExecutor | None = None
        self.address = options.http_address
        self.requested_port = options.grpc_port
        self.max_message_size = options.grpc_max_message_size
        self.keepalive = Keepalive(
            time=options.grpc_keepalive_time / 1000, timeout=options.grpc_keepalive_timeout / 1000,
            without_calls=options.grpc_keepalive_permit_without_calls,
        )
        self.pings = PingPolicy(
            min_interval=options.grpc_http2_min_recv_ping_interval_without_data / 1000,
            max_strikes=options.grpc_http2_max_ping_strikes,
            without_calls=options.grpc_keepalive_permit_without_calls,
        )
        self.clock = clock
        #: the coarse time connections note when they hear from their client
        self.now = clock()
        self.port: int | None = None
        self.connections: set[GrpcConnection] = set()
        #: connections refused at --grpc-max-connections
        self.refused_connections = ConnectionRefusals(
            "gRPC", "--grpc-max-connections", "GOAWAY", self.limits.max_connections, clock,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        restrictions = restriction_table(options.grpc_restricted_protocol, "--grpc-restricted-protocol")
        self._methods = self._method_table(service, restrictions)
        #: the calls a connection hands straight to their handler (h2/calls.py): those
        #: with a handler of their own, unless restricted (checked in ``open`` first)
        self.routes: dict[bytes, CallHandler] = {
            path: method.handler for path, method in self._methods.items()
            if method.handler is not None and method.restriction is None
        }

    @staticmethod
    def _method_table(service: InferenceService, restrictions: dict[str, Restriction]) -> dict[bytes, _Method]:
        descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers: dict[str, CallHandler] = {"ModelInfer": ModelInferCalls(service.infer)}
        return {
            f"/{_SERVICE}/{method.name}".encode(): _Method(
                method.name, getattr(service_pb2, method.input_type.name), getattr(service, method.name),
                method.server_streaming, restrictions.get(METHOD_GROUPS[method.name]), handlers.get(method.name),
            )
            for method in descriptor.methods
        }

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, sock: socket.socket | None = None) -> int:
        """Listen (on ``sock`` when given: a front-end worker's); the bound port (0 picks
        one). OSError (StartupError) when it cannot be bound."""
        loop = asyncio.get_running_loop()
        if sock is None:
            sock = listen(self.address, self.requested_port, "--grpc-port")
        secure: dict[str, Any] = {}
        if self.tls is not None:
            # The loop does TLS handshakes without blocking: unfinished ones delay nobody,
            # and one not done within the handshake timeout is dropped.
            secure = {"ssl": self.tls, "ssl_handshake_timeout": self.limits.handshake_timeout}
        self._listener = await loop.create_server(self._connection, sock=sock, backlog=2048, **secure)
        self.port = int(sock.getsockname()[1])
        self._sweeper = loop.call_later(_SWEEP_S, self._sweep)
        return self.port

    def open_connections(self) -> int:
        """The connections --grpc-max-connections counts (a front-end worker counts the
        whole server's)."""
        return len(self.connections)

    def _connection(self) -> GrpcConnection:
        refusal = None
        if self.open_connections() >= self.limits.max_connections:
            self.refused_connections.refused()
            refusal = self.refused_connections.message()
        if self.tls is not None:
            return _TlsConnection(self, refusal)  # counted once its handshake is done
        connection = GrpcConnection(self, refusal=refusal)
        self.connections.add(connection)
        return connection

    def offload(self, work: Callable[[], bytes | BaseException], done: Callable[[bytes | BaseException], None]) -> None:
        """Run ``work`` in the inflater's threads, then ``done`` on the loop."""
        if self._inflater is None:
            self._inflater = ThreadPoolExecutor(2, thread_name_prefix="nereid-grpc-inflate")
        future = asyncio.get_running_loop().run_in_executor(self._inflater, work)

        def finished(future: asyncio.Future[bytes | BaseException]) -> None:
            if not future.cancelled():
                done(future.exception() or future.result())

        future.add_done_callback(finished)

    async def stop(self, grace: float) -> None:
        """Stop taking connections and calls (GOAWAY), let calls in flight finish for
        ``grace`` seconds, then close everything."""
        if self._listener is None:
            return
        listener, self._listener = self._listener, None
        listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in list(self.connections):
            connection.go_away()
        await drain(self.connections, grace, force=lambda connection: connection.close(), tasks=self._tasks)
        await listener.wait_closed()
        if self._inflater is not None:
            self._inflater.shutdown(wait=False, cancel_futures=True)

    def _sweep(self) -> None:
        """Move ``now`` and let every connection look at its timers (handshake, stalled
        client, idle, keep-alive PING: ``ConnectionLifecycle.tick``)."""
        self.now = now = self.clock()
        for connection in list(self.connections):
            connection.tick(now, self.keepalive)
        if self._listener is not None:
            self._sweeper = asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep)

    # -- Calls (what connections tell) ---------------------------------------------------

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        headers = stream.headers
        method = self._methods.get(headers.get(b":path", b""))
        if method is None:
            path = headers.get(b":path", b"").decode("latin-1")
            connection.finish(stream, Status.UNIMPLEMENTED, f"Method not found: {path}")
            return
        restriction = method.restriction  # None unless the method's group is restricted
        if restriction is not None and not restriction.allows(headers.get(method.key)):
            self.refusals.count("grpc", method.group)
            connection.finish(stream, Status.UNAVAILABLE, restriction.grpc_message())
            return
        if method.handler is not None:  # a restricted ModelInfer, let through
            stream.handler = method.handler
            method.handler.open(connection, stream)
            return
        call = stream.call = _Call(method)
        if method.streaming:
            stream.streaming = True
            call.requests = asyncio.Queue()
            self._run(connection, stream, self._stream, connection, stream, call)

    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None:
        call: _Call | None = stream.call
        if call is None:
            return
        if call.requests is not None:
            call.requests.put_nowait(data)
        elif call.request is None:
            call.request = data
        else:
            self._fail(connection, stream, Status.UNIMPLEMENTED, "More than one request message in a unary call")

    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: _Call | None = stream.call
        if call is None:
            return
        if call.requests is not None:
            call.requests.put_nowait(None)
            return
        data = call.request
        if data is None:
            self._fail(connection, stream, Status.UNIMPLEMENTED, "No request message in a unary call")
            return
        call.request = None
        try:
            request = call.method.request_type.FromString(data)
        except DecodeError:
            self._fail(connection, stream, Status.INTERNAL, "Unable to parse request")
            return
        self._run(connection, stream, self._unary, connection, stream, call, request)

    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None:
        call: _Call | None = stream.call
        if call is None:
            return
        stream.call = None
        running = call.running
        if running is not None:
            call.running = None
            running.cancel()

    def closed(self, connection: GrpcConnection) -> None:
        self.connections.discard(connection)

    # -- running calls -------------------------------------------------------------------

    async def _unary(self, connection: GrpcConnection, stream: GrpcStream, call: _Call, request: Any) -> None:
        try:
            response = await call.method.implementation(request, AbortContext())
        except CallAborted as aborted:
            self._finish(connection, stream, call, aborted.code.value[0], aborted.message)
            return
        if stream.call is call:
            self._done(stream, call)
            connection.respond(stream, response.SerializeToString())

    async def _stream(self, connection: GrpcConnection, stream: GrpcStream, call: _Call) -> None:
        context = AbortContext()
        requests = call.requests
        request_type = call.method.request_type
        assert requests is not None

        async def parsed() -> AsyncIterator[Any]:
            while (data := await requests.get()) is not None:
                connection.taken(stream, len(data))
                try:
                    message = request_type.FromString(data)
                except DecodeError:
                    await context.abort(grpc.StatusCode.INTERNAL, "Unable to parse request")
                yield message

        try:
            async for response in call.method.implementation(parsed(), context):
                if stream.call is not call:
                    return
                connection.send_message(stream, response.SerializeToString())
                await connection.writable(stream)
        except CallAborted:
            pass
        aborted = context.aborted
        if aborted is not None:
            self._finish(connection, stream, call, aborted.code.value[0], aborted.message)
        else:
            self._finish(connection, stream, call, Status.OK, "")

    def _run(self, connection: GrpcConnection, stream: GrpcStream, function: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``function(*args)`` in a task (made inside it: a call reset before the task
        starts leaves no coroutine behind that was never awaited)."""
        task = asyncio.get_running_loop().create_task(self._guarded(connection, stream, function, args))
        call: _Call = stream.call
        if stream.call is call and stream.state is not StreamState.CLOSED:
            call.running = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(
        self, connection: GrpcConnection, stream: GrpcStream, function: Callable[..., Awaitable[None]], args: tuple[Any, ...],
    ) -> None:
        call = stream.call
        try:
            await function(*args)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a bug: the call fails, the server goes on
            _log.exception("gRPC: %s failed", call.method.name if call is not None else "a call")
            self._finish(connection, stream, call, Status.INTERNAL, f"internal error: {exc}")

    def _done(self, stream: GrpcStream, call: _Call) -> None:
        stream.call = None
        call.running = None

    def _finish(self, connection: GrpcConnection, stream: GrpcStream, call: _Call | None, status: int, message: str) -> None:
        if call is not None and stream.call is call:
            self._done(stream, call)
            connection.finish(stream, status, message)

    def _fail(self, connection: GrpcConnection, stream: GrpcStream, status: int, message: str) -> None:
        """End a call that never started running (nothing to cancel)."""
        self._finish(connection, stream, stream.call, status, message)
