"""Limits held server-wide: each process writes its own row, every process sees the sum."""

from __future__ import annotations

import os

from nereid.frontends.shared_limits import CountedConnections, SharedLimits, SharedRequestBudget
from nereid.network.request_budget import SMALL_REQUEST


def test_a_budget_counts_its_own_bytes_and_refuses_past_the_sum_of_all() -> None:
    main = SharedLimits.create(3)
    worker = SharedLimits.attach(os.dup(main.fd), 3)  # another process's view of the same rows
    first = SharedRequestBudget(3 * SMALL_REQUEST, main, 0)
    second = SharedRequestBudget(3 * SMALL_REQUEST, worker, 1)
    first.held += 2 * SMALL_REQUEST
    assert (first.held, second.held) == (2 * SMALL_REQUEST, 0)
    assert second.admits(SMALL_REQUEST)
    assert not second.admits(SMALL_REQUEST + 1)
    assert second.admits(SMALL_REQUEST - 1)  # small requests always pass
    assert f"{2 * SMALL_REQUEST} bytes of requests in flight" in second.refusal(SMALL_REQUEST + 1)
    first.held -= 2 * SMALL_REQUEST
    assert second.admits(3 * SMALL_REQUEST)


def test_open_connections_are_published_and_summed_and_a_dead_row_is_cleared() -> None:
    limits = SharedLimits.create(2)
    ours, theirs = CountedConnections(limits, 0), CountedConnections(limits, 1)
    ours.add("a")
    ours.add("b")
    theirs.add("c")
    assert limits.connections() == 3
    ours.discard("a")
    assert limits.connections() == 2
    limits.clear(1)
    assert limits.connections() == 1


def test_grpc_connections_are_counted_apart_from_http_ones() -> None:
    limits = SharedLimits.create(2)
    http, grpc = CountedConnections(limits, 0), CountedConnections(limits, 1, grpc=True)
    other = CountedConnections(limits, 0, grpc=True)
    http.add("a")
    grpc.add("b")
    other.add("c")
    assert (limits.connections(), limits.grpc_connections()) == (1, 2)
    limits.clear(1)
    assert (limits.connections(), limits.grpc_connections()) == (1, 1)
