"""Sender: what goes out on one gRPC connection.

Frames are gathered while the loop runs its callbacks and written once, when it goes back
to the socket, so the answers of one batch leave in one send. Answers are cut to the
client's windows (its connection's and each stream's) and to the largest frame it allows;
a stream with bytes the windows hold back waits in ``blocked`` until a WINDOW_UPDATE or a
SETTINGS change lets them out. A stream's trailers follow its last message; writing them
closes the stream (``stream_done``, the connection's). Frame headers are packed here with
precompiled structs: an answer's HEADERS, DATA header and message prefix are one ``pack``.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Callable

from nereid.grpc.h2.frames import (
    DEFAULT_WINDOW, FRAME_HEADER, MESSAGE_PREFIX, MIN_MAX_FRAME, RESPONSE_HEAD, TRAILERS_OK, Flag, FrameType, frame, literal,
    percent_encoded,
)
from nereid.grpc.h2.stream import GrpcStream, ResponsePhase, StreamState

__all__ = ["Sender"]

# plain ints: IntEnum's and IntFlag's | run in Python
_DATA, _HEADERS, _CONTINUATION = int(FrameType.DATA), int(FrameType.HEADERS), int(FrameType.CONTINUATION)
_END_STREAM, _END_HEADERS = int(Flag.END_STREAM), int(Flag.END_HEADERS)
_STATUS_OK = 0
_HEAD_SIZE, _TRAILERS_SIZE = len(RESPONSE_HEAD), len(TRAILERS_OK)
#: an answer's start: the HEADERS frame of ``RESPONSE_HEAD``, then the DATA frame header
#: and the gRPC message prefix of its one message
_ANSWER_START = struct.Struct(f">BHBBL{_HEAD_SIZE}sBHBBLBL")
#: the HEADERS frame of ``TRAILERS_OK`` (status OK, end of stream)
_ANSWER_END = struct.Struct(f">BHBBL{_TRAILERS_SIZE}s")
_pack_frame_header = FRAME_HEADER.pack


class Sender:
    """The sending half of a connection: its write buffer, the client's windows and frame
    size, the streams waiting for window."""

    __slots__ = ("_transport", "_schedule", "_out", "_stream_done", "send_window", "peer_stream_window",
                 "peer_max_frame", "blocked", "sent")

    def __init__(self, schedule: Callable[[Callable[[], None]], Any] | None, stream_done: Callable[[GrpcStream], None]) -> None:
        self._transport: Any = None
        self._schedule = schedule
        #: bytes to send once the loop's current callbacks are done (None: nothing waits)
        self._out: list[bytes] | None = None
        self._stream_done = stream_done
        self.send_window = DEFAULT_WINDOW
        self.peer_stream_window = DEFAULT_WINDOW
        self.peer_max_frame = MIN_MAX_FRAME
        self.blocked: dict[int, GrpcStream] = {}
        #: responses begun (HEADERS or DATA out): a PING policy counts pings between them
        self.sent = 0

    def attach(self, transport: Any) -> None:
        self._transport = transport
        if self._schedule is None:
            self._schedule = asyncio.get_running_loop().call_soon

    def write(self, data: bytes) -> None:
        """Send ``data`` with everything else written before the loop goes back to the
        socket: the answers of one batch leave in one send, not one each."""
        out = self._out
        if out is None:
            self._out = [data]
            self._schedule(self.send_out)  # type: ignore[misc]
        else:
            out.append(data)

    def send_out(self) -> None:
        out, self._out = self._out, None
        if out and not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        """Answer a call with one message and status OK: one write when the message fits
        the windows and one of the client's frames, as an infer answer usually does."""
        if stream.state is StreamState.CLOSED:
            return
        self.sent += 1
        size = len(message) + 5
        if (
            stream.phase is ResponsePhase.NOTHING_SENT and size <= self.peer_max_frame
            and size <= stream.send_window and size <= self.send_window
        ):
            self.send_window -= size
            stream_id = stream.id
            self.write(b"".join((
                _ANSWER_START.pack(
                    0, _HEAD_SIZE, _HEADERS, _END_HEADERS, stream_id, RESPONSE_HEAD,
                    size >> 16, size & 0xFFFF, _DATA, 0, stream_id, 0, size - 5,
                ),
                message,
                _ANSWER_END.pack(0, _TRAILERS_SIZE, _HEADERS, _END_HEADERS | _END_STREAM, stream_id, TRAILERS_OK),
            )))
            self._stream_done(stream)
            return
        self.send_message(stream, message)
        self.finish(stream, _STATUS_OK, "")

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        """Queue one response message (sent as the client's window allows)."""
        if stream.state is StreamState.CLOSED or stream.phase is ResponsePhase.TRAILERS_QUEUED:
            return
        self.sent += 1
        if stream.phase is ResponsePhase.NOTHING_SENT:
            stream.phase = ResponsePhase.HEADERS_SENT
            self.write(frame(_HEADERS, _END_HEADERS, stream.id, RESPONSE_HEAD))
        stream.pending.append(memoryview(MESSAGE_PREFIX.pack(0, len(message)) + message))
        stream.pending_bytes += len(message) + 5
        self.flush(stream)

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        """End the call with its status (after the messages queued before it)."""
        if stream.state is StreamState.CLOSED or stream.phase is ResponsePhase.TRAILERS_QUEUED:
            return
        block = literal(b"grpc-status", str(status).encode())
        if message:
            block += literal(b"grpc-message", percent_encoded(message))
        if stream.phase is ResponsePhase.NOTHING_SENT:  # trailers-only
            block = RESPONSE_HEAD + block
        stream.phase = ResponsePhase.TRAILERS_QUEUED
        stream.trailers = block
        self.flush(stream)

    @staticmethod
    async def writable(stream: GrpcStream, high_water: int) -> None:
        """Wait while the stream holds more than ``high_water`` bytes the client has not let
        it send (a streaming writer's back-pressure)."""
        while stream.pending_bytes > high_water and stream.state is not StreamState.CLOSED:
            if stream.drained is None:
                stream.drained = asyncio.Event()
            stream.drained.clear()
            await stream.drained.wait()

    def flush(self, stream: GrpcStream) -> None:
        """Send what the windows allow of the stream's messages, then its trailers."""
        pending = stream.pending
        write = self.write
        max_frame = self.peer_max_frame
        while pending:
            allowed = min(stream.send_window, self.send_window, max_frame)
            if allowed <= 0:
                self.blocked[stream.id] = stream
                return
            chunk = pending[0]
            size = min(allowed, len(chunk))
            write(_pack_frame_header(size >> 16, size & 0xFFFF, _DATA, 0, stream.id) + chunk[:size])
            if size == len(chunk):
                pending.popleft()
            else:
                pending[0] = chunk[size:]
            stream.send_window -= size
            self.send_window -= size
            stream.pending_bytes -= size
        self.blocked.pop(stream.id, None)
        if stream.drained is not None:
            stream.drained.set()
        if stream.trailers is not None:
            self._write_header_block(stream.id, _END_STREAM, stream.trailers)
            self._stream_done(stream)

    def flush_blocked(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                return
            self.flush(stream)

    def _write_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        max_frame = self.peer_max_frame
        if len(block) <= max_frame:
            self.write(frame(_HEADERS, flags | _END_HEADERS, stream_id, block))
            return
        parts = [frame(_HEADERS, flags, stream_id, block[:max_frame])]
        for offset in range(max_frame, len(block), max_frame):
            last = offset + max_frame >= len(block)
            parts.append(frame(_CONTINUATION, _END_HEADERS if last else 0, stream_id, block[offset:offset + max_frame]))
        self.write(b"".join(parts))
