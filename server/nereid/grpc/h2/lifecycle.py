"""ConnectionLifecycle: a gRPC connection from accept to close, and its timers.

Its state is ``ConnectionState``: PREFACE and SETTINGS while the client's preface is
awaited, OPEN, DRAINING once either side said GOAWAY (no new calls; it closes when the
last call ends), CLOSED. It says nereid's SETTINGS when the socket opens (or GOAWAY at
once to a client past the connection limit), pauses reading while a client does not read
its answers, and keeps the timers the server's sweep asks about (``tick``): the
handshake must end within ``handshake_timeout``, a client that stops reading is closed
after ``write_stall_timeout``, an idle connection is told GOAWAY after ``idle_timeout``,
a quiet one is PINGed after --grpc-keepalive-time and closed when the PING is not
answered within --grpc-keepalive-timeout. ``control.ControlFrames`` and
``connection.GrpcConnection`` build on it.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from nereid.grpc.h2.frames import DEFAULT_WINDOW, SETTING, U32, ErrorCode, FrameType, Setting, frame
from nereid.grpc.h2.sender import Sender
from nereid.grpc.h2.stream import GrpcStream

if TYPE_CHECKING:
    from nereid.grpc.h2.calls import Calls

__all__ = ["ConnectionLifecycle", "ConnectionState", "Keepalive"]

_log = logging.getLogger("nereid")


class ConnectionState(enum.Enum):
    PREFACE = "awaiting the client preface"
    SETTINGS = "awaiting the client's first SETTINGS"
    OPEN = "open"
    DRAINING = "going away"  # GOAWAY sent or received: no new streams; closes when the last ends
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Keepalive:
    """nereid's keep-alive PINGs (tritonserver's --grpc-keepalive-* flags, in seconds):
    sent after ``time`` without a frame from the client (only while a call is open unless
    ``without_calls``); a PING unanswered for ``timeout`` closes the connection."""

    time: float = 7200.0
    timeout: float = 20.0
    without_calls: bool = False


class ConnectionLifecycle(asyncio.Protocol, metaclass=abc.ABCMeta):
    """What every layer of a connection shares: its state, streams, Calls, Sender and
    transport; and how it opens, pauses, times out and closes. ``refusal``: the
    connection is told GOAWAY with that reason as soon as it opens (a server at its
    connection limit)."""

    def __init__(
        self, calls: Calls, schedule: Callable[[Callable[[], None]], Any] | None = None, refusal: str | None = None,
    ) -> None:
        self._calls = calls
        self._limits = calls.limits
        self._refusal = refusal
        self._transport: Any = None
        self.state = ConnectionState.PREFACE
        self.streams: dict[int, GrpcStream] = {}
        self._last_stream_id = 0
        self._sender = sender = Sender(schedule, self._close_stream)
        self._write = sender.write
        #: why reading is paused (the client does not read; a message is being inflated)
        self._read_holds: set[str] = set()
        now = calls.now
        self.opened_at = now
        #: when a frame last arrived (the server's coarse clock), when the client stopped
        #: reading, and when nereid's keep-alive PING went out (until its ACK)
        self.last_heard = now
        self._stalled_since: float | None = None
        self.ping_sent_at: float | None = None

    @abc.abstractmethod
    def _close_stream(self, stream: GrpcStream) -> None:
        """Our side of ``stream`` is done (its trailers are written): the call layer's."""

    @property
    def gone(self) -> bool:
        return self.state is ConnectionState.CLOSED

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

    def pause_writing(self) -> None:
        self._stalled_since = self._calls.now
        self._hold_reading("writing")  # a client that does not read is not read either

    def resume_writing(self) -> None:
        self._stalled_since = None
        self._release_reading("writing")

    def _hold_reading(self, why: str) -> None:
        if not self._read_holds and not self.gone:
            self._transport.pause_reading()
        self._read_holds.add(why)

    def _release_reading(self, why: str) -> None:
        self._read_holds.discard(why)
        if not self._read_holds and not self.gone:
            self._transport.resume_reading()

    def tick(self, now: float, keepalive: Keepalive = Keepalive()) -> None:
        """The server's sweep: close a connection that has not finished its handshake in
        time, whose client stopped reading, or that left a keep-alive PING unanswered;
        tell an idle one GOAWAY; PING a quiet one."""
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
        if self.gone:
            return
        if self.ping_sent_at is not None:
            if now - self.ping_sent_at >= keepalive.timeout:
                _log.info("gRPC: closing a connection that did not answer a keep-alive PING")
                self.close()
        elif now - self.last_heard >= keepalive.time and (self.streams or keepalive.without_calls):
            self.ping(now)

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
            self._transport.close()

    def _fail(self, code: int, reason: str) -> None:
        """A connection error: GOAWAY ``code`` with ``reason``, then close."""
        _log.debug("gRPC: closing a connection: %s", reason)
        if not self.gone:
            self._write(frame(
                FrameType.GOAWAY, 0, 0, U32.pack(self._last_stream_id) + U32.pack(code) + reason.encode()[:200]
            ))
        self.close()
