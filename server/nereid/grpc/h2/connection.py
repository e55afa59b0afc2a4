"""GrpcConnection: gRPC's HTTP/2 on the asyncio loop, one protocol object per socket.

The framing a gRPC server needs (RFC 9113, and gRPC's "PROTOCOL-HTTP2"): the preface and
SETTINGS exchange, HEADERS/CONTINUATION (``headers.HeaderBlocks``), DATA cut into gRPC's
length-prefixed messages (gzip/deflate ones inflated, large ones off the loop), flow
control both ways and enforced, PING, RST_STREAM and GOAWAY. What a call means is the
``Calls`` object's business (``native.py``): the connection tells it ``open`` (a
request's headers), ``message``, ``end`` (the client half-closed) and ``reset`` (the
client or the connection went away), and it answers with ``respond`` (one message and
OK, one socket write when the windows allow), ``send_message`` and ``finish`` (the status
trailers).

The connection's lifecycle is ``ConnectionState``; a stream's is ``stream.StreamState``.
What a client may hold and how much noise it may make are ``limits.TransportLimits``:
every request byte is charged to the server's ``RequestBudget`` (shared with HTTP) from
its message's prefix until its call is answered; a client past an allowance of
RST_STREAM, SETTINGS or empty frames is told GOAWAY ENHANCE_YOUR_CALM.

Why it exists: grpcio's asyncio server spent about four fifths of nereid's CPU per
ModelInfer on its own per-call machinery (perf/README.md); this one answers a call
from the bytes received to one ``transport.write``, with no task or Future per call.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from nereid.grpc.h2.frames import (
    DEFAULT_WINDOW, FRAME_HEADER, MAX_MAX_FRAME, MAX_WINDOW, MESSAGE_PREFIX, MIN_MAX_FRAME, PREFACE, SETTING, U32,
    ErrorCode, Flag, FrameType, Setting, frame,
)
from nereid.grpc.h2.headers import CompressionFailure, HeaderBlocks, MalformedHeaders
from nereid.grpc.h2.limits import Allowance, TransportLimits
from nereid.grpc.h2.sender import Sender
from nereid.grpc.h2.stream import GrpcStream, StreamState
from nereid.network.request_budget import SMALL_REQUEST, RequestBudget

__all__ = ["Calls", "ConnectionState", "GrpcConnection", "GrpcStream", "PingPolicy", "Status", "MAX_CONCURRENT_STREAMS",
           "STREAM_HIGH_WATER", "INLINE_INFLATE"]

_log = logging.getLogger("nereid")

_DEFAULT_LIMITS = TransportLimits()
MAX_CONCURRENT_STREAMS = _DEFAULT_LIMITS.max_streams
STREAM_HIGH_WATER = _DEFAULT_LIMITS.stream_high_water
#: Compressed messages up to this size are inflated on the loop; larger ones in a thread.
INLINE_INFLATE = 8 << 10

_CONTINUATION = FrameType.CONTINUATION
# plain ints on the hot path: IntFlag's & and | run in Python
_END_STREAM, _END_HEADERS, _PADDED = int(Flag.END_STREAM), int(Flag.END_HEADERS), int(Flag.PADDED)
_ACK, _PRIORITY_FLAG = int(Flag.ACK), int(Flag.PRIORITY)
#: not a wire flag: a HEADERS frame whose priority names its own stream (a stream error)
_SELF_DEPENDENT = 0x100


class Status:
    """gRPC status codes used here (grpc.StatusCode's numbers)."""

    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
    RESOURCE_EXHAUSTED, INTERNAL, UNIMPLEMENTED, UNAVAILABLE = 8, 13, 12, 14


class ConnectionState(enum.Enum):
    PREFACE = "awaiting the client preface"
    SETTINGS = "awaiting the client's first SETTINGS"
    OPEN = "open"
    DRAINING = "going away"  # GOAWAY sent or received: no new streams; closes when the last ends
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class PingPolicy:
    """How often a client may PING (seconds) and how many early pings it is forgiven."""

    min_interval: float = 300.0
    max_strikes: int = 2
    without_calls: bool = False


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


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _StreamError(Exception):
    def __init__(self, stream_id: int, code: int) -> None:
        super().__init__(stream_id, code)
        self.stream_id = stream_id
        self.code = code


class GrpcConnection(asyncio.Protocol):
    """The server side of one HTTP/2 connection carrying gRPC calls. ``refusal``: the
    connection is told GOAWAY with that reason as soon as it opens (a server at its
    connection limit)."""

    def __init__(
        self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None, refusal: str | None = None,
    ) -> None:
        self._calls = calls
        self._limits = limits = calls.limits
        self._refusal = refusal
        self._transport: Any = None
        self.state = ConnectionState.PREFACE
        self._sender = sender = Sender(schedule, self._close_stream)
        self._write = sender.write
        # the answering methods below, bound straight to the Sender's (one call less per answer)
        self.respond = sender.respond  # type: ignore[method-assign]
        self.send_message = sender.send_message  # type: ignore[method-assign]
        self.finish = sender.finish  # type: ignore[method-assign]
        self._buffer = bytearray()
        self._blocks = HeaderBlocks(limits.max_header_list)
        #: a header block being assembled from CONTINUATION frames: stream, flags, bytes, frames
        self._header_block: tuple[int, int, bytearray, list[int]] | None = None
        self.streams: dict[int, GrpcStream] = {}
        self._last_stream_id = 0
        self._recv_window = limits.connection_window
        self._recv_unacked = 0
        #: why reading is paused (the client does not read; a message is being inflated)
        self._read_holds: set[str] = set()
        #: a stream whose message is inflating off the loop, and whether its frame ended it
        self._inflating: tuple[GrpcStream, bool] | None = None
        #: streams whose client finished sending in the read being handled
        self._ended: list[GrpcStream] = []
        now = calls.now
        self.opened_at = now
        #: when a frame last arrived (the server's coarse clock), and an unanswered PING's time
        self.last_heard = now
        self.ping_sent_at: float | None = None
        self._stalled_since: float | None = None
        self._last_ping_received: float | None = None
        self._ping_strikes = 0
        self._resets = Allowance(limits.resets, now)
        self._settings_allowance = Allowance(limits.settings, now)
        self._idle_frames = Allowance(limits.idle_frames, now)
        self._handlers: dict[int, Callable[[int, int, bytes], None]] = {
            FrameType.DATA: self._data, FrameType.HEADERS: self._headers, FrameType.CONTINUATION: self._continue,
            FrameType.WINDOW_UPDATE: self._window_update, FrameType.SETTINGS: self._settings,
            FrameType.PING: self._ping, FrameType.RST_STREAM: self._rst_stream, FrameType.GOAWAY: self._goaway,
            FrameType.PUSH_PROMISE: self._push_promise, FrameType.PRIORITY: self._priority,
        }

    @property
    def gone(self) -> bool:
        return self.state is ConnectionState.CLOSED

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._sender.attach(transport)
        limits = self._limits
        settings = b"".join(SETTING.pack(key, value) for key, value in (
            (Setting.ENABLE_PUSH, 0), (Setting.MAX_CONCURRENT_STREAMS, limits.max_streams),
            (Setting.INITIAL_WINDOW_SIZE, limits.stream_window), (Setting.MAX_HEADER_LIST_SIZE, limits.max_header_list),
        ))
        extra_window = limits.connection_window - DEFAULT_WINDOW
        transport.write(
            frame(FrameType.SETTINGS, 0, 0, settings)
            + (frame(FrameType.WINDOW_UPDATE, 0, 0, U32.pack(extra_window)) if extra_window > 0 else b"")
        )
        if self._refusal is not None:
            self._fail(ErrorCode.ENHANCE_YOUR_CALM, self._refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = ConnectionState.CLOSED
        self._sender.closed = True
        streams = list(self.streams.values())
        self.streams.clear()
        self._sender.blocked.clear()
        for stream in streams:
            self._forget(stream)
            self._calls.reset(self, stream)
        self._calls.closed(self)

    def pause_writing(self) -> None:
        self._stalled_since = self._calls.now
        self._hold_reading("writing")  # a client that does not read is not read either

    def resume_writing(self) -> None:
        self._stalled_since = None
        self._release_reading("writing")

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
        except _ConnectionError as error:
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
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
                return 0
            if view[:len(PREFACE)] != PREFACE:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
            self.state = ConnectionState.SETTINGS
            position = len(PREFACE)
        end = len(view)
        max_frame = self._limits.max_frame
        handlers = self._handlers
        while end - position >= 9 and self._inflating is None and self.state is not ConnectionState.CLOSED:
            high, low, kind, flags, stream_id = FRAME_HEADER.unpack_from(view, position)
            size = high << 16 | low
            if size > max_frame:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, f"frame of {size} bytes exceeds {max_frame}")
            if end - position - 9 < size:
                break
            start = position + 9
            position = start + size
            stream_id &= 0x7FFFFFFF
            if self._header_block is not None and kind != _CONTINUATION:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION")
            if self.state is ConnectionState.SETTINGS and (kind != FrameType.SETTINGS or flags & _ACK):
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "the client preface must end with SETTINGS")
            handler = handlers.get(kind)
            if handler is None:
                self._idle_frame("frames of unknown types")
                continue
            try:
                handler(flags, stream_id, bytes(view[start:position]))
            except _StreamError as error:
                self._stream_error(error.stream_id, error.code)
            except _ConnectionError:
                raise
            except Exception as exc:  # a bug, in a call's handling or here: that call fails
                self._call_failed(stream_id, exc)
        return position

    # -- frames in -----------------------------------------------------------------------

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self._recv_window:
            raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self._recv_window -= size
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if not size:
                self._idle_frame("empty frames")
            self._give_connection_window(size)
            return  # a stream nereid already closed: its late data is dropped
        if stream.state is not StreamState.OPEN or size > stream.recv_window:
            self._give_connection_window(size)
            code = ErrorCode.STREAM_CLOSED if stream.state is not StreamState.OPEN else ErrorCode.FLOW_CONTROL_ERROR
            raise _StreamError(stream_id, code)
        stream.recv_window -= size
        stream.unacked += size
        if flags & _PADDED:
            payload = _unpad(payload)
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
        end = self._calls.end
        for stream in ended:
            if stream.state is StreamState.HALF_CLOSED_REMOTE:
                try:
                    end(self, stream)
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
                self._inflated(stream, _inflate(stream.inflate, message, self._inflate_cap()))
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
        if not budget.admits(size):
            self._calls_error(stream, Status.RESOURCE_EXHAUSTED, budget.refusal(size))
            return False
        budget.held += size
        stream.held += size
        return True

    def _deliver(self, stream: GrpcStream, message: bytes) -> None:
        if stream.streaming:
            stream.backlog += 1
        self._calls.message(self, stream, message)

    def _inflated(self, stream: GrpcStream, result: bytes | BaseException) -> None:
        if stream.state is StreamState.CLOSED:
            return
        if isinstance(result, _TooLarge):
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
        encoding, cap = stream.inflate, self._inflate_cap()
        self._calls.offload(lambda: _inflate(encoding, message, cap), self._inflate_done)

    def _inflate_cap(self) -> tuple[int, str]:
        """How far a message may inflate, and the flag that says so: the message size
        limit, or what the server's budget admits now."""
        limit = self._calls.max_message_size
        budget = self._calls.budget
        room = max(SMALL_REQUEST, budget.limit - budget.held)
        if room < limit:
            return room, "--max-request-bytes-in-flight"
        return limit, "--grpc-max-message-size"

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
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & _PADDED:
            payload = _unpad(payload)
        if flags & _PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                flags |= _SELF_DEPENDENT
            payload = payload[5:]
        if not flags & _END_HEADERS:
            if not payload:
                self._idle_frame("empty frames")
            self._header_block = (stream_id, flags, bytearray(payload), [0])
            return
        self._header_block_done(stream_id, flags, payload)

    def _continue(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._header_block
        if pending is None or pending[0] != stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        block, count = pending[2], pending[3]
        block.extend(payload)
        count[0] += 1
        limits = self._limits
        if len(block) > limits.max_header_list:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"header block over {limits.max_header_list} bytes")
        if count[0] > limits.max_continuations:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"header block in over {limits.max_continuations} CONTINUATION frames")
        if flags & _END_HEADERS:
            self._header_block = None
            self._header_block_done(stream_id, pending[1], bytes(block))
        elif not payload:
            self._idle_frame("empty frames")

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        trailers = stream is not None or stream_id <= self._last_stream_id
        try:
            headers = self._blocks.decode(block, trailers=trailers)
        except CompressionFailure as exc:
            raise _ConnectionError(ErrorCode.COMPRESSION_ERROR, str(exc)) from exc
        except MalformedHeaders as exc:
            _log.debug("gRPC: stream %d: malformed headers: %s", stream_id, exc)
            self._last_stream_id = max(self._last_stream_id, stream_id)
            raise _StreamError(stream_id, ErrorCode.PROTOCOL_ERROR) from exc
        if trailers:  # the client's trailers, or a stream that is closed
            if stream is None or stream.state is not StreamState.OPEN:
                raise _StreamError(stream_id, ErrorCode.STREAM_CLOSED)
            if not flags & _END_STREAM or flags & _SELF_DEPENDENT:
                raise _StreamError(stream_id, ErrorCode.PROTOCOL_ERROR)
            self._remote_end(stream)
            return
        self._last_stream_id = stream_id
        if flags & _SELF_DEPENDENT:
            raise _StreamError(stream_id, ErrorCode.PROTOCOL_ERROR)
        if self.state is not ConnectionState.OPEN or len(self.streams) >= self._limits.max_streams:
            self._spend(self._resets, "refused streams")
            self._write(frame(FrameType.RST_STREAM, 0, stream_id, U32.pack(ErrorCode.REFUSED_STREAM)))
            return
        stream = GrpcStream(stream_id, headers, self._sender.peer_stream_window, self._limits.stream_window)
        self.streams[stream_id] = stream
        encoding = headers.get(b"grpc-encoding")
        if encoding is not None and encoding != b"identity":
            if encoding not in (b"gzip", b"deflate"):
                self.finish(stream, Status.UNIMPLEMENTED, f"Compression algorithm '{encoding.decode('latin-1')}' is not supported")
                return
            stream.inflate = encoding.decode()
        self._calls.open(self, stream)
        if flags & _END_STREAM:
            self._remote_end(stream)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a bad length")
        if self.state is ConnectionState.SETTINGS:
            self.state = ConnectionState.OPEN
        else:
            self._spend(self._settings_allowance, "SETTINGS frames")
        for offset in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, offset)
            if key == Setting.ENABLE_PUSH and value > 1:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"ENABLE_PUSH of {value}")
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "initial window size too large")
                delta = value - self._sender.peer_stream_window
                self._sender.peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")
            elif key == Setting.MAX_FRAME_SIZE:
                if not MIN_MAX_FRAME <= value <= MAX_MAX_FRAME:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"bad max frame size {value}")
                self._sender.peer_max_frame = value
        self._write(frame(FrameType.SETTINGS, _ACK, 0))
        self._sender.flush_blocked()

    def _window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            sender = self._sender
            sender.send_window += increment
            if sender.send_window > MAX_WINDOW:
                raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            sender.flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            self._idle_frame("frames on closed streams")
            return
        if not increment:
            raise _StreamError(stream_id, ErrorCode.PROTOCOL_ERROR)
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise _StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR)
        if stream.pending or stream.trailers is not None:
            self._sender.flush(stream)

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING of a bad length")
        if stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if flags & _ACK:
            self.ping_sent_at = None
        elif self._ping_allowed():
            self._write(frame(FrameType.PING, _ACK, 0, payload))

    def _ping_allowed(self) -> bool:
        """grpc's ping policing (tritonserver's --grpc-http2-* flags): a PING sooner than
        the allowed interval after the last one, with no HEADERS or DATA sent between,
        is a strike; past the allowed strikes the connection gets GOAWAY
        ENHANCE_YOUR_CALM "too_many_pings", as grpcio's server does. The interval is
        2 hours while no call is open unless pings without calls are permitted."""
        policy = self._calls.pings
        now = self._calls.now
        if self._sender.active:  # HEADERS or DATA went out: pings are welcome again
            self._sender.active = False
            self._last_ping_received = None
            self._ping_strikes = 0
        last = self._last_ping_received
        self._last_ping_received = now
        if last is None:
            return True
        interval = policy.min_interval if self.streams or policy.without_calls else 7200.0
        if now - last >= interval:
            return True
        self._ping_strikes += 1
        if policy.max_strikes and self._ping_strikes > policy.max_strikes:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too_many_pings")
        return True

    def _rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of a bad length")
        if not stream_id or stream_id > self._last_stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        self._spend(self._resets, "RST_STREAM frames")
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self._forget(stream)
            self._calls.reset(self, stream)

    def _goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        self.state = ConnectionState.DRAINING
        if not self.streams:
            self.close()

    def _push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "a client may not push")

    def _priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._idle_frame("PRIORITY frames")
        if len(payload) != 5:
            raise _StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR)

    def _idle_frame(self, what: str) -> None:
        self._spend(self._idle_frames, what)

    def _spend(self, allowance: Allowance, what: str) -> None:
        if not allowance.spend(self._calls.now):
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"too many {what}")

    # -- frames out (the Sender) ---------------------------------------------------------

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        """Answer a call with one message and status OK (``Sender.respond``)."""
        self._sender.respond(stream, message)

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        """Queue one response message, sent as the client's window allows."""
        self._sender.send_message(stream, message)

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        """End the call with its status (after the messages queued before it)."""
        self._sender.finish(stream, status, message)

    async def writable(self, stream: GrpcStream) -> None:
        """Wait while the stream holds more than its high-water mark of bytes the client
        has not let it send (a streaming writer's back-pressure)."""
        await self._sender.writable(stream, self._limits.stream_high_water)

    # -- streams ending ------------------------------------------------------------------

    def _forget(self, stream: GrpcStream) -> None:
        """The stream is closed: its budget goes back, its writer wakes."""
        stream.state = StreamState.CLOSED
        self._sender.blocked.pop(stream.id, None)
        if stream.unacked and not self.gone:
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

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM ``code``; the stream's call, if any, is reset."""
        stream = self.streams.pop(stream_id, None)
        self._write(frame(FrameType.RST_STREAM, 0, stream_id, U32.pack(code)))
        if stream is not None:
            self._forget(stream)
            self._calls.reset(self, stream)

    def _calls_error(self, stream: GrpcStream, status: int, message: str) -> None:
        """A stream the transport cannot go on with: the call is cancelled, the client gets
        ``status``."""
        self._calls.reset(self, stream)
        stream.pending.clear()
        stream.pending_bytes = 0
        self.finish(stream, status, message)

    def _call_failed(self, stream_id: int, exc: Exception) -> None:
        """An exception while handling a frame (a bug): the call on that stream fails with
        INTERNAL, the connection goes on; one on the connection itself closes it."""
        _log.error("gRPC: handling a frame of stream %d failed", stream_id, exc_info=exc)
        stream = self.streams.get(stream_id)
        if stream is not None and stream.state is not StreamState.CLOSED:
            self._calls_error(stream, Status.INTERNAL, f"internal error: {exc}")
        elif not stream_id:
            self._fail(ErrorCode.INTERNAL_ERROR, "internal error")

    # -- the connection ------------------------------------------------------------------

    def _hold_reading(self, why: str) -> None:
        if not self._read_holds and not self.gone:
            self._transport.pause_reading()
        self._read_holds.add(why)

    def _release_reading(self, why: str) -> None:
        self._read_holds.discard(why)
        if not self._read_holds and not self.gone:
            self._transport.resume_reading()

    def tick(self, now: float) -> None:
        """The server's sweep: close a connection that has not finished its handshake, or
        whose client stopped reading, in time; tell an idle one GOAWAY."""
        limits = self._limits
        if self.state in (ConnectionState.PREFACE, ConnectionState.SETTINGS):
            if now - self.opened_at >= limits.handshake_timeout:
                _log.debug("gRPC: closing a connection that did not complete its handshake")
                self._fail(ErrorCode.SETTINGS_TIMEOUT, f"no preface and SETTINGS within {limits.handshake_timeout:g} s")
        elif self._stalled_since is not None and now - self._stalled_since >= limits.write_stall_timeout:
            _log.info("gRPC: closing a connection whose client stopped reading")
            self.close()
        elif not self.streams and now - self.last_heard >= limits.idle_timeout and self.state is ConnectionState.OPEN:
            self.go_away()

    def ping(self, now: float) -> None:
        """A keep-alive PING (its ACK clears ``ping_sent_at``)."""
        self.ping_sent_at = now
        self._write(frame(FrameType.PING, 0, 0, b"nereid\x00\x00"))

    def go_away(self) -> None:
        """No new calls (shutdown, idle); the connection closes once its calls are done."""
        if self.state in (ConnectionState.CLOSED, ConnectionState.DRAINING):
            return
        self.state = ConnectionState.DRAINING
        self._write(frame(FrameType.GOAWAY, 0, 0, U32.pack(self._last_stream_id) + U32.pack(ErrorCode.NO_ERROR)))
        if not self.streams:
            self.close()

    def close(self) -> None:
        if not self.gone:
            self._sender.send_out()
            self.state = ConnectionState.CLOSED
            self._sender.closed = True
            self._transport.close()

    def _fail(self, code: int, reason: str) -> None:
        _log.debug("gRPC: closing a connection: %s", reason)
        if not self.gone:
            self._write(frame(
                FrameType.GOAWAY, 0, 0, U32.pack(self._last_stream_id) + U32.pack(code) + reason.encode()[:200]
            ))
        self.close()


class _TooLarge(ValueError):
    """A compressed message inflates past what may be held (RESOURCE_EXHAUSTED)."""


def _inflate(encoding: str | None, message: bytes, cap: tuple[int, str]) -> bytes | BaseException:
    """``message`` inflated (at most ``cap``'s bytes), or the error to answer with."""
    limit, flag = cap
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(message, limit + 1)
    except zlib.error as exc:
        return ValueError(f"cannot inflate the {encoding} message: {exc}")
    if len(out) > limit or inflater.unconsumed_tail:
        return _TooLarge(f"Received message larger than max (inflated past {limit} bytes, {flag})")
    return out


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]
