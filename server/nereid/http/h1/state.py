"""ConnectionState: where one HTTP/1.1 connection of the native engine is in its life,
and ``TRANSITIONS``, the moves it may make (``connection.Connection`` enters them)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["ConnectionState", "TRANSITIONS"]


class ConnectionState(enum.Enum):
    """Where one HTTP/1.1 connection is in its life."""

    OPEN = "reading requests and answering them in order"
    LAST_REQUEST = "reading stopped (parse error, upgrade, refused request): answering what was read, then closing"
    LINGERING = "closed by us: FIN sent, what the client still sends is read and dropped until it closes"
    CLOSED = "gone: nothing more is read, started or written"


#: The moves a connection may make (staying CLOSED or LAST_REQUEST is allowed: a second
#: connection_lost, a second refusal). Anything else is a bug, raised at once.
TRANSITIONS: Mapping[ConnectionState, frozenset[ConnectionState]] = MappingProxyType({
    ConnectionState.OPEN: frozenset({ConnectionState.LAST_REQUEST, ConnectionState.LINGERING, ConnectionState.CLOSED}),
    ConnectionState.LAST_REQUEST: frozenset({ConnectionState.LAST_REQUEST, ConnectionState.LINGERING, ConnectionState.CLOSED}),
    ConnectionState.LINGERING: frozenset({ConnectionState.CLOSED}),
    ConnectionState.CLOSED: frozenset({ConnectionState.CLOSED}),
})
