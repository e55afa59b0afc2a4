"""FrontEnds (frontends/supervisor.py): SIGHUP reaches a worker only once its handlers are
in place. A worker still importing nereid would be ended by the signal's default action;
it is signalled when it says it is armed instead (the process-level behaviour is in
tests/e2e/test_tls.py)."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

from nereid.frontends.supervisor import FrontEnds, _Worker


class FakeProcess:
    def __init__(self, returncode: int | None = None) -> None:
        self.returncode = returncode
        self.signals: list[int] = []

    def send_signal(self, number: int) -> None:
        self.signals.append(number)


def worker(index: int, armed: bool, returncode: int | None = None) -> _Worker:
    link: Any = SimpleNamespace(armed=armed, on_armed=None)
    return _Worker(index, FakeProcess(returncode), link, None, 0.0)  # type: ignore[arg-type]


def front_ends(*workers: _Worker) -> FrontEnds:
    fronts = FrontEnds.__new__(FrontEnds)  # only its workers: reload_certificates reads nothing else
    fronts._workers = {w.index: w for w in workers}
    return fronts


def signals(w: _Worker) -> list[int]:
    process: Any = w.process
    return list(process.signals)


def test_a_reload_signals_armed_workers_now_and_a_starting_one_once_it_is_armed() -> None:
    ready, starting, gone = worker(0, armed=True), worker(1, armed=False), worker(2, armed=True, returncode=1)
    fronts = front_ends(ready, starting, gone)
    fronts.reload_certificates()
    assert signals(ready) == [signal.SIGHUP]
    assert signals(starting) == [] and starting.reload_when_armed
    assert signals(gone) == []
    fronts._armed(starting)
    assert signals(starting) == [signal.SIGHUP] and not starting.reload_when_armed
    fronts._armed(starting)  # armed again (never happens) or armed with no reload asked: no signal
    assert signals(starting) == [signal.SIGHUP]


def test_a_worker_armed_with_no_reload_pending_is_not_signalled() -> None:
    starting = worker(0, armed=False)
    front_ends(starting)._armed(starting)
    assert signals(starting) == []
