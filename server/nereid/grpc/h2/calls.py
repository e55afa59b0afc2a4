"""Calls and Status: what a ``GrpcConnection`` tells the application about its calls
(``native.NativeGrpcServer`` is one), and the gRPC status codes it answers with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from nereid.grpc.h2.control import PingPolicy
from nereid.grpc.h2.limits import TransportLimits
from nereid.grpc.h2.stream import GrpcStream
from nereid.network.request_budget import RequestBudget

if TYPE_CHECKING:
    from nereid.grpc.h2.connection import GrpcConnection

__all__ = ["Calls", "Status"]


class Status:
    """gRPC status codes used here (grpc.StatusCode's numbers)."""

    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
    RESOURCE_EXHAUSTED, INTERNAL, UNIMPLEMENTED, UNAVAILABLE = 8, 13, 12, 14


class Calls(Protocol):
    """What a connection tells about its calls (``native.NativeGrpcServer``), and the
    server-wide settings, budget and coarse clock it reads."""

    max_message_size: int
    pings: PingPolicy
    limits: TransportLimits
    budget: RequestBudget
    now: float

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None: ...
    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def closed(self, connection: GrpcConnection) -> None: ...
    def offload(self, work: Callable[[], bytes | BaseException], done: Callable[[bytes | BaseException], None]) -> None:
        """Run ``work`` off the loop, then ``done`` with its result on the loop."""
