"""perf/bench_identity.py's ``overlap_rate``: with ``--clients K`` the throughput of a run is
the server's count of answers per second while all K perf_analyzer processes loaded it,
not the sum of their own figures (which overstates it once one has stopped). Driven by a
manual clock and stand-in processes, no sleeps."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_identity_under_test", ROOT / "perf" / "bench_identity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


overlap_rate = _bench().overlap_rate


class Clock:
    """Time that moves only when the code under test waits."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


class Client:
    """A perf_analyzer process that ends at ``ends_at`` on ``clock``."""

    def __init__(self, clock: Clock, ends_at: float) -> None:
        self.clock = clock
        self.ends_at = ends_at

    def poll(self) -> int | None:
        return 0 if self.clock.now >= self.ends_at else None


def counter(clock: Clock, rate: float) -> Callable[[], float]:
    """The server's answers so far when it answers ``rate`` a second from clock 100."""
    return lambda: (clock.now - 100.0) * rate


def test_the_rate_while_every_client_runs() -> None:
    clock = Clock()
    clients = [Client(clock, 110.0), Client(clock, 107.0), Client(clock, 112.0)]
    rate = overlap_rate(counter(clock, 5000.0), clients, 2.0, 200.0, clock, clock.wait)
    assert rate is not None and math.isclose(rate, 5000.0, rel_tol=1e-6)
    # it stopped counting when the first client ended, not the last
    assert 107.0 <= clock.now < 107.2


def test_none_when_a_client_ends_during_the_warm_up() -> None:
    clock = Clock()
    clients = [Client(clock, 110.0), Client(clock, 101.0)]
    assert overlap_rate(counter(clock, 5000.0), clients, 2.0, 200.0, clock, clock.wait) is None


def test_none_when_the_overlap_is_under_a_second() -> None:
    clock = Clock()
    clients = [Client(clock, 102.5), Client(clock, 110.0)]
    assert overlap_rate(counter(clock, 5000.0), clients, 2.0, 200.0, clock, clock.wait) is None


def test_none_when_the_statistics_do_not_answer() -> None:
    clock = Clock()
    clients = [Client(clock, 110.0)]
    assert overlap_rate(lambda: float("nan"), clients, 2.0, 200.0, clock, clock.wait) is None


def test_the_deadline_ends_the_count() -> None:
    clock = Clock()
    clients = [Client(clock, 1000.0)]
    rate = overlap_rate(counter(clock, 300.0), clients, 1.0, 106.0, clock, clock.wait)
    assert rate is not None and math.isclose(rate, 300.0, rel_tol=1e-6)
    assert 106.0 <= clock.now < 106.2
