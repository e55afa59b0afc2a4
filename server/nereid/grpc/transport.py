"""GrpcConnection: gRPC's HTTP/2 on the asyncio loop, one protocol object per socket.

The framing a gRPC server needs (RFC 9113, and gRPC's "PROTOCOL-HTTP2"): the preface and
SETTINGS exchange, HEADERS/CONTINUATION decoded with ``hpack`` (a header block seen
before on the connection, with the decoder's table unchanged since, is not decoded
again: clients repeat theirs), DATA cut into gRPC's length-prefixed messages
(gzip/deflate ones inflated), flow control both ways, PING, RST_STREAM and GOAWAY.
What a call means is the ``Calls`` object's business (``native.py``): the connection
tells it ``open`` (a request's headers), ``message``, ``end`` (the client half-closed)
and ``reset`` (the client or the connection went away), and it answers with
``respond`` (one message and OK, one socket write when the windows allow),
``send_message`` and ``finish`` (the status trailers).

Why it exists: grpcio's asyncio server spent about four fifths of nereid's CPU per
ModelInfer on its own per-call machinery (perf/README.md); this one answers a call
from the bytes received to one ``transport.write``, with no task or Future per call.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import hpack

__all__ = ["Calls", "GrpcConnection", "GrpcStream", "PingPolicy", "Status"]

_log = logging.getLogger("nereid")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types, flags, settings and error codes (RFC 9113 sections 6, 6.5.2, 7).
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = range(10)
_END_STREAM = _ACK = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_PRIORITY_FLAG = 0x20
_HEADER_TABLE_SIZE, _ENABLE_PUSH, _MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE, _MAX_HEADER_LIST_SIZE = range(1, 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

_FRAME = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
_MESSAGE = struct.Struct(">BL")  # gRPC: compressed flag, length
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")

#: What nereid receives: frames up to the protocol's default size, a stream window that
#: lets a 4 MiB message arrive without a round trip, and a connection window of 64 MiB;
#: both are topped up once half is used.
_MAX_FRAME = 16384
_STREAM_WINDOW = 4 << 20
_CONNECTION_WINDOW = 64 << 20
_MAX_HEADER_LIST = 64 << 10
#: Calls one connection may have open at once (advertised; past it a new stream is refused
#: with REFUSED_STREAM, which clients retry): bounds what one client holds in the server.
MAX_CONCURRENT_STREAMS = 1024
_DEFAULT_WINDOW = 65535
_MAX_WINDOW = 2**31 - 1
#: Header blocks remembered per connection (cleared when the decoder's table changes).
_MAX_CACHED_BLOCKS = 64
#: Response bytes a stream may queue beyond the client's window before its writer waits.
STREAM_HIGH_WATER = 1 << 20


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer (RFC 7541 5.1) with ``first``'s high bits set in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field "without indexing, new name", no Huffman: nothing in the peer's
    decoder table depends on it."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


#: ``:status 200`` (static index 8) and ``content-type: application/grpc``.
_RESPONSE_HEAD = b"\x88" + _literal(b"content-type", b"application/grpc")
_TRAILERS_OK = _literal(b"grpc-status", b"0")


def _percent_encoded(message: str) -> bytes:
    """gRPC's grpc-message encoding: UTF-8, with bytes outside printable ASCII and '%' escaped."""
    data = message.encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in data):
        return data
    return b"".join(
        bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte for byte in data
    )


class Status:
    """gRPC status codes used here (grpc.StatusCode's numbers)."""

    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 1, 2, 3, 4
    RESOURCE_EXHAUSTED, INTERNAL, UNIMPLEMENTED, UNAVAILABLE = 8, 13, 12, 14


class GrpcStream:
    """One call's stream: what came in (headers, the message being assembled), what may
    go out (the client's window, bytes waiting for it) and how far each side is."""

    __slots__ = (
        "id", "headers", "call", "inbox", "send_window", "pending", "pending_bytes", "trailers",
        "head_sent", "remote_closed", "finished", "unacked", "inflate", "drained",
    )

    def __init__(self, stream_id: int, headers: dict[bytes, bytes], send_window: int) -> None:
        self.id = stream_id
        self.headers = headers
        #: the Calls object's state for this stream
        self.call: Any = None
        self.inbox = bytearray()
        self.send_window = send_window
        self.pending: deque[memoryview] = deque()
        self.pending_bytes = 0
        self.trailers: bytes | None = None
        self.head_sent = False
        self.remote_closed = False
        self.finished = False
        self.unacked = 0
        self.inflate: str | None = None
        #: set while the stream has nothing queued beyond the client's window
        self.drained: asyncio.Event | None = None


@dataclass(frozen=True, slots=True)
class PingPolicy:
    """How often a client may PING (seconds) and how many early pings it is forgiven."""

    min_interval: float = 300.0
    max_strikes: int = 2
    without_calls: bool = False


class Calls(Protocol):
    """What a connection tells about its calls (``native.NativeGrpcServer``), and the
    server-wide settings and coarse clock it reads."""

    max_message_size: int
    pings: PingPolicy
    now: float

    def open(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def message(self, connection: GrpcConnection, stream: GrpcStream, data: bytes) -> None: ...
    def end(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def reset(self, connection: GrpcConnection, stream: GrpcStream) -> None: ...
    def closed(self, connection: GrpcConnection) -> None: ...


class _ConnectionError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class GrpcConnection(asyncio.Protocol):
    """The server side of one HTTP/2 connection carrying gRPC calls."""

    def __init__(self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None) -> None:
        self._calls = calls
        self._schedule = schedule
        self._transport: Any = None
        #: bytes to send once the loop's current callbacks are done (None: nothing waits)
        self._out: list[bytes] | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = _MAX_HEADER_LIST
        self._blocks: dict[bytes, dict[bytes, bytes]] = {}
        self.streams: dict[int, GrpcStream] = {}
        self._last_stream_id = 0
        self._continuation: tuple[int, int, bytearray] | None = None
        self._send_window = _DEFAULT_WINDOW
        self._peer_stream_window = _DEFAULT_WINDOW
        self._peer_max_frame = _MAX_FRAME
        self._unacked = 0
        self._blocked: dict[int, GrpcStream] = {}
        self._going_away = False
        self.gone = False
        #: when a frame last arrived (the server's coarse clock), and an unanswered PING's time
        self.last_heard = 0.0
        self.ping_sent_at: float | None = None
        self._last_ping_received: float | None = None
        self._ping_strikes = 0

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        if self._schedule is None:
            self._schedule = asyncio.get_running_loop().call_soon
        settings = b"".join(_SETTING.pack(key, value) for key, value in (
            (_ENABLE_PUSH, 0), (_MAX_CONCURRENT_STREAMS, MAX_CONCURRENT_STREAMS),
            (_INITIAL_WINDOW_SIZE, _STREAM_WINDOW), (_MAX_HEADER_LIST_SIZE, _MAX_HEADER_LIST),
        ))
        transport.write(
            _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, _U32.pack(_CONNECTION_WINDOW - _DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self._out = None
        streams = list(self.streams.values())
        self.streams.clear()
        self._blocked.clear()
        for stream in streams:
            stream.finished = True
            self._calls.reset(self, stream)
            if stream.drained is not None:
                stream.drained.set()
        self._calls.closed(self)

    def pause_writing(self) -> None:
        if not self.gone:
            self._transport.pause_reading()  # a client that does not read is not read either

    def resume_writing(self) -> None:
        if not self.gone:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_heard = self._calls.now
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            view = data
        position = 0
        try:
            if not self._preface_seen:
                if len(view) < len(PREFACE):
                    if not PREFACE.startswith(bytes(view)):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
                    if not buffer:
                        buffer += data
                    return
                if view[:len(PREFACE)] != PREFACE:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface (gRPC needs HTTP/2)")
                self._preface_seen = True
                position = len(PREFACE)
            end = len(view)
            while end - position >= 9 and not self.gone:
                high, low, kind, flags, stream_id = _FRAME.unpack_from(view, position)
                size = high << 16 | low
                if size > _MAX_FRAME:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"frame of {size} bytes exceeds {_MAX_FRAME}")
                if end - position - 9 < size:
                    break
                start = position + 9
                position = start + size
                self._frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(view[start:position]))
        except _ConnectionError as error:
            self._fail(error.code, error.reason)
            return
        if buffer:
            del buffer[:position]
        elif position < len(view):
            buffer += view[position:]

    # -- frames in -----------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != _CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == _DATA:
            self._data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            self._continue(flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _PING:
            if stream_id or len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad PING")
            if flags & _ACK:
                self.ping_sent_at = None
            elif self._ping_allowed():
                self._write(_frame(_PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._blocked.pop(stream_id, None)
                stream.finished = True
                if stream.drained is not None:
                    stream.drained.set()
                self._calls.reset(self, stream)
        elif kind == _GOAWAY:
            self._going_away = True
            if not self.streams:
                self.close()
        elif kind == _PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client may not push")
        elif kind == _PRIORITY:
            if len(payload) != 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "bad PRIORITY")
        # unknown frame types are ignored (RFC 9113 4.1)

    def _ping_allowed(self) -> bool:
        """grpc's ping policing (tritonserver's --grpc-http2-* flags): a PING sooner than
        the allowed interval after the last one, with no HEADERS or DATA sent between,
        is a strike; past the allowed strikes the connection gets GOAWAY
        ENHANCE_YOUR_CALM "too_many_pings", as grpcio's server does. The interval is
        2 hours while no call is open unless pings without calls are permitted."""
        policy = self._calls.pings
        now = self._calls.now
        last = self._last_ping_received
        self._last_ping_received = now
        if last is None:
            return True
        interval = policy.min_interval if self.streams or policy.without_calls else 7200.0
        if now - last >= interval:
            return True
        self._ping_strikes += 1
        if policy.max_strikes and self._ping_strikes > policy.max_strikes:
            self._fail(ENHANCE_YOUR_CALM, "too_many_pings")
            return False
        return True

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._unacked += size
        if self._unacked >= _CONNECTION_WINDOW // 2:
            self._write(_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked)))
            self._unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream nereid already finished: its late data is dropped
        if stream.remote_closed:
            self._reset(stream, STREAM_CLOSED)
            return
        if flags & _PADDED:
            payload = _unpad(payload)
        if payload:
            stream.unacked += size
            if stream.unacked >= _STREAM_WINDOW // 2 and not flags & _END_STREAM:
                self._write(_frame(_WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.unacked)))
                stream.unacked = 0
            inbox = stream.inbox
            if not inbox and size >= 5:  # the usual case: whole messages in one frame
                self._messages(stream, payload)
            else:
                inbox += payload
                taken = self._messages(stream, inbox)
                del inbox[:taken]
        if flags & _END_STREAM and not stream.finished:
            stream.remote_closed = True
            if stream.inbox:
                self._calls_error(stream, Status.INTERNAL, "Incomplete gRPC message at the end of the stream")
                return
            self._calls.end(self, stream)

    def _messages(self, stream: GrpcStream, data: bytes | bytearray) -> int:
        """Hand each complete gRPC message in ``data`` to the calls; returns the bytes taken.
        Keeps what is incomplete in the stream's inbox."""
        position = 0
        end = len(data)
        limit = self._calls.max_message_size
        while end - position >= 5 and not stream.finished:
            compressed, size = _MESSAGE.unpack_from(data, position)
            if size > limit:
                self._calls_error(
                    stream, Status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})"
                )
                return end
            if end - position - 5 < size:
                break
            message = bytes(data[position + 5:position + 5 + size])
            position += 5 + size
            if compressed:
                try:
                    message = self._inflate(stream, message, limit)
                except ValueError as exc:
                    self._calls_error(stream, Status.INTERNAL, str(exc))
                    return end
            self._calls.message(self, stream, message)
        if position < end and data is not stream.inbox:
            stream.inbox += data[position:]
            return end
        return position

    @staticmethod
    def _inflate(stream: GrpcStream, message: bytes, limit: int) -> bytes:
        encoding = stream.inflate
        if encoding is None:
            raise ValueError("a compressed message without grpc-encoding")
        inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
        try:
            out = inflater.decompress(message, limit + 1)
        except zlib.error as exc:
            raise ValueError(f"cannot inflate the {encoding} message: {exc}") from exc
        if len(out) > limit or inflater.unconsumed_tail:
            raise ValueError(f"Received message larger than max (inflated past {limit})")
        return out

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        if flags & _PADDED:
            payload = _unpad(payload)
        if flags & _PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & _END_HEADERS:
            self._continuation = (stream_id, flags, bytearray(payload))
            return
        self._header_block(stream_id, flags, payload)

    def _continue(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        pending[2].extend(payload)
        if len(pending[2]) > _MAX_HEADER_LIST:
            raise _ConnectionError(ENHANCE_YOUR_CALM, f"header block over {_MAX_HEADER_LIST} bytes")
        if flags & _END_HEADERS:
            self._continuation = None
            self._header_block(stream_id, pending[1], bytes(pending[2]))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        stream = self.streams.get(stream_id)
        if stream is not None or stream_id <= self._last_stream_id:  # the client's trailers
            if stream is None or not flags & _END_STREAM:
                raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id} after it began")
            self._data(_END_STREAM, stream_id, b"")
            return
        self._last_stream_id = stream_id
        if self._going_away or len(self.streams) >= MAX_CONCURRENT_STREAMS:
            self._write(_frame(_RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = GrpcStream(stream_id, headers, self._peer_stream_window)
        self.streams[stream_id] = stream
        encoding = headers.get(b"grpc-encoding")
        if encoding is not None and encoding != b"identity":
            if encoding not in (b"gzip", b"deflate"):
                self.finish(stream, Status.UNIMPLEMENTED, f"Compression algorithm '{encoding.decode('latin-1')}' is not supported")
                return
            stream.inflate = encoding.decode()
        self._calls.open(self, stream)
        if flags & _END_STREAM and not stream.finished:
            stream.remote_closed = True
            self._calls.end(self, stream)

    def _decode(self, block: bytes) -> dict[bytes, bytes]:
        """The block's headers; one seen before comes from the cache, valid while the
        decoder's table has not changed (any block that changes it clears the cache)."""
        cached = self._blocks.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), entries[0] if entries else None, table.maxsize)
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, f"cannot decode a header block: {exc}") from exc
        headers = {bytes(name): bytes(value) for name, value in fields}
        if (len(entries), entries[0] if entries else None, table.maxsize) != before:
            self._blocks.clear()
        elif len(self._blocks) < _MAX_CACHED_BLOCKS:
            self._blocks[block] = headers
        return headers

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of a bad length")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == _INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window size too large")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == _MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(PROTOCOL_ERROR, f"bad max frame size {value}")
                self._peer_max_frame = value
        self._write(_frame(_SETTINGS, _ACK, 0))
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            self._flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not increment:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > _MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.pending or stream.trailers is not None:
            self._flush(stream)

    # -- frames out ----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Send ``data`` with everything else written before the loop goes back to the
        socket: the answers of one batch leave in one send, not one each."""
        out = self._out
        if out is None:
            self._out = [data]
            self._schedule(self._send_out)  # type: ignore[misc]
        else:
            out.append(data)

    def _send_out(self) -> None:
        out, self._out = self._out, None
        if out and not self.gone:
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        """Answer a call with one message and status OK: one write when the message fits
        the windows and a frame, as an infer answer usually does."""
        if stream.finished:
            return
        self._last_ping_received = None  # HEADERS and DATA go out: pings are welcome again
        self._ping_strikes = 0
        size = len(message) + 5
        if (
            not stream.head_sent and not stream.pending and size <= self._peer_max_frame
            and size <= stream.send_window and size <= self._send_window
        ):
            self._send_window -= size
            stream_id = stream.id
            self._write(b"".join((
                _frame(_HEADERS, _END_HEADERS, stream_id, _RESPONSE_HEAD),
                _FRAME.pack(0, size, _DATA, 0, stream_id), _MESSAGE.pack(0, size - 5), message,
                _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream_id, _TRAILERS_OK),
            )))
            self._close_stream(stream)
            return
        self.send_message(stream, message)
        self.finish(stream, Status.OK, "")

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        """Queue one response message (sent as the client's window allows)."""
        if stream.finished:
            return
        self._last_ping_received = None
        self._ping_strikes = 0
        if not stream.head_sent:
            stream.head_sent = True
            self._write(_frame(_HEADERS, _END_HEADERS, stream.id, _RESPONSE_HEAD))
        stream.pending.append(memoryview(_MESSAGE.pack(0, len(message)) + message))
        stream.pending_bytes += len(message) + 5
        self._flush(stream)

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        """End the call with its status (after the messages queued before it)."""
        if stream.finished or stream.trailers is not None:
            return
        block = _literal(b"grpc-status", str(status).encode())
        if message:
            block += _literal(b"grpc-message", _percent_encoded(message))
        if not stream.head_sent:  # trailers-only
            stream.head_sent = True
            block = _RESPONSE_HEAD + block
        stream.trailers = block
        self._flush(stream)

    async def writable(self, stream: GrpcStream) -> None:
        """Wait while the stream holds more than STREAM_HIGH_WATER bytes the client has not
        let it send (a streaming writer's back-pressure)."""
        while stream.pending_bytes > STREAM_HIGH_WATER and not stream.finished:
            if stream.drained is None:
                stream.drained = asyncio.Event()
            stream.drained.clear()
            await stream.drained.wait()

    def _flush(self, stream: GrpcStream) -> None:
        pending = stream.pending
        write = self._write
        max_frame = self._peer_max_frame
        while pending:
            allowed = min(stream.send_window, self._send_window, max_frame)
            if allowed <= 0:
                self._blocked[stream.id] = stream
                return
            chunk = pending[0]
            size = min(allowed, len(chunk))
            write(_FRAME.pack(size >> 16, size & 0xFFFF, _DATA, 0, stream.id) + chunk[:size])
            if size == len(chunk):
                pending.popleft()
            else:
                pending[0] = chunk[size:]
            stream.send_window -= size
            self._send_window -= size
            stream.pending_bytes -= size
        self._blocked.pop(stream.id, None)
        if stream.drained is not None:
            stream.drained.set()
        if stream.trailers is not None:
            self._write_header_block(stream.id, _END_STREAM, stream.trailers)
            self._close_stream(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self._flush(stream)

    def _write_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        max_frame = self._peer_max_frame
        if len(block) <= max_frame:
            self._write(_frame(_HEADERS, flags | _END_HEADERS, stream_id, block))
            return
        parts = [_frame(_HEADERS, flags, stream_id, block[:max_frame])]
        for offset in range(max_frame, len(block), max_frame):
            last = offset + max_frame >= len(block)
            parts.append(_frame(_CONTINUATION, _END_HEADERS if last else 0, stream_id, block[offset:offset + max_frame]))
        self._write(b"".join(parts))

    def _close_stream(self, stream: GrpcStream) -> None:
        """Our side is done: forget the stream (a client still sending is told to stop)."""
        stream.finished = True
        self.streams.pop(stream.id, None)
        if not stream.remote_closed:
            self._write(_frame(_RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        if self._going_away and not self.streams:
            self.close()

    def _reset(self, stream: GrpcStream, code: int) -> None:
        self.streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        stream.finished = True
        self._write(_frame(_RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._calls.reset(self, stream)

    def _calls_error(self, stream: GrpcStream, status: int, message: str) -> None:
        """A stream the transport cannot go on with: the call is cancelled, the client gets
        ``status``."""
        self._calls.reset(self, stream)
        stream.pending.clear()
        stream.pending_bytes = 0
        self.finish(stream, status, message)

    # -- the connection ------------------------------------------------------------------

    def ping(self, now: float) -> None:
        """A keep-alive PING (its ACK clears ``ping_sent_at``)."""
        self.ping_sent_at = now
        self._write(_frame(_PING, 0, 0, b"nereid\x00\x00"))

    def go_away(self) -> None:
        """No new calls (shutdown); the connection closes once its calls are done."""
        if self.gone or self._going_away:
            return
        self._going_away = True
        self._write(_frame(_GOAWAY, 0, 0, _U32.pack(self._last_stream_id) + _U32.pack(NO_ERROR)))
        if not self.streams:
            self.close()

    def close(self) -> None:
        if not self.gone:
            self._send_out()
            self.gone = True
            self._transport.close()

    def _fail(self, code: int, reason: str) -> None:
        _log.debug("gRPC: closing a connection: %s", reason)
        if not self.gone:
            self._write(
                _frame(_GOAWAY, 0, 0, _U32.pack(self._last_stream_id) + _U32.pack(code) + reason.encode()[:200])
            )
        self.close()


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _ConnectionError(PROTOCOL_ERROR, "padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]
