"""network/connections.py: connection refusals counted and logged at most once a minute
(both engines), and the shutdown drain: idle connections closed, the rest forced closed
at the grace's end, handlers still running cancelled."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nereid.network.connections import ConnectionRefusals, drain


def test_refusals_are_counted_and_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    refusals = ConnectionRefusals("gRPC", "--grpc-max-connections", "GOAWAY", 8, lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="nereid"):
        refusals.refused()
        clock[0] = 159.0
        refusals.refused()
        clock[0] = 160.0
        refusals.refused()
    assert refusals.count == 3
    assert [record.getMessage() for record in caplog.records] == [
        "gRPC: 8 open connections, the limit (--grpc-max-connections): refusing new ones with GOAWAY (1 refused so far)",
        "gRPC: 8 open connections, the limit (--grpc-max-connections): refusing new ones with GOAWAY (3 refused so far)",
    ]
    assert refusals.message() == "server has 8 open gRPC connections, its limit (--grpc-max-connections); retry later"


class _Connection:
    def __init__(self, connections: set[_Connection], idle: bool) -> None:
        self.connections = connections
        self.idle = idle
        self.how = ""
        connections.add(self)

    def close(self) -> None:
        self.how = "closed"
        self.connections.discard(self)

    def force_close(self) -> None:
        self.how = "forced"
        self.connections.discard(self)


def test_the_drain_closes_idle_connections_forces_the_rest_and_cancels_handlers() -> None:
    connections: set[_Connection] = set()
    quiet, busy = _Connection(connections, idle=True), _Connection(connections, idle=False)

    async def shut_down() -> asyncio.Task[None]:
        handler = asyncio.get_running_loop().create_task(asyncio.Event().wait())  # type: ignore[arg-type]
        await drain(connections, 0.0, idle=lambda c: c.idle, close=lambda c: c.close(),
                    force=lambda c: c.force_close(), tasks={handler})
        return handler

    handler = asyncio.run(shut_down())
    assert (quiet.how, busy.how, connections) == ("closed", "forced", set())
    assert handler.cancelled()


def test_the_drain_returns_as_soon_as_the_last_connection_leaves() -> None:
    connections: set[_Connection] = set()
    busy = _Connection(connections, idle=False)

    async def shut_down() -> None:
        asyncio.get_running_loop().call_soon(busy.close)
        await drain(connections, 1000.0, force=lambda c: c.force_close())

    asyncio.run(shut_down())
    assert busy.how == "closed"
