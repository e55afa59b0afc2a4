"""GrpcStream: one gRPC call's HTTP/2 stream, its state both ways and what it holds.

A server's stream is opened by the client's HEADERS (``StreamState.OPEN``), becomes
``HALF_CLOSED_REMOTE`` when the client ends its side (END_STREAM), and ``CLOSED`` when
nereid has sent its trailers (a client still sending is then told RST_STREAM NO_ERROR) or
either side reset it (RFC 9113 5.1); ``state is StreamState.CLOSED`` means nothing more
goes out on it. Its answer goes through ``ResponsePhase``: nothing
sent yet, headers sent (messages may follow), trailers queued behind messages the
client's window holds back.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GrpcStream", "StreamState", "ResponsePhase"]


class StreamState(enum.Enum):
    OPEN = "open"
    HALF_CLOSED_REMOTE = "half-closed (remote)"
    CLOSED = "closed"


class ResponsePhase(enum.Enum):
    NOTHING_SENT = "nothing sent"
    HEADERS_SENT = "headers sent"
    TRAILERS_QUEUED = "trailers queued"


@dataclass(eq=False, slots=True)
class GrpcStream:
    """One call's stream: what came in (headers, the message being assembled), what may
    go out (the client's window, bytes waiting for it) and how far each side is. A
    record: the connection's reader and its sender change it."""

    id: int
    headers: dict[bytes, bytes]
    #: what nereid may still send, and what the client may still send
    send_window: int
    recv_window: int
    #: the CallHandler of this stream's call (h2/calls.py), and its state for the stream
    handler: Any = None
    call: Any = None
    #: the timer of the call's grpc-timeout, if it has one
    deadline: asyncio.TimerHandle | None = None
    state: StreamState = StreamState.OPEN
    phase: ResponsePhase = ResponsePhase.NOTHING_SENT
    #: set by the Calls object when it opens a streaming call: each message is then
    #: held (window and budget) until the call takes it (``GrpcConnection.taken``)
    streaming: bool = False
    #: bytes of a message not complete yet; ``expect`` is its declared length once its
    #: prefix is in (charged to the server's budget), -1 before
    inbox: bytearray = field(default_factory=bytearray)
    expect: int = -1
    #: request bytes this stream holds of the server's budget
    held: int = 0
    #: messages of a streaming call handed over and not yet taken
    backlog: int = 0
    #: bytes the client sent that were not yet given back as window
    unacked: int = 0
    #: response messages the windows hold back, their size, and the trailers behind them
    pending: deque[memoryview] = field(default_factory=deque)
    pending_bytes: int = 0
    trailers: bytes | None = None
    #: the request's grpc-encoding (gzip, deflate) when its messages may be compressed
    inflate: str | None = None
    #: set while the stream has nothing queued beyond the client's window
    drained: asyncio.Event | None = None
