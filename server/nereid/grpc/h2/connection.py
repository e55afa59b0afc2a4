"""GrpcConnection: gRPC's HTTP/2 on the asyncio loop, one protocol object per socket.

Three layers of one object (RFC 9113 and gRPC's "PROTOCOL-HTTP2"): ``lifecycle``
(state, opening, timers, closing), ``control`` (SETTINGS, WINDOW_UPDATE, PING,
RST_STREAM, GOAWAY and their allowances; calls the transport ends, grpc-timeout
included) and this module: the frames that carry calls.
HEADERS/CONTINUATION open a stream (``headers``), DATA is cut into gRPC's length-prefixed
messages (``compression`` inflates), each charged to the server's ``RequestBudget`` until
its call is answered (one of at most ``SMALL_REQUEST`` bytes is only counted), and the
client's window is given back as they are taken. Each stream's ``CallHandler`` (the
route of its ``:path`` in ``Calls.routes``, else the ``Calls`` object, ``native.py``) is
told ``open``, ``message``, ``end`` and ``reset``, and answers with ``respond`` (one
socket write when the windows allow), ``send_message`` and ``finish``: the Sender's.
grpcio's asyncio server spent about four fifths of nereid's CPU per ModelInfer on its own
per-call machinery (perf/README.md); this one has no task or Future per call.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from nereid.grpc.h2.calls import Calls, Status
from nereid.grpc.h2.compression import INLINE_INFLATE, TooLarge, inflate, inflate_cap
from nereid.grpc.h2.control import ControlFrames, PingPolicy
from nereid.grpc.h2.frames import (
    FRAME_HEADER, MESSAGE_PREFIX, PREFACE, U32, ConnectionFailure, ErrorCode, Flag, FrameType, StreamFailure, frame, unpad,
)
from nereid.grpc.h2.headers import CompressionFailure, HeaderBlocks, MalformedHeaders, PartialBlock
from nereid.grpc.h2.lifecycle import ConnectionState, Keepalive
from nereid.grpc.h2.limits import TransportLimits
from nereid.grpc.h2.stream import GrpcStream, StreamState
from nereid.network.request_budget import SMALL_REQUEST

__all__ = ["Calls", "ConnectionState", "GrpcConnection", "GrpcStream", "Keepalive", "PingPolicy", "Status",
           "MAX_CONCURRENT_STREAMS", "STREAM_HIGH_WATER", "INLINE_INFLATE"]

_log = logging.getLogger("nereid")

_DEFAULT_LIMITS = TransportLimits()
MAX_CONCURRENT_STREAMS = _DEFAULT_LIMITS.max_streams
STREAM_HIGH_WATER = _DEFAULT_LIMITS.stream_high_water

_CONTINUATION, _SETTINGS = int(FrameType.CONTINUATION), int(FrameType.SETTINGS)
# plain ints on the hot path: IntFlag's & and | run in Python
_END_STREAM, _END_HEADERS, _PADDED = int(Flag.END_STREAM), int(Flag.END_HEADERS), int(Flag.PADDED)
_ACK, _PRIORITY_FLAG = int(Flag.ACK), int(Flag.PRIORITY)
#: not a wire flag: a HEADERS frame whose priority names its own stream (a stream error)
_SELF_DEPENDENT = 0x100


class GrpcConnection(ControlFrames):
    """The server side of one HTTP/2 connection carrying gRPC calls. ``refusal``: the
    connection is told GOAWAY with that reason as soon as it opens (a server at its
    connection limit)."""

    def __init__(
        self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None, refusal: str | None = None,
    ) -> None:
        super().__init__(calls, schedule, refusal)
        sender = self._sender
        # the answering methods, bound straight to the Sender's (one call less per answer)
        self.respond = sender.respond
        self.send_message = sender.send_message
        self.finish = sender.finish
        limits = self._limits
        self._buffer = bytearray()
        self._blocks = HeaderBlocks(limits.max_header_list)
        self._routes = calls.routes
        self._header_block: PartialBlock | None = None
        self._recv_window = limits.connection_window
        self._recv_unacked = 0
        #: a stream whose message is inflating off the loop, and whether its frame ended it
        self._inflating: tuple[GrpcStream, bool] | None = None
        #: streams whose client finished sending in the read being handled
        self._ended: list[GrpcStream] = []
        self._handlers: dict[int, Callable[[int, int, bytes], None]] = {
            FrameType.DATA: self._data, FrameType.HEADERS: self._headers, FrameType.CONTINUATION: self._continue,
            FrameType.WINDOW_UPDATE: self._window_update, FrameType.SETTINGS: self._settings,
            FrameType.PING: self._ping, FrameType.RST_STREAM: self._rst_stream, FrameType.GOAWAY: self._goaway,
            FrameType.PUSH_PROMISE: self._push_promise, FrameType.PRIORITY: self._priority,
        }

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = ConnectionState.CLOSED
        streams = list(self.streams.values())
        self.streams.clear()
        self._sender.blocked.clear()
        for stream in streams:
            self._forget(stream)
            stream.handler.reset(self, stream)
        self._calls.closed(self)

    # -- frames in -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_heard = self._calls.now
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            view = data
        try:
            position = self._frames(view)
        except ConnectionFailure as error:
            self._ended.clear()
            self._fail(error.code, error.reason)
            return
        if self._ended:
            self._tell_ended()
        if buffer:
            del buffer[:position]
        elif position < len(view):
            buffer += view[position:]

    def _frames(self, view: bytes | bytearray) -> int:
        """Handle every whole frame in ``view``; the bytes taken."""
        position = 0
        if self.state is ConnectionState.PREFACE:
            if len(view) < len(PREFACE):
                if not PREFACE.startswith(bytes(view)):
                    raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
                return 0
            if view[:len(PREFACE)] != PREFACE:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
            self.state = ConnectionState.SETTINGS
            position = len(PREFACE)
        end = len(view)
        max_frame = self._limits.max_frame
        handlers = self._handlers
        while end - position >= 9 and self._inflating is None and self.state is not ConnectionState.CLOSED:
            high, low, kind, flags, stream_id = FRAME_HEADER.unpack_from(view, position)
            size = high << 16 | low
            if size > max_frame:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, f"frame of {size} bytes exceeds {max_frame}")
            if end - position - 9 < size:
                break
            start = position + 9
            position = start + size
            stream_id &= 0x7FFFFFFF
            if self._header_block is not None and kind != _CONTINUATION:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION")
            if self.state is ConnectionState.SETTINGS and (kind != _SETTINGS or flags & _ACK):
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "the client preface must end with SETTINGS")
            handler = handlers.get(kind)
            if handler is None:
                self._idle_frame("frames of unknown types")
                continue
            try:
                handler(flags, stream_id, bytes(view[start:position]))
            except StreamFailure as error:
                self._stream_error(error.stream_id, error.code)
            except ConnectionFailure:
                raise
            except Exception as exc:  # a bug, in a call's handling or here: that call fails
                self._call_failed(stream_id, exc)
        return position

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self._recv_window:
            raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self._recv_window -= size
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if not size:
                self._idle_frame("empty frames")
            self._give_connection_window(size)
            return  # a stream nereid already closed: its late data is dropped
        if stream.state is not StreamState.OPEN or size > stream.recv_window:
            self._give_connection_window(size)
            code = ErrorCode.STREAM_CLOSED if stream.state is not StreamState.OPEN else ErrorCode.FLOW_CONTROL_ERROR
            raise StreamFailure(stream_id, code)
        stream.recv_window -= size
        stream.unacked += size
        if flags & _PADDED:
            payload = unpad(payload)
        ended = bool(flags & _END_STREAM)
        if payload:
            inbox = stream.inbox
            if not inbox:  # the usual case: whole messages in one frame
                taken = self._messages(stream, payload)
                if taken < len(payload):
                    inbox += memoryview(payload)[taken:]
            else:
                inbox += payload
                del inbox[:self._messages(stream, inbox)]
            if self._inflating is not None:
                self._inflating = (stream, ended)
                return
            self._give_window(stream)
        elif not ended:
            self._idle_frame("empty frames")
        if ended:
            self._remote_end(stream)

    def _remote_end(self, stream: GrpcStream) -> None:
        if stream.state is not StreamState.OPEN:
            return
        stream.state = StreamState.HALF_CLOSED_REMOTE
        if stream.inbox:
            self._calls_error(stream, Status.INTERNAL, "Incomplete gRPC message at the end of the stream")
            return
        self._ended.append(stream)  # told once this read is handled: a reset in it costs nothing

    def _tell_ended(self) -> None:
        """Calls whose client finished sending in the read just handled start now, unless
        the same read reset them (rapid reset then costs no request started and withdrawn)."""
        ended, self._ended = self._ended, []
        for stream in ended:
            if stream.state is StreamState.HALF_CLOSED_REMOTE:
                try:
                    stream.handler.end(self, stream)
                except Exception as exc:
                    self._call_failed(stream.id, exc)

    def _messages(self, stream: GrpcStream, data: bytes | bytearray) -> int:
        """Hand each complete gRPC message in ``data`` to the calls; the bytes taken (the
        rest is an incomplete message, or follows a message inflating off the loop)."""
        position = 0
        end = len(data)
        while end - position >= 5 and stream.state is not StreamState.CLOSED:
            compressed: int
            size: int
            compressed, size = MESSAGE_PREFIX.unpack_from(data, position)
            if stream.expect < 0 or position:
                if not self._admit(stream, compressed, size):
                    return end
                stream.expect = size
            if end - position - 5 < size:
                break
            message = bytes(data[position + 5:position + 5 + size])
            position += 5 + size
            stream.expect = -1
            if not compressed:
                self._deliver(stream, message)
            elif size <= INLINE_INFLATE:
                cap = inflate_cap(self._calls.max_message_size, self._calls.budget)
                self._inflated(stream, inflate(stream.inflate, message, cap))
            else:
                self._inflate_off_loop(stream, message)
                return position
        return position

    def _admit(self, stream: GrpcStream, compressed: int, size: int) -> bool:
        """Charge a message's declared size to the server's budget, or end the call."""
        limit = self._calls.max_message_size
        if size > limit:
            self._calls_error(stream, Status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")
            return False
        if compressed and stream.inflate is None:
            self._calls_error(stream, Status.INTERNAL, "a compressed message without grpc-encoding")
            return False
        return self._charge(stream, size)

    def _charge(self, stream: GrpcStream, size: int) -> bool:
        budget = self._calls.budget
        if size > SMALL_REQUEST and not budget.admits(size):
            self._calls_error(stream, Status.RESOURCE_EXHAUSTED, budget.refusal(size))
            return False
        budget.held += size
        stream.held += size
        return True

    def _deliver(self, stream: GrpcStream, message: bytes) -> None:
        if stream.streaming:
            stream.backlog += 1
        stream.handler.message(self, stream, message)

    def _inflated(self, stream: GrpcStream, result: bytes | BaseException) -> None:
        if stream.state is StreamState.CLOSED:
            return
        if isinstance(result, TooLarge):
            self._calls_error(stream, Status.RESOURCE_EXHAUSTED, str(result))
        elif isinstance(result, BaseException):
            self._calls_error(stream, Status.INTERNAL, str(result))
        elif self._charge(stream, len(result)):
            self._deliver(stream, result)

    def _inflate_off_loop(self, stream: GrpcStream, message: bytes) -> None:
        """Inflate in a thread; the connection reads nothing more until it is done (the
        stream's next messages, and the frames after, keep their order)."""
        self._inflating = (stream, False)
        self._hold_reading("inflating")
        encoding, cap = stream.inflate, inflate_cap(self._calls.max_message_size, self._calls.budget)
        self._calls.offload(lambda: inflate(encoding, message, cap), self._inflate_done)

    def _inflate_done(self, result: bytes | BaseException) -> None:
        suspended = self._inflating
        if suspended is None or self.gone:
            return
        stream, ended = suspended
        self._inflating = None
        try:
            self._inflated(stream, result)
            if stream.inbox and stream.state is not StreamState.CLOSED:
                del stream.inbox[:self._messages(stream, stream.inbox)]
        except Exception as exc:
            self._call_failed(stream.id, exc)
        if self._inflating is not None:
            self._inflating = (stream, ended)
            return
        if stream.state is not StreamState.CLOSED:
            self._give_window(stream)
            if ended:
                self._remote_end(stream)
                self._tell_ended()
        self._release_reading("inflating")
        if self._buffer and not self.gone:
            self.data_received(b"")

    def taken(self, stream: GrpcStream, size: int) -> None:
        """A streaming call took a message of ``size`` bytes: its budget is given back,
        and the client's window with it once the backlog allows."""
        if stream.state is StreamState.CLOSED:
            return  # its budget went back when it closed
        stream.backlog -= 1
        self._calls.budget.held -= size
        stream.held -= size
        if stream.state is StreamState.OPEN:
            self._give_window(stream)

    def _give_window(self, stream: GrpcStream) -> None:
        """Top up the client's window for the stream once half of it is used, unless the
        stream's call has not taken what it already holds."""
        if stream.unacked >= self._limits.stream_window // 2 and stream.backlog < self._limits.stream_backlog:
            self._write(frame(FrameType.WINDOW_UPDATE, 0, stream.id, U32.pack(stream.unacked)))
            stream.recv_window += stream.unacked
            self._give_connection_window(stream.unacked)
            stream.unacked = 0

    def _give_connection_window(self, size: int) -> None:
        """Bytes taken (or dropped) give the connection's window back, once half is used:
        bytes a stream still holds keep the connection's window too."""
        self._recv_unacked += size
        if self._recv_unacked >= self._limits.connection_window // 2:
            self._write(frame(FrameType.WINDOW_UPDATE, 0, 0, U32.pack(self._recv_unacked)))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & _PADDED:
            payload = unpad(payload)
        if flags & _PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                flags |= _SELF_DEPENDENT
            payload = payload[5:]
        if not flags & _END_HEADERS:
            if not payload:
                self._idle_frame("empty frames")
            self._header_block = PartialBlock(stream_id, flags, payload)
            return
        self._header_block_done(stream_id, flags, payload)

    def _continue(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._header_block
        if pending is None or pending.stream_id != stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        pending.extend(payload, self._limits)
        if flags & _END_HEADERS:
            self._header_block = None
            self._header_block_done(stream_id, pending.flags, bytes(pending.block))
        elif not payload:
            self._idle_frame("empty frames")

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        trailers = stream is not None or stream_id <= self._last_stream_id
        headers = self._blocks.known.get(block)  # a block seen before is not decoded again
        if headers is None:
            try:
                headers = self._blocks.decode(block, trailers=trailers)
            except CompressionFailure as exc:
                raise ConnectionFailure(ErrorCode.COMPRESSION_ERROR, str(exc)) from exc
            except MalformedHeaders as exc:
                _log.debug("gRPC: stream %d: malformed headers: %s", stream_id, exc)
                self._last_stream_id = max(self._last_stream_id, stream_id)
                raise StreamFailure(stream_id, ErrorCode.PROTOCOL_ERROR) from exc
        if trailers:  # the client's trailers, or a stream that is closed
            if stream is None or stream.state is not StreamState.OPEN:
                raise StreamFailure(stream_id, ErrorCode.STREAM_CLOSED)
            if not flags & _END_STREAM or flags & _SELF_DEPENDENT:
                raise StreamFailure(stream_id, ErrorCode.PROTOCOL_ERROR)
            self._remote_end(stream)
            return
        self._last_stream_id = stream_id
        if flags & _SELF_DEPENDENT:
            raise StreamFailure(stream_id, ErrorCode.PROTOCOL_ERROR)
        if self.state is not ConnectionState.OPEN or len(self.streams) >= self._limits.max_streams:
            self._refuse_stream(stream_id)
            return
        stream = GrpcStream(stream_id, headers, self._sender.peer_stream_window, self._limits.stream_window)
        stream.handler = self._routes.get(headers[b":path"], self._calls)
        self.streams[stream_id] = stream
        encoding = headers.get(b"grpc-encoding")
        if encoding is not None and encoding != b"identity":
            if encoding not in (b"gzip", b"deflate"):
                self.finish(stream, Status.UNIMPLEMENTED, f"Compression algorithm '{encoding.decode('latin-1')}' is not supported")
                return
            stream.inflate = encoding.decode()
        timeout = headers.get(b"grpc-timeout")
        if timeout is not None and not self._set_deadline(stream, timeout):
            return
        stream.handler.open(self, stream)
        if flags & _END_STREAM:
            self._remote_end(stream)

    # -- answers ---------------------------------------------------------------------------

    async def writable(self, stream: GrpcStream, high_water: int | None = None) -> None:
        """Wait while the stream holds more than its high-water mark (or ``high_water``)
        of bytes the client has not let it send (a streaming writer's back-pressure)."""
        await self._sender.writable(stream, self._limits.stream_high_water if high_water is None else high_water)

    # -- streams ending ------------------------------------------------------------------

    def _forget(self, stream: GrpcStream) -> None:
        """The stream is closed: its budget goes back, its writer wakes."""
        stream.state = StreamState.CLOSED
        self._sender.blocked.pop(stream.id, None)
        if stream.deadline is not None:
            stream.deadline.cancel()
        if stream.unacked and self.state is not ConnectionState.CLOSED:
            self._give_connection_window(stream.unacked)
            stream.unacked = 0
        if stream.held:
            self._calls.budget.held -= stream.held
            stream.held = 0
        stream.inbox = bytearray()
        if stream.drained is not None:
            stream.drained.set()

    def _close_stream(self, stream: GrpcStream) -> None:
        """Our side is done: forget the stream (a client still sending is told to stop)."""
        client_done = stream.state is StreamState.HALF_CLOSED_REMOTE
        self._forget(stream)
        self.streams.pop(stream.id, None)
        if not client_done:
            self._write(frame(FrameType.RST_STREAM, 0, stream.id, U32.pack(ErrorCode.NO_ERROR)))
        if self.state is ConnectionState.DRAINING and not self.streams:
            self.close()
