"""A server's open connections, as both engines (HTTP/1.1 and gRPC) keep them: refused
past the connection limit (counted, and logged at most once a minute), drained at
shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Collection, TypeVar

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


_Connection = TypeVar("_Connection")


async def drain(
    connections: Collection[_Connection], grace: float, *, force: Callable[[_Connection], None],
    tasks: Collection[asyncio.Task[None]] = (), idle: Callable[[_Connection], bool] | None = None,
    close: Callable[[_Connection], None] | None = None,
) -> None:
    """A server's shutdown, once it takes no new connections: wait until ``connections``
    is empty (each leaves it when it closes) or ``grace`` seconds have passed, on every
    look closing (``close``) those ``idle`` says have nothing in flight; then ``force``
    the rest closed and cancel the handler ``tasks`` still running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while True:
        if idle is not None and close is not None:
            for connection in list(connections):
                if idle(connection):
                    close(connection)
        if not connections or loop.time() >= deadline:
            break
        await asyncio.sleep(_DRAIN_POLL_S)
    for connection in list(connections):
        force(connection)
    await asyncio.sleep(0)  # the closes reach the handlers first: most end on their own
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
