"""SharedLimits: the connection limit and the request-bytes budget held server-wide by
front-end workers that each count their own.

One small shared region holds a row per worker (and one for the main process's gRPC):
open HTTP connections, request bytes held and open gRPC connections (the workers serve
gRPC too). Each process writes only its own row; a
limit is checked against the sum of all rows. No lock: two workers admitting at the same
instant may each see the other's count a moment late, so the server-wide figure can pass
a limit by what arrives in that instant (at most one connection or one request per
worker), never by N times the limit.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from nereid.network.request_budget import SMALL_REQUEST, RequestBudget

__all__ = ["SharedLimits", "SharedRequestBudget", "CountedConnections"]

_CONNECTIONS, _BYTES, _GRPC_CONNECTIONS = 0, 1, 2
_COLUMNS = 3


class SharedLimits:
    """The shared rows: ``rows`` of (HTTP connections, bytes held, gRPC connections). ``create(rows)`` in the main
    process, ``attach(fd, rows)`` in a worker handed the descriptor."""

    def __init__(self, fd: int, rows: int) -> None:
        self.fd = fd
        self.rows = rows
        self._map = mmap.mmap(fd, rows * 8 * _COLUMNS)
        self.table: np.ndarray[Any, np.dtype[np.int64]] = np.ndarray((rows, _COLUMNS), np.int64, buffer=self._map)

    @classmethod
    def create(cls, rows: int) -> SharedLimits:
        fd = os.memfd_create("nereid-frontend-limits", 0)
        os.ftruncate(fd, rows * 8 * _COLUMNS)
        return cls(fd, rows)

    @classmethod
    def attach(cls, fd: int, rows: int) -> SharedLimits:
        return cls(fd, rows)

    def clear(self, row: int) -> None:
        """Forget what ``row``'s process held (it died, and its connections with it)."""
        self.table[row] = 0

    def connections(self) -> int:
        return int(self.table[:, _CONNECTIONS].sum())

    def grpc_connections(self) -> int:
        return int(self.table[:, _GRPC_CONNECTIONS].sum())

    def held(self) -> int:
        return int(self.table[:, _BYTES].sum())


class SharedRequestBudget(RequestBudget):
    """A RequestBudget whose ``held`` is this process's row and whose limit applies to
    every row together (``--max-request-bytes-in-flight`` server-wide)."""

    __slots__ = ("_shared", "_row")

    def __init__(self, limit: int, shared: SharedLimits, row: int) -> None:
        self._shared = shared
        self._row = row
        super().__init__(limit)

    @property
    def held(self) -> int:
        """The bytes this process holds (what its engine adds and gives back)."""
        return int(self._shared.table[self._row, _BYTES])

    @held.setter
    def held(self, value: int) -> None:
        self._shared.table[self._row, _BYTES] = value

    def admits(self, size: int) -> bool:
        return size <= SMALL_REQUEST or self._shared.held() + size <= self.limit

    def refusal(self, size: int) -> str:
        return (
            f"server busy: {self._shared.held()} bytes of requests in flight and this request brings {size} more, "
            f"past the limit of {self.limit} (--max-request-bytes-in-flight); retry later"
        )


class CountedConnections(set[Any]):
    """A worker's open connections, their count published in its row as they come and go
    (``grpc``: its gRPC connections' column)."""

    def __init__(self, shared: SharedLimits, row: int, *, grpc: bool = False) -> None:
        super().__init__()
        self._shared = shared
        self._row = row
        self._column = _GRPC_CONNECTIONS if grpc else _CONNECTIONS

    def add(self, connection: Any) -> None:
        super().add(connection)
        self._shared.table[self._row, self._column] = len(self)

    def discard(self, connection: Any) -> None:
        super().discard(connection)
        self._shared.table[self._row, self._column] = len(self)
