"""H2GrpcConnection: the candidate of issue 27, item 4 — ``GrpcConnection``'s interface on
``h2``'s HTTP/2 state machine.

The same asyncio.Protocol contract as ``nereid.grpc.h2.connection.GrpcConnection`` (the
``Calls`` object of ``nereid.grpc.native`` is told ``open``/``message``/``end``/``reset``/
``closed`` with ``GrpcStream`` objects, and answers with ``respond``/``send_message``/
``finish``/``writable``/``taken``; the server's sweep calls ``tick``, its shutdown
``go_away`` and ``close``; the limits are the same ``TransportLimits``), but every
frame in and out goes through ``h2.connection.H2Connection`` (server side, header validation and normalisation off):
h2 owns the connection and stream states, the SETTINGS exchange, HPACK both ways, flow
control windows (enforced: DATA past a window is FLOW_CONTROL_ERROR), CONTINUATION
assembly (at most 64 frames a block), closed-stream bookkeeping and the GOAWAY of a
protocol error. What stays nereid's: gRPC's message framing (5-byte prefix, gzip/deflate
inflated no further than the max message size), when received data is acknowledged (once
its message is handed to the calls), the answers of one loop iteration leaving in one
``transport.write``, gRPC's ping policy, and budgets for the frames RFC 9113 lets a peer
send for free (RST_STREAM, SETTINGS, PRIORITY, empty DATA, unknown types: past a budget
per second, GOAWAY ENHANCE_YOUR_CALM). Unlike GrpcConnection it charges nothing to the
server's request budget (--max-request-bytes-in-flight) and inflates compressed messages
on the loop.

Used by ``perf/serve_h2.py`` (nereid with this class in place of GrpcConnection) for the
comparison in perf/README.md, "gRPC transport: h2's state machine vs nereid's own framing".
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from typing import Any, Callable

import h2.events as ev
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from nereid.grpc.h2.calls import Calls, Status
from nereid.grpc.h2.lifecycle import Keepalive
from nereid.grpc.h2.stream import GrpcStream, ResponsePhase, StreamState

__all__ = ["H2GrpcConnection"]

_log = logging.getLogger("nereid")

_MESSAGE = struct.Struct(">BL")
#: Frames a peer may send per second (the server's coarse clock) that cost the server work
#: and the peer nothing, before GOAWAY ENHANCE_YOUR_CALM.
_FREE_FRAMES_PER_SECOND = {"RST_STREAM": 500, "SETTINGS": 100, "PRIORITY": 1000, "empty DATA": 1000, "unknown": 1000}

_RESPONSE_HEAD = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_TRAILERS_OK = [(b"grpc-status", b"0")]


def _percent_encoded(message: str) -> bytes:
    data = message.encode("utf-8", "replace")
    if all(0x20 <= byte <= 0x7E and byte != 0x25 for byte in data):
        return data
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in data)


class _Budget:
    """How many frames of one kind a peer sent in the current second."""

    __slots__ = ("limit", "second", "count")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.second = -1.0
        self.count = 0

    def spend(self, now: float) -> bool:
        if now != self.second:
            self.second = now
            self.count = 0
        self.count += 1
        return self.count <= self.limit


class H2GrpcConnection(asyncio.Protocol):
    """The server side of one HTTP/2 connection carrying gRPC calls, on h2's state machine."""

    #: h2's inbound header checks (RFC 9113 8.2: uppercase names, connection-specific
    #: headers, pseudo-header order); off as in the comparison's brief unless set.
    validate_headers = False

    def __init__(
        self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None, refusal: str | None = None,
    ) -> None:
        self._calls = calls
        #: what nereid advertises and enforces (windows, streams, header list, timers):
        #: the same ``TransportLimits`` as GrpcConnection's
        self._limits = limits = calls.limits
        #: GOAWAY with this reason as soon as the connection opens (a server at its
        #: connection limit), as GrpcConnection does
        self._refusal = refusal
        self._schedule = schedule
        self._transport: Any = None
        self._scheduled = False
        validate = self.validate_headers
        self._h2 = H2Connection(config=H2Configuration(
            client_side=False, header_encoding=None,
            validate_inbound_headers=validate, normalize_inbound_headers=validate,
            validate_outbound_headers=False, normalize_outbound_headers=False,
        ))
        self._h2.local_settings = Settings(client=False, initial_values={
            SettingCodes.ENABLE_PUSH: 0,
            SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_streams,
            SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
            SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list,
        })
        #: bytes of unfinished messages the connection may hold unacknowledged (past it,
        #: data is acknowledged as it arrives, so half-sent messages cannot stall it)
        self._max_held = limits.connection_window // 4
        self.streams: dict[int, GrpcStream] = {}
        self._blocked: dict[int, GrpcStream] = {}
        #: the trailers of streams whose last messages the windows still hold back
        self._trailers: dict[int, list[tuple[bytes, bytes]]] = {}
        self._held = 0
        self._going_away = False
        self.gone = False
        #: whether the client's preface and SETTINGS arrived (``tick``'s handshake timer)
        self._handshaken = False
        now = calls.now
        self.opened_at = now
        self.last_heard = now
        self._stalled_since: float | None = None
        self.ping_sent_at: float | None = None
        self._last_ping_received: float | None = None
        self._ping_strikes = 0
        self._budgets = {kind: _Budget(limit) for kind, limit in _FREE_FRAMES_PER_SECOND.items()}
        self._handlers: dict[type, Callable[[Any], object]] = {
            ev.RequestReceived: self._on_request,
            ev.DataReceived: self._on_data,
            ev.StreamEnded: self._on_end,
            ev.StreamReset: self._on_reset,
            ev.WindowUpdated: self._on_window,
            ev.RemoteSettingsChanged: self._on_settings,
            ev.PingReceived: self._on_ping,
            ev.PingAckReceived: self._on_ping_ack,
            ev.ConnectionTerminated: self._on_goaway,
            ev.PriorityUpdated: lambda event: self._spend("PRIORITY"),
            ev.UnknownFrameReceived: lambda event: self._spend("unknown"),
        }

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        if self._schedule is None:
            self._schedule = asyncio.get_running_loop().call_soon
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(self._limits.connection_window - 65535)
        transport.write(self._h2.data_to_send())
        if self._refusal is not None:
            self._fail(ErrorCodes.ENHANCE_YOUR_CALM, self._refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        streams = list(self.streams.values())
        self.streams.clear()
        self._blocked.clear()
        self._trailers.clear()
        for stream in streams:
            stream.state = StreamState.CLOSED
            stream.handler.reset(self, stream)
            if stream.drained is not None:
                stream.drained.set()
        self._calls.closed(self)

    def pause_writing(self) -> None:
        self._stalled_since = self._calls.now
        if not self.gone:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._stalled_since = None
        if not self.gone:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last_heard = self._calls.now
        try:
            events = self._h2.receive_data(data)
        except ProtocolError as exc:  # h2 has queued its GOAWAY
            _log.debug("gRPC: closing a connection: %s", exc)
            self.close()
            return
        handlers = self._handlers
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)
            if self.gone:
                return
        self._want_send()

    # -- events in -----------------------------------------------------------------------

    def _on_request(self, event: ev.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._going_away:
            self._h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        headers = dict(event.headers)
        stream = GrpcStream(
            stream_id, headers, self._h2.remote_settings.initial_window_size, self._limits.stream_window,
        )
        stream.handler = self._calls.routes.get(headers.get(b":path", b""), self._calls)
        self.streams[stream_id] = stream
        encoding = headers.get(b"grpc-encoding")
        if encoding is not None and encoding != b"identity":
            if encoding not in (b"gzip", b"deflate"):
                self.finish(stream, Status.UNIMPLEMENTED, f"Compression algorithm '{encoding.decode('latin-1')}' is not supported")
                return
            stream.inflate = encoding.decode()
        stream.handler.open(self, stream)

    def _on_data(self, event: ev.DataReceived) -> None:
        stream_id = event.stream_id
        size = event.flow_controlled_length
        stream = self.streams.get(stream_id)
        if stream is None or stream.state is StreamState.CLOSED:
            if size:
                self._h2.acknowledge_received_data(size, stream_id)
            return
        data = event.data
        if not data:
            if not event.stream_ended:
                self._spend("empty DATA")
            if size:  # padding only
                self._h2.acknowledge_received_data(size, stream_id)
            return
        inbox = stream.inbox
        if not inbox and len(data) >= 5:
            taken = self._messages(stream, data)
            if taken < len(data) and stream.state is not StreamState.CLOSED:
                inbox += data[taken:]
        else:
            inbox += data
            del inbox[:self._messages(stream, inbox)]
        stream.unacked += size
        if stream.state is StreamState.CLOSED:
            self._acknowledge(stream)
            return
        if stream.inbox:  # an unfinished message: acknowledged once handed over, unless it could not fit
            declared = _MESSAGE.unpack_from(stream.inbox)[1] if len(stream.inbox) >= 5 else 0
            self._held += size
            if declared + 5 > self._limits.stream_window // 2 or self._held > self._max_held:
                self._acknowledge(stream)
        else:
            self._acknowledge(stream)

    def _acknowledge(self, stream: GrpcStream) -> None:
        if stream.unacked:
            self._held = max(0, self._held - stream.unacked)
            try:
                self._h2.acknowledge_received_data(stream.unacked, stream.id)
            except ProtocolError:
                pass
            stream.unacked = 0

    def _messages(self, stream: GrpcStream, data: bytes | bytearray) -> int:
        """Hand each complete gRPC message in ``data`` to the calls; the bytes taken."""
        position = 0
        end = len(data)
        limit = self._calls.max_message_size
        while end - position >= 5 and stream.state is not StreamState.CLOSED:
            compressed, size = _MESSAGE.unpack_from(data, position)
            if size > limit:
                self._calls_error(stream, Status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")
                return end
            if end - position - 5 < size:
                break
            message = bytes(data[position + 5:position + 5 + size])
            position += 5 + size
            if compressed:
                try:
                    message = self._inflate(stream, message, limit)
                except ValueError as exc:
                    self._calls_error(stream, Status.RESOURCE_EXHAUSTED if "larger" in str(exc) else Status.INTERNAL, str(exc))
                    return end
            stream.handler.message(self, stream, message)
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

    def _on_end(self, event: ev.StreamEnded) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None or stream.state is not StreamState.OPEN:
            return
        stream.state = StreamState.HALF_CLOSED_REMOTE
        if stream.inbox:
            self._calls_error(stream, Status.INTERNAL, "Incomplete gRPC message at the end of the stream")
            return
        stream.handler.end(self, stream)

    def _on_reset(self, event: ev.StreamReset) -> None:
        if event.remote_reset and not self._spend("RST_STREAM"):
            return
        stream = self.streams.pop(event.stream_id, None)
        if stream is not None:
            self._blocked.pop(stream.id, None)
            self._trailers.pop(stream.id, None)
            stream.state = StreamState.CLOSED
            if stream.drained is not None:
                stream.drained.set()
            stream.handler.reset(self, stream)

    def _on_window(self, event: ev.WindowUpdated) -> None:
        if event.stream_id:
            stream = self._blocked.get(event.stream_id)
            if stream is not None:
                self._flush(stream)
        else:
            self._flush_blocked()

    def _on_settings(self, event: ev.RemoteSettingsChanged) -> None:
        self._handshaken = True
        if self._spend("SETTINGS"):
            self._flush_blocked()

    def _on_ping(self, event: ev.PingReceived) -> None:
        """gRPC's ping policing, as GrpcConnection does (h2 has queued the ACK)."""
        policy = self._calls.pings
        now = self._calls.now
        last = self._last_ping_received
        self._last_ping_received = now
        if last is None:
            return
        interval = policy.min_interval if self.streams or policy.without_calls else 7200.0
        if now - last >= interval:
            return
        self._ping_strikes += 1
        if policy.max_strikes and self._ping_strikes > policy.max_strikes:
            self._fail(ErrorCodes.ENHANCE_YOUR_CALM, "too_many_pings")

    def _on_ping_ack(self, event: ev.PingAckReceived) -> None:
        self.ping_sent_at = None

    def _on_goaway(self, event: ev.ConnectionTerminated) -> None:
        self._going_away = True
        if not self.streams:
            self.close()

    def _spend(self, kind: str) -> bool:
        if self._budgets[kind].spend(self._calls.now):
            return True
        self._fail(ErrorCodes.ENHANCE_YOUR_CALM, f"too many {kind} frames")
        return False

    # -- frames out ----------------------------------------------------------------------

    def _want_send(self) -> None:
        """Write what h2 has queued once the loop's current callbacks are done: the answers
        of one batch leave in one send."""
        if not self._scheduled:
            self._scheduled = True
            self._schedule(self._send_out)  # type: ignore[misc]

    def _send_out(self) -> None:
        self._scheduled = False
        if not self.gone:
            data = self._h2.data_to_send()
            if data:
                self._transport.write(data)

    def respond(self, stream: GrpcStream, message: bytes) -> None:
        """One message and status OK, in one write when the windows and a frame allow."""
        if stream.state is StreamState.CLOSED:
            return
        self._last_ping_received = None
        self._ping_strikes = 0
        size = len(message) + 5
        h2 = self._h2
        stream_id = stream.id
        try:
            if (
                stream.phase is ResponsePhase.NOTHING_SENT and not stream.pending and size <= h2.max_outbound_frame_size
                and size <= h2.local_flow_control_window(stream_id)
            ):
                h2.send_headers(stream_id, _RESPONSE_HEAD)
                h2.send_data(stream_id, _MESSAGE.pack(0, size - 5) + message)
                h2.send_headers(stream_id, _TRAILERS_OK, end_stream=True)
                self._close_stream(stream)
                self._want_send()
                return
        except (StreamClosedError, ProtocolError):  # h2 closed it meanwhile (a reset, its GOAWAY)
            self._forget(stream)
            return
        self.send_message(stream, message)
        self.finish(stream, Status.OK, "")

    def send_message(self, stream: GrpcStream, message: bytes) -> None:
        if stream.state is StreamState.CLOSED:
            return
        self._last_ping_received = None
        self._ping_strikes = 0
        if stream.phase is ResponsePhase.NOTHING_SENT:
            stream.phase = ResponsePhase.HEADERS_SENT
            try:
                self._h2.send_headers(stream.id, _RESPONSE_HEAD)
            except (StreamClosedError, ProtocolError):  # h2 closed it meanwhile
                self._forget(stream)
                return
        stream.pending.append(memoryview(_MESSAGE.pack(0, len(message)) + message))
        stream.pending_bytes += len(message) + 5
        self._flush(stream)
        self._want_send()

    def finish(self, stream: GrpcStream, status: int, message: str) -> None:
        if stream.state is StreamState.CLOSED or stream.phase is ResponsePhase.TRAILERS_QUEUED:
            return
        trailers = [(b"grpc-status", str(status).encode())]
        if message:
            trailers.append((b"grpc-message", _percent_encoded(message)))
        if stream.phase is ResponsePhase.NOTHING_SENT:  # trailers-only
            trailers = _RESPONSE_HEAD + trailers
        stream.phase = ResponsePhase.TRAILERS_QUEUED
        self._trailers[stream.id] = trailers
        self._flush(stream)
        self._want_send()

    def taken(self, stream: GrpcStream, size: int) -> None:
        """A streaming call took a message: nothing to give back here (the client's window
        was acknowledged when the message was handed over; no request budget is held)."""

    async def writable(self, stream: GrpcStream) -> None:
        high_water = self._limits.stream_high_water
        while stream.pending_bytes > high_water and stream.state is not StreamState.CLOSED:
            if stream.drained is None:
                stream.drained = asyncio.Event()
            stream.drained.clear()
            await stream.drained.wait()

    def _flush(self, stream: GrpcStream) -> None:
        h2 = self._h2
        pending = stream.pending
        stream_id = stream.id
        try:
            while pending:
                allowed = min(h2.local_flow_control_window(stream_id), h2.max_outbound_frame_size)
                if allowed <= 0:
                    self._blocked[stream_id] = stream
                    return
                chunk = pending[0]
                size = min(allowed, len(chunk))
                h2.send_data(stream_id, bytes(chunk[:size]))
                if size == len(chunk):
                    pending.popleft()
                else:
                    pending[0] = chunk[size:]
                stream.pending_bytes -= size
            self._blocked.pop(stream_id, None)
            if stream.drained is not None:
                stream.drained.set()
            trailers = self._trailers.pop(stream_id, None)
            if trailers is not None:
                h2.send_headers(stream_id, trailers, end_stream=True)
                self._close_stream(stream)
        except (StreamClosedError, ProtocolError):  # the client reset it meanwhile
            self._forget(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            self._flush(stream)
        self._want_send()

    def _close_stream(self, stream: GrpcStream) -> None:
        client_done = stream.state is StreamState.HALF_CLOSED_REMOTE
        stream.state = StreamState.CLOSED
        self.streams.pop(stream.id, None)
        self._trailers.pop(stream.id, None)
        self._acknowledge(stream)
        if stream.drained is not None:
            stream.drained.set()
        if not client_done:
            try:
                self._h2.reset_stream(stream.id, ErrorCodes.NO_ERROR)
            except ProtocolError:
                pass
        if self._going_away and not self.streams:
            self.close()

    def _forget(self, stream: GrpcStream) -> None:
        stream.state = StreamState.CLOSED
        self.streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        self._trailers.pop(stream.id, None)
        if stream.drained is not None:
            stream.drained.set()
        stream.handler.reset(self, stream)

    def _calls_error(self, stream: GrpcStream, status: int, message: str) -> None:
        stream.handler.reset(self, stream)
        stream.pending.clear()
        stream.pending_bytes = 0
        self.finish(stream, status, message)

    # -- the connection ------------------------------------------------------------------

    def tick(self, now: float, keepalive: Keepalive = Keepalive()) -> None:
        """The server's sweep, with GrpcConnection's timers (``lifecycle.ConnectionLifecycle.tick``):
        close a connection without its handshake in time, whose client stopped reading, or
        that left a keep-alive PING unanswered; tell an idle one GOAWAY; PING a quiet one."""
        limits = self._limits
        if not self._handshaken:
            if now - self.opened_at >= limits.handshake_timeout:
                self._fail(ErrorCodes.SETTINGS_TIMEOUT, f"no preface and SETTINGS within {limits.handshake_timeout:g} s")
        elif self._stalled_since is not None and now - self._stalled_since >= limits.write_stall_timeout:
            _log.info("gRPC: closing a connection whose client stopped reading")
            self.close()
        elif not self.streams and now - self.last_heard >= limits.idle_timeout and not self._going_away:
            self.go_away()
        if self.gone:
            return
        if self.ping_sent_at is not None:
            if now - self.ping_sent_at >= keepalive.timeout:
                _log.info("gRPC: closing a connection that did not answer a keep-alive PING")
                self.close()
        elif now - self.last_heard >= keepalive.time and (self.streams or keepalive.without_calls):
            self.ping(now)

    def ping(self, now: float) -> None:
        self.ping_sent_at = now
        self._h2.ping(b"nereid\x00\x00")
        self._want_send()

    def go_away(self) -> None:
        """No new calls; the connection closes once its calls are done. The GOAWAY is
        written past h2 (its state machine allows no frame after its own GOAWAY, and the
        calls in flight still answer)."""
        if self.gone or self._going_away:
            return
        self._going_away = True
        self._send_out()
        frame = GoAwayFrame(0, last_stream_id=self._h2.highest_inbound_stream_id, error_code=0)
        self._transport.write(frame.serialize())
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
            try:
                self._h2.close_connection(code, reason.encode()[:200])
            except ProtocolError:
                pass
        self.close()
