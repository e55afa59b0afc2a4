"""A server's open connections, as both engines (HTTP/1.1 and gRPC) keep them: refused
past the connection limit (counted, and logged at most once a minute), drained at
shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Collection, Protocol, TypeVar

__all__ = ["ConnectionRefusals", "drain"]

_log = logging.getLogger("nereid")

#: A refused connection is logged at most once per this many seconds.
REFUSAL_LOG_EVERY_S = 60.0
#: How often a draining server looks at its connections (seconds).
_DRAIN_POLL_S = 0.02


class ConnectionRefusals:
    """Connections refused at a server's connection limit: counted, and logged as a
    warning at most once a minute with how many were refused so far. ``protocol`` and
    ``how`` complete the message: "HTTP: 100 open connections, the limit
    (--http-max-connections): refusing new ones with 503 (3 refused so far)"."""

    __slots__ = ("protocol", "flag", "how", "limit", "count", "_clock", "_logged_at")

    def __init__(self, protocol: str, flag: str, how: str, limit: int, clock: Callable[[], float]) -> None:
        self.protocol = protocol
        self.flag = flag
        self.how = how
        self.limit = limit
        self.count = 0
        self._clock = clock
        self._logged_at: float | None = None

    def refused(self) -> None:
        self.count += 1
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= REFUSAL_LOG_EVERY_S:
            self._logged_at = now
            _log.warning(
                "%s: %d open connections, the limit (%s): refusing new ones with %s (%d refused so far)",
                self.protocol, self.limit, self.flag, self.how, self.count,
            )

    def message(self) -> str:
        """What a refused client is told."""
        return f"server has {self.limit} open {self.protocol} connections, its limit ({self.flag}); retry later"


class _Closable(Protocol):
    def close(self) -> None: ...


_Connection = TypeVar("_Connection", bound=_Closable)


async def drain(
    connections: Collection[_Connection], grace: float, idle: Callable[[_Connection], bool] | None = None,
) -> None:
    """Wait until ``connections`` is empty (each leaves it when it closes) or ``grace``
    seconds have passed; on every look, close the connections ``idle`` says have nothing
    in flight."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while True:
        if idle is not None:
            for connection in list(connections):
                if idle(connection):
                    connection.close()
        if not connections or loop.time() >= deadline:
            return
        await asyncio.sleep(_DRAIN_POLL_S)
