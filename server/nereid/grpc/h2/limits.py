"""TransportLimits: what one gRPC client may hold of the native engine, and how much
noise it may make.

Sizes and counts bound memory: the windows a client may fill, open streams, the size of a
header list and how many CONTINUATION frames may carry it, the header blocks remembered.
Allowances (token buckets on the server's coarse clock) bound the frames that cost the
server work but bring no call forward: a client's RST_STREAM (each one withdraws a
request the server had started: "rapid reset", CVE-2023-44487), SETTINGS (each one is
acknowledged), and frames that carry nothing (empty DATA, empty header fragments:
CVE-2024-27316's family; PRIORITY, unknown types). A client past an allowance gets GOAWAY
ENHANCE_YOUR_CALM, as nghttp2, Go and grpc-core answer since their 2023-24 fixes.
Timers: the preface and SETTINGS must arrive within ``handshake_timeout``; a connection
with no call and nothing heard for ``idle_timeout`` is told GOAWAY; one whose client has
not read what it was sent for ``write_stall_timeout`` is closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereid.options import ServerOptions

__all__ = ["TransportLimits", "Allowance"]

_DEFAULTS = ServerOptions()


@dataclass(frozen=True, slots=True)
class TransportLimits:
    #: frames nereid receives (the protocol's default) and its windows: a stream's lets a
    #: 4 MiB message arrive without a round trip; the connection's is topped up as it is used.
    max_frame: int = 16384
    stream_window: int = 4 << 20
    connection_window: int = 64 << 20
    #: calls one connection may have open at once (advertised; past it REFUSED_STREAM)
    max_streams: int = 1024
    #: a request's header list (advertised), and the CONTINUATION frames that may carry one
    max_header_list: int = 16 << 10
    max_continuations: int = 32
    #: messages of a streaming call received and not yet taken by its call: past it the
    #: stream's window is no longer topped up (the client waits)
    stream_backlog: int = 64
    #: response bytes a stream may queue beyond the client's window before its writer waits
    stream_high_water: int = 1 << 20
    #: allowances: (burst, per second)
    resets: tuple[int, float] = (200, 33.0)
    settings: tuple[int, float] = (100, 10.0)
    idle_frames: tuple[int, float] = (1000, 100.0)
    max_connections: int = _DEFAULTS.grpc_max_connections
    handshake_timeout: float = _DEFAULTS.grpc_handshake_timeout_secs
    idle_timeout: float = _DEFAULTS.grpc_idle_timeout_secs
    write_stall_timeout: float = 60.0

    @classmethod
    def from_options(cls, options: ServerOptions) -> TransportLimits:
        return cls(
            max_connections=options.grpc_max_connections,
            handshake_timeout=options.grpc_handshake_timeout_secs,
            idle_timeout=options.grpc_idle_timeout_secs,
        )


class Allowance:
    """A token bucket: ``burst`` at once, refilled at ``rate`` per second of ``now``."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst_and_rate: tuple[int, float], now: float) -> None:
        self.burst, self.rate = burst_and_rate
        self.tokens = float(self.burst)
        self.stamp = now

    def spend(self, now: float) -> bool:
        """Take one; False when none is left."""
        if now != self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
