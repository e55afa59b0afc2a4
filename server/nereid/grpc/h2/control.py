"""ControlFrames: the frames that steer an HTTP/2 connection rather than carry a call.

SETTINGS (the client's windows and frame size, acknowledged), WINDOW_UPDATE (credit to
send), PING (answered, and policed as grpc's server does), RST_STREAM, GOAWAY, PRIORITY
and PUSH_PROMISE (RFC 9113 6.2-6.9), and the allowances that bound how much of this a
client may send (``limits.TransportLimits``): a client past one is told GOAWAY
ENHANCE_YOUR_CALM. ``GrpcConnection`` (``connection.py``) is this class with the frames
that carry calls (HEADERS, CONTINUATION, DATA). Of these only WINDOW_UPDATE and PING are
on a call's path (grpc-core clients send both with each call: BDP probing). Here too:
how the transport ends a call other than by its answer (the client's RST_STREAM, a
stream error, a call's grpc-timeout passed, a failure while handling its frames).
It builds on ``lifecycle.ConnectionLifecycle``.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from nereid.grpc.h2.frames import (
    FRAME_HEADER, MAX_MAX_FRAME, MAX_WINDOW, MIN_MAX_FRAME, SETTING, U32, ConnectionFailure, ErrorCode, Flag, FrameType, Setting,
    StreamFailure, frame,
)
from nereid.grpc.h2.lifecycle import ConnectionLifecycle, ConnectionState
from nereid.grpc.h2.limits import Allowance
from nereid.grpc.h2.stream import GrpcStream, StreamState

from nereid.grpc.h2.calls import Status

if TYPE_CHECKING:
    from nereid.grpc.h2.calls import Calls

__all__ = ["ControlFrames", "PingPolicy"]

_log = logging.getLogger("nereid")

_ACK = int(Flag.ACK)
#: the frame header of a PING's ACK (grpc-core clients send a PING with each call)
_PING_ACK = FRAME_HEADER.pack(0, 8, FrameType.PING, _ACK, 0)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
#: the interval grpc asks between pings while no call is open (unless pings without calls
#: are permitted)
_PING_INTERVAL_WITHOUT_CALLS = 7200.0


@dataclass(frozen=True, slots=True)
class PingPolicy:
    """How often a client may PING (seconds) and how many early pings it is forgiven."""

    min_interval: float = 300.0
    max_strikes: int = 2
    without_calls: bool = False


class ControlFrames(ConnectionLifecycle):
    """The control-frame layer of a ``GrpcConnection``: it changes the connection's state,
    the Sender's view of the client (windows, frame size) and its streams' send windows,
    and ends the calls the transport ends."""

    def __init__(
        self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None, refusal: str | None = None,
    ) -> None:
        super().__init__(calls, schedule, refusal)
        limits, now = calls.limits, calls.now
        self._resets = Allowance(limits.resets, now)
        self._settings_allowance = Allowance(limits.settings, now)
        self._idle_frames = Allowance(limits.idle_frames, now)
        #: the ping police: the last PING's time, strikes, and the Sender's count of
        #: responses begun when it came (pings between responses are the ones counted)
        self._last_ping_received: float | None = None
        self._ping_strikes = 0
        self._sent_at_last_ping = 0

    @abc.abstractmethod
    def _forget(self, stream: GrpcStream) -> None:
        """The stream is closed: what it holds goes back (the call layer's)."""

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a bad length")
        if self.state is ConnectionState.SETTINGS:
            self.state = ConnectionState.OPEN
        else:
            self._spend(self._settings_allowance, "SETTINGS frames")
        for offset in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, offset)
            if key == Setting.ENABLE_PUSH and value > 1:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"ENABLE_PUSH of {value}")
            if key == Setting.INITIAL_WINDOW_SIZE:
                self._initial_window(value)
            elif key == Setting.MAX_FRAME_SIZE:
                if not MIN_MAX_FRAME <= value <= MAX_MAX_FRAME:
                    raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"bad max frame size {value}")
                self._sender.peer_max_frame = value
        self._write(frame(FrameType.SETTINGS, _ACK, 0))
        self._sender.flush_blocked()

    def _initial_window(self, value: int) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE: every open stream's window moves by the change."""
        if value > MAX_WINDOW:
            raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "initial window size too large")
        delta = value - self._sender.peer_stream_window
        self._sender.peer_stream_window = value
        for stream in self.streams.values():
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "a stream's window past 2^31-1")

    def _window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            sender = self._sender
            sender.send_window += increment
            if sender.send_window > MAX_WINDOW:
                raise ConnectionFailure(ErrorCode.FLOW_CONTROL_ERROR, "connection window past 2^31-1")
            sender.flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            self._idle_frame("frames on closed streams")
            return
        if not increment:
            raise StreamFailure(stream_id, ErrorCode.PROTOCOL_ERROR)
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise StreamFailure(stream_id, ErrorCode.FLOW_CONTROL_ERROR)
        if stream.pending or stream.trailers is not None:
            self._sender.flush(stream)

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "PING of a bad length")
        if stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if flags & _ACK:
            self.ping_sent_at = None
        else:
            self._police_ping()
            self._write(_PING_ACK + payload)

    def _police_ping(self) -> None:
        """grpc's ping policing (tritonserver's --grpc-http2-* flags): a PING sooner than
        the allowed interval after the last one, with no response begun between, is a
        strike; past the allowed strikes the connection gets GOAWAY ENHANCE_YOUR_CALM
        "too_many_pings", as grpcio's server does. The interval is 2 hours while no call
        is open unless pings without calls are permitted."""
        policy = self._calls.pings
        now = self._calls.now
        sent = self._sender.sent
        if sent != self._sent_at_last_ping:  # a response began: pings are welcome again
            self._sent_at_last_ping = sent
            self._last_ping_received = None
            self._ping_strikes = 0
        last = self._last_ping_received
        self._last_ping_received = now
        if last is None:
            return
        interval = policy.min_interval if self.streams or policy.without_calls else _PING_INTERVAL_WITHOUT_CALLS
        if now - last >= interval:
            return
        self._ping_strikes += 1
        if policy.max_strikes and self._ping_strikes > policy.max_strikes:
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, "too_many_pings")

    def _rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of a bad length")
        if not stream_id or stream_id > self._last_stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
        self._spend(self._resets, "RST_STREAM frames")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._reset_by_client(stream)

    def _goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ConnectionFailure(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        self.state = ConnectionState.DRAINING
        if not self.streams:
            self.close()

    def _push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "a client may not push")

    def _priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise ConnectionFailure(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._idle_frame("PRIORITY frames")
        if len(payload) != 5:
            raise StreamFailure(stream_id, ErrorCode.FRAME_SIZE_ERROR)

    def _refuse_stream(self, stream_id: int) -> None:
        """A new stream past the open-stream limit, or on a connection going away."""
        self._spend(self._resets, "refused streams")
        self._write(frame(FrameType.RST_STREAM, 0, stream_id, U32.pack(ErrorCode.REFUSED_STREAM)))

    def _idle_frame(self, what: str) -> None:
        """A frame that brings no call forward (empty DATA, PRIORITY, unknown types...)."""
        self._spend(self._idle_frames, what)

    def _spend(self, allowance: Allowance, what: str) -> None:
        if not allowance.spend(self._calls.now):
            raise ConnectionFailure(ErrorCode.ENHANCE_YOUR_CALM, f"too many {what}")

    # -- calls ended by the transport (not by their answer) --------------------------------

    def _set_deadline(self, stream: GrpcStream, value: bytes) -> bool:
        """Time the call's grpc-timeout ("100m": 0.1 s); past it the call is reset and the
        client told DEADLINE_EXCEEDED. False, the call refused, when it does not parse."""
        unit = _TIMEOUT_UNITS.get(value[-1:])
        if unit is None or not value[:-1].isdigit() or len(value) > 9:
            self._sender.finish(stream, Status.INTERNAL, f"Invalid grpc-timeout {value.decode('latin-1')!r}")
            return False
        stream.deadline = asyncio.get_running_loop().call_later(int(value[:-1]) * unit, self._expire, stream)
        return True

    def _expire(self, stream: GrpcStream) -> None:
        stream.deadline = None
        if stream.state is not StreamState.CLOSED:
            stream.handler.reset(self, stream)
            self._sender.finish(stream, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _reset_by_client(self, stream: GrpcStream) -> None:
        del self.streams[stream.id]
        self._forget(stream)
        stream.handler.reset(self, stream)

    def _stream_error(self, stream_id: int, code: int) -> None:
        """RST_STREAM ``code``; the stream's call, if any, is reset."""
        stream = self.streams.pop(stream_id, None)
        self._write(frame(FrameType.RST_STREAM, 0, stream_id, U32.pack(code)))
        if stream is not None:
            self._forget(stream)
            stream.handler.reset(self, stream)

    def _calls_error(self, stream: GrpcStream, status: int, message: str) -> None:
        """A stream the transport cannot go on with: the call is cancelled, the client gets
        ``status``."""
        stream.handler.reset(self, stream)
        stream.pending.clear()
        stream.pending_bytes = 0
        self._sender.finish(stream, status, message)

    def _call_failed(self, stream_id: int, exc: Exception) -> None:
        """An exception while handling a frame (a bug): the call on that stream fails with
        INTERNAL, the connection goes on; one on the connection itself closes it."""
        _log.error("gRPC: handling a frame of stream %d failed", stream_id, exc_info=exc)
        stream = self.streams.get(stream_id)
        if stream is not None and stream.state is not StreamState.CLOSED:
            self._calls_error(stream, Status.INTERNAL, f"internal error: {exc}")
        elif not stream_id:
            self._fail(ErrorCode.INTERNAL_ERROR, "internal error")
