"""ConnectionLimits: what one client may hold of the native engine, and for how long.

Owns the limits and timeouts a ``native_connection.Connection`` enforces, their defaults
(the CLI's), and the texts of the answers a client gets past them:

- the request head: URL length (414), header count and total head size (431);
- time: a head must be complete ``header_timeout`` seconds after it began, a body must
  keep arriving (``body_timeout`` seconds at most between two reads of it), an idle
  keep-alive connection closes after ``keepalive_timeout`` seconds, and a client that
  stops reading its answers for ``body_timeout`` seconds is disconnected (408 where an
  answer can still be given);
- the server: at most ``max_connections`` open connections (503 past it), and at most
  ``max_body_bytes_in_flight`` bytes of request bodies received and not yet answered
  over all connections (503 for a new large request past it; small ones always pass).

``RequestBudget`` (``nereid.network.request_budget``, shared with gRPC) is that last one's account. Time is the NativeServer's coarse clock
(``NativeServer.now``, moved by its sweep), so the hot path reads an attribute instead
of calling the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereid.options import ServerOptions

__all__ = ["ConnectionLimits"]


_DEFAULTS = ServerOptions()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_request_size: int = _DEFAULTS.max_request_size
    max_url_size: int = _DEFAULTS.http_max_url_size
    max_header_count: int = _DEFAULTS.http_max_header_count
    max_header_size: int = _DEFAULTS.http_max_header_size
    header_timeout: float = _DEFAULTS.http_header_timeout_secs
    body_timeout: float = _DEFAULTS.http_body_timeout_secs
    keepalive_timeout: float = _DEFAULTS.http_keepalive_timeout_secs
    max_connections: int = _DEFAULTS.http_max_connections
    max_body_bytes_in_flight: int = _DEFAULTS.max_request_bytes_in_flight

    @classmethod
    def from_options(cls, options: ServerOptions) -> ConnectionLimits:
        return cls(
            max_request_size=options.max_request_size,
            max_url_size=options.http_max_url_size,
            max_header_count=options.http_max_header_count,
            max_header_size=options.http_max_header_size,
            header_timeout=options.http_header_timeout_secs,
            body_timeout=options.http_body_timeout_secs,
            keepalive_timeout=options.http_keepalive_timeout_secs,
            max_connections=options.http_max_connections,
            max_body_bytes_in_flight=options.max_request_bytes_in_flight,
        )

    @property
    def sweep_interval(self) -> float:
        """How often the server checks its connections' timers: often enough that a
        timeout fires at most about a quarter of itself late, at most once a second."""
        return max(0.05, min(1.0, self.header_timeout / 4, self.body_timeout / 4, self.keepalive_timeout / 4))

    # -- what a client is told ------------------------------------------------------------

    def url_too_long(self) -> str:
        return f"request URL longer than {self.max_url_size} bytes (--http-max-url-size)"

    def too_many_headers(self) -> str:
        return f"request has more than {self.max_header_count} header lines (--http-max-header-count)"

    def head_too_large(self) -> str:
        return f"request head larger than {self.max_header_size} bytes (--http-max-header-size)"

    def head_timed_out(self) -> str:
        return f"request head not complete within {self.header_timeout:g} s (--http-header-timeout-secs)"

    def body_timed_out(self) -> str:
        return f"request body stopped arriving for {self.body_timeout:g} s (--http-body-timeout-secs)"

    def too_many_connections(self) -> str:
        return f"server has {self.max_connections} open connections, its limit (--http-max-connections); retry later"

    def budget_exhausted(self, in_flight: int, size: int) -> str:
        return (
            f"server busy: {in_flight} bytes of request bodies in flight and this request brings {size} more, "
            f"past the limit of {self.max_body_bytes_in_flight} (--max-request-bytes-in-flight); retry later"
        )
