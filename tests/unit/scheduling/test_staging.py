"""nereid.scheduling.staging: when a slot whose batch still runs hands its instance the
next batch (Stage.decide, pure: the times are given). The batcher's behaviour with it is
in test_batcher.py (a full batch handed over while one runs, a partial one as it ends)."""

from __future__ import annotations

from typing import Any

from nereid.scheduling.pending import Pending
from nereid.scheduling.staging import STAGE_LEAD_NS, Running, Stage, StageDecision

MS = 1_000_000


def running(rows: int, started: int, *, after: int | None = None, ahead: bool = False) -> Running:
    batch = tuple(Pending(1, None, 0, 0, 0, i, 0, None, None) for i in range(rows))  # type: ignore[arg-type]
    return Running(batch, None, started, after=after, ahead=ahead)  # type: ignore[arg-type]


def stage(rows: int = 4, started: int = 0, typical: int = 50 * MS, **kwargs: Any) -> Stage:
    return Stage(None, running(rows, started, **kwargs), typical)  # type: ignore[arg-type]


def decide(s: Stage, now: int, *, idle: int = 0, full: bool = False, queued: int = 0, arrival: int = 0) -> StageDecision:
    return s.decide(now, idle_slots=idle, full=full, queued_cost=queued, last_arrival_ns=arrival)


def test_a_full_batch_goes_at_once_and_only_a_full_one() -> None:
    assert decide(stage(), 1 * MS, full=True, queued=8) == StageDecision(True, True, 45 * MS)


def test_a_partial_batch_waits_until_the_running_one_is_about_to_end() -> None:
    # 50 ms batches: a tenth of that (5 ms) before the expected end
    assert decide(stage(), 10 * MS, queued=2, arrival=9 * MS) == StageDecision(False, True, 45 * MS)


def test_once_late_a_batch_as_large_as_the_running_one_goes() -> None:
    assert decide(stage(rows=4), 46 * MS, queued=4, arrival=46 * MS).now


def test_no_look_is_planned_past_the_running_batch_s_expected_end() -> None:
    # quiet at 51 ms, but the running batch is expected back at 50 ms: its slot takes the queue then
    assert decide(stage(rows=4), 46 * MS, queued=2, arrival=46 * MS) == StageDecision(False, False, None)


def test_once_late_a_smaller_batch_waits_for_arrivals_to_be_quiet_for_the_lead() -> None:
    s = stage(rows=4)
    assert decide(s, 46 * MS, queued=2, arrival=44 * MS) == StageDecision(False, False, 49 * MS)
    assert decide(s, 49 * MS, queued=2, arrival=44 * MS).now


def test_the_lead_is_one_millisecond_at_least() -> None:
    s = stage(typical=2 * MS)
    decide(s, 0)
    assert s.lead == STAGE_LEAD_NS and s.due_at == 1 * MS


def test_a_batch_handed_over_ahead_counts_from_when_the_one_before_ended() -> None:
    s = stage(started=0, after=20 * MS, ahead=True)
    assert decide(s, 30 * MS, queued=1).wake_at == 65 * MS  # 20 + 50 - 5


def test_with_several_slots_only_a_full_batch_goes_early() -> None:
    s = stage(typical=0)  # the batcher passes 0 when slots share the queue
    assert decide(s, 10**12, queued=100, arrival=0) == StageDecision(False, True, None)
    assert decide(s, 10**12, full=True).now


def test_nothing_goes_early_while_another_slot_is_idle() -> None:
    assert not decide(stage(), 46 * MS, idle=1, full=True, queued=8).now
