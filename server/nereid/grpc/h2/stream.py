"""GrpcStream: one gRPC call's HTTP/2 stream, its state both ways and what it holds.

A server's stream is opened by the client's HEADERS (``StreamState.OPEN``), becomes
``HALF_CLOSED_REMOTE`` when the client ends its side (END_STREAM), and ``CLOSED`` when
nereid has sent its trailers (a client still sending is then told RST_STREAM NO_ERROR) or
either side reset it (RFC 9113 5.1). Its answer goes through ``ResponsePhase``: nothing
sent yet, headers sent (messages may follow), trailers queued behind messages the
client's window holds back.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
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


class GrpcStream:
    """One call's stream: what came in (headers, the message being assembled), what may
    go out (the client's window, bytes waiting for it) and how far each side is."""

    __slots__ = (
        "id", "headers", "call", "state", "phase", "streaming", "inbox", "expect", "held", "backlog",
        "recv_window", "unacked", "send_window", "pending", "pending_bytes", "trailers", "inflate", "drained",
    )

    def __init__(self, stream_id: int, headers: dict[bytes, bytes], send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self.headers = headers
        #: the Calls object's state for this stream
        self.call: Any = None
        self.state = StreamState.OPEN
        self.phase = ResponsePhase.NOTHING_SENT
        #: set by the Calls object when it opens a streaming call: each message is then
        #: held (window and budget) until the call takes it (``GrpcConnection.taken``)
        self.streaming = False
        #: bytes of a message not complete yet; ``expect`` is its declared length once its
        #: prefix is in (charged to the server's budget), -1 before
        self.inbox = bytearray()
        self.expect = -1
        #: request bytes this stream holds of the server's budget
        self.held = 0
        #: messages of a streaming call handed over and not yet taken
        self.backlog = 0
        #: what the client may still send, and what it sent that was not yet given back
        self.recv_window = recv_window
        self.unacked = 0
        self.send_window = send_window
        self.pending: deque[memoryview] = deque()
        self.pending_bytes = 0
        self.trailers: bytes | None = None
        #: the request's grpc-encoding (gzip, deflate) when its messages may be compressed
        self.inflate: str | None = None
        #: set while the stream has nothing queued beyond the client's window
        self.drained: asyncio.Event | None = None

    @property
    def finished(self) -> bool:
        """Nothing more goes out on this stream (answered or reset)."""
        return self.state is StreamState.CLOSED
