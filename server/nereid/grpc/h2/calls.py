"""Calls, CallHandler and Status: what a ``GrpcConnection`` tells the application about
its calls (``native.NativeGrpcServer`` is the Calls), and the gRPC status codes it
answers with.

Each stream's call goes to one CallHandler, chosen by the connection when the stream
opens: the handler of its ``:path`` in ``Calls.routes`` (a table the application builds
once), else the Calls object itself, which may hand the stream to another handler in
``open`` (``stream.handler``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from nereid.grpc.h2.limits import TransportLimits
from nereid.grpc.h2.stream import GrpcStream
from nereid.network.request_budget import RequestBudget

if TYPE_CHECKING:
    from nereid.grpc.h2.connection import GrpcConnection
    from nereid.grpc.h2.control import PingPolicy

__all__ = ["CallHandler", "Calls", "Status"]


class Status:
    """gRPC status codes used here (grpc.StatusCode's numbers)."""

    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
    RESOURCE_EXHAUSTED, INTERNAL, UNIMPLEMENTED, UNAVAILABLE = 8, 13, 12, 14


class CallHandler(Protocol):
    """What a connection tells about one stream's call: it opened (its headers are in),
    a message came, the client ended its side, the call is reset (by the client, by the
    transport, or past its grpc-timeout). The answer goes back through the connection's
    ``respond``, ``send_message`` and ``finish``."""

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None: ...
    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...


class Calls(CallHandler, Protocol):
    """The application behind a server's connections (``native.NativeGrpcServer``): the
    handler of the calls no route takes, the routes, and the server-wide settings, budget
    and coarse clock a connection reads."""

    max_message_size: int
    pings: PingPolicy
    limits: TransportLimits
    budget: RequestBudget
    now: float

    @property
    def routes(self) -> Mapping[bytes, CallHandler]:
        """The handler of each ``:path`` routed straight to it, without the Calls object."""

    def closed(self, connection: GrpcConnection) -> None: ...
    def offload(self, work: Callable[[], bytes | BaseException], done: Callable[[bytes | BaseException], None]) -> None:
        """Run ``work`` off the loop, then ``done`` with its result on the loop."""
