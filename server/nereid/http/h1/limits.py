"""ConnectionLimits: what one client may hold of the native engine, and for how long.

Owns the limits and timeouts an HTTP/1.1 ``connection.Connection`` enforces, their defaults
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

from dataclasses import dataclass, fields
from typing import Literal

from nereid.options import ServerOptions

__all__ = ["ConnectionLimits", "Told"]


_DEFAULTS = ServerOptions()

#: The ServerOptions field each limit comes from (its CLI flag: the name with dashes).
_OPTION_OF = {
    "max_request_size": "max_request_size",
    "max_url_size": "http_max_url_size",
    "max_header_count": "http_max_header_count",
    "max_header_size": "http_max_header_size",
    "header_timeout": "http_header_timeout_secs",
    "body_timeout": "http_body_timeout_secs",
    "keepalive_timeout": "http_keepalive_timeout_secs",
    "max_connections": "http_max_connections",
    "max_body_bytes_in_flight": "max_request_bytes_in_flight",
}

#: The limits a client is told it went past (``ConnectionLimits.told``).
Told = Literal["max_url_size", "max_header_count", "max_header_size", "header_timeout", "body_timeout",
               "max_connections"]
#: What a client past each is told: ``{limit}`` is the limit, ``{flag}`` the CLI flag that sets it.
_TEXTS: dict[str, str] = {
    "max_url_size": "request URL longer than {limit} bytes ({flag})",
    "max_header_count": "request has more than {limit} header lines ({flag})",
    "max_header_size": "request head larger than {limit} bytes ({flag})",
    "header_timeout": "request head not complete within {limit:g} s ({flag})",
    "body_timeout": "request body stopped arriving for {limit:g} s ({flag})",
    "max_connections": "server has {limit} open connections, its limit ({flag}); retry later",
}


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
        return cls(**{field.name: getattr(options, _OPTION_OF[field.name]) for field in fields(cls)})

    @property
    def sweep_interval(self) -> float:
        """How often the server checks its connections' timers: often enough that a
        timeout fires at most about a quarter of itself late, at most once a second."""
        return max(0.05, min(1.0, self.header_timeout / 4, self.body_timeout / 4, self.keepalive_timeout / 4))

    # -- what a client is told ------------------------------------------------------------

    def told(self, limit: Told) -> str:
        """What a client past ``limit`` is told: the limit's value and the flag that sets it."""
        flag = "--" + _OPTION_OF[limit].replace("_", "-")
        return _TEXTS[limit].format(limit=getattr(self, limit), flag=flag)
