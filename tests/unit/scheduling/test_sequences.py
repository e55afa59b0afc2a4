"""Sequences (slot bookkeeping) through its methods: admission and Triton's refusals,
slots and the backlog, batch formation per strategy, idle release. Pure: time is a
number the test passes."""

from __future__ import annotations

import pytest

from nereid.config.schema import SequenceStrategy
from nereid.errors import InvalidInputError
from nereid.inference import SequenceFlags
from nereid.scheduling.pending import Pending
from nereid.scheduling.sequences import Sequences

US = 1000


class _NoBatcher:
    def withdraw(self, pending: Pending) -> None:
        raise AssertionError("not used here")


def pending(name: str, now: int = 0, shape: object = None) -> Pending:
    return Pending(1, shape, 0, now, 0, name, now, None, _NoBatcher())  # type: ignore[arg-type]


def make(lanes: int = 1, slots: int = 2, max_batch_size: int = 2, strategy: SequenceStrategy | None = None,
         idle_us: int = 1_000_000) -> Sequences:
    return Sequences("m", lanes, slots, max_batch_size, strategy, idle_us)


def admit(sequences: Sequences, name: str, id_: int | str, *, start: bool = False, end: bool = False,
          now: int = 0, shape: object = None, timeout_us: int | None = None) -> None:
    sequences.admit(pending(name, now, shape), SequenceFlags(id_, start, end), 1, now, timeout_us)


def run(sequences: Sequences, lane: int = 0, now: int = 0) -> list[str | None]:
    """Take the batch due on ``lane`` and record it as run; its rows' names."""
    batch, _ = sequences.take(lane, now)
    rows = names(batch)
    sequences.done(lane, batch)
    return rows


def names(batch: list) -> list[str | None]:
    """Each row's request, None for an empty row (a null request)."""
    return [None if occupant is None else occupant.queue[0].request for occupant in batch]


def test_a_request_without_a_correlation_id_is_refused_with_tritons_message() -> None:
    with pytest.raises(InvalidInputError) as raised:
        make().admit(pending("a"), None, 1, 0)
    assert raised.value.message == (
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID")


@pytest.mark.parametrize("empty", [0, ""], ids=["zero", "empty-string"])
def test_a_zero_or_empty_correlation_id_is_refused(empty: int | str) -> None:
    with pytest.raises(InvalidInputError, match="must specify a non-zero or non-empty correlation ID"):
        admit(make(), "a", empty, start=True)


def test_an_unknown_sequence_without_start_is_refused_with_tritons_message() -> None:
    with pytest.raises(InvalidInputError) as raised:
        admit(make(), "a", 42)
    assert raised.value.message == ("inference request for sequence 42 to model 'm' must specify the START flag "
                                    "on the first request of the sequence")


def test_a_request_with_several_rows_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="must specify batch-size 1 due to requirements of sequence batcher"):
        make().admit(pending("a"), SequenceFlags(1, True), 2, 0)


def test_direct_batches_one_request_per_ready_slot_in_slot_order() -> None:
    sequences = make(slots=2)
    admit(sequences, "a1", 1, start=True)
    admit(sequences, "b1", 2, start=True)
    admit(sequences, "a2", 1)
    batch, _ = sequences.take(0, 0)
    assert names(batch) == ["a1", "b1"]
    sequences.done(0, batch)
    batch, _ = sequences.take(0, 0)
    assert names(batch) == ["a2"]


def test_a_lane_runs_one_batch_at_a_time() -> None:
    sequences = make(slots=2)
    admit(sequences, "a1", 1, start=True)
    batch, _ = sequences.take(0, 0)
    admit(sequences, "b1", 2, start=True)
    assert sequences.take(0, 0) == ([], None)
    sequences.done(0, batch)
    assert names(sequences.take(0, 0)[0]) == [None, "b1"]  # slot 0's sequence sent nothing yet


def test_a_sequence_starting_when_every_slot_is_taken_waits_in_the_backlog_until_one_ends() -> None:
    sequences = make(slots=1)
    admit(sequences, "a1", 1, start=True)
    admit(sequences, "b1", 2, start=True)
    admit(sequences, "b2", 2, end=True)
    assert len(sequences.backlog) == 1
    batch, _ = sequences.take(0, 0)
    assert names(batch) == ["a1"]
    sequences.done(0, batch)
    assert sequences.take(0, 0) == ([], None)  # sequence 1 still holds the slot
    admit(sequences, "a2", 1, end=True)
    batch, _ = sequences.take(0, 0)
    sequences.done(0, batch)  # its END ran: the slot goes to sequence 2
    assert names(sequences.take(0, 0)[0]) == ["b1"]


def test_sequences_spread_over_lanes() -> None:
    sequences = make(lanes=2, slots=2)
    admit(sequences, "a", 1, start=True)
    admit(sequences, "b", 2, start=True)
    assert names(sequences.take(0, 0)[0]) == ["a"]
    assert names(sequences.take(1, 0)[0]) == ["b"]


def test_after_end_the_same_id_needs_start_again() -> None:
    sequences = make()
    admit(sequences, "a1", 1, start=True, end=True)
    with pytest.raises(InvalidInputError, match="must specify the START flag"):
        admit(sequences, "a2", 1)


def test_a_start_for_a_sequence_in_flight_continues_in_its_slot() -> None:
    sequences = make(slots=2)
    admit(sequences, "a1", 1, start=True)
    admit(sequences, "a2", 1, start=True)
    assert len(sequences.take(0, 0)[0]) == 1  # the same slot: one at a time


def test_direct_queue_delay_holds_a_batch_until_the_slots_fill_or_the_delay_passes() -> None:
    sequences = make(slots=2, strategy=SequenceStrategy("direct", max_queue_delay_microseconds=100,
                                                        minimum_slot_utilization=1.0))
    admit(sequences, "a1", 1, start=True, now=0)
    assert sequences.take(0, 99 * US) == ([], 100 * US)
    assert names(sequences.take(0, 100 * US)[0]) == ["a1"]


def test_direct_minimum_slot_utilization_lets_a_full_batch_go_at_once() -> None:
    sequences = make(slots=2, strategy=SequenceStrategy("direct", max_queue_delay_microseconds=100,
                                                        minimum_slot_utilization=1.0))
    admit(sequences, "a1", 1, start=True)
    admit(sequences, "b1", 2, start=True)
    assert names(sequences.take(0, 0)[0]) == ["a1", "b1"]


def test_oldest_batches_the_requests_that_waited_longest_up_to_max_batch_size() -> None:
    sequences = make(slots=4, max_batch_size=2, strategy=SequenceStrategy("oldest", max_candidate_sequences=4))
    admit(sequences, "c1", 3, start=True, now=1)
    admit(sequences, "a1", 1, start=True, now=2)
    admit(sequences, "b1", 2, start=True, now=3)
    assert run(sequences, now=5) == ["c1", "a1"]
    admit(sequences, "c2", 3, now=6)
    assert run(sequences, now=6) == ["b1", "c2"]  # b1 waited longer than c2, though c started first


def test_oldest_with_a_queue_delay_waits_for_the_preferred_batch_size() -> None:
    sequences = make(slots=4, max_batch_size=4, strategy=SequenceStrategy(
        "oldest", max_candidate_sequences=4, preferred_batch_size=(2,), max_queue_delay_microseconds=100))
    admit(sequences, "a1", 1, start=True, now=0)
    assert sequences.take(0, 0) == ([], 100 * US)
    admit(sequences, "b1", 2, start=True, now=10)
    assert names(sequences.take(0, 10)[0]) == ["a1", "b1"]


def test_a_sequence_idle_past_the_limit_is_released_and_needs_start_again() -> None:
    sequences = make(slots=1, idle_us=500)
    admit(sequences, "a1", 1, start=True, now=0)
    admit(sequences, "b1", 2, start=True, now=0)  # backlog: the one slot is taken
    batch, _ = sequences.take(0, 0)
    sequences.done(0, batch)
    assert sequences.next_idle_ns() == 500 * US
    assert sequences.release_idle(499 * US) == []
    released = sequences.release_idle(500 * US)
    assert [occupant.id for occupant in released] == [1]
    assert names(sequences.take(0, 500 * US)[0]) == ["b1"]  # the backlog got the slot
    with pytest.raises(InvalidInputError, match="sequence 1 to model 'm' must specify the START flag"):
        admit(sequences, "a2", 1, now=501 * US)


def test_a_sequence_with_a_request_queued_is_never_idle() -> None:
    sequences = make(slots=1, idle_us=500)
    admit(sequences, "a1", 1, start=True, now=0)
    assert sequences.next_idle_ns() is None
    assert sequences.release_idle(10**12) == []


def test_a_withdrawn_request_leaves_its_sequence_but_a_running_one_stays() -> None:
    """A running request's caller gone: the batch drops its answer (its sequence goes on)."""
    sequences = make(slots=1)
    first, second = pending("a1"), pending("a2")
    sequences.admit(first, SequenceFlags(1, True), 1, 0)
    sequences.admit(second, SequenceFlags(1), 1, 0)
    batch, _ = sequences.take(0, 0)
    assert sequences.queued == 1
    assert not sequences.withdraw(first)  # running: the batch answers (or drops) it
    assert sequences.withdraw(second)
    sequences.done(0, batch)
    assert sequences.queued == 0


# -- direct: batch rows are slots (DirectSequenceBatch::BatcherThread) ------------------------


def test_a_direct_batch_covers_slots_up_to_the_highest_ready_one_with_empty_rows_between() -> None:
    sequences = make(slots=4, max_batch_size=4)
    for name, id_ in (("a1", 1), ("b1", 2), ("c1", 3)):
        admit(sequences, name, id_, start=True)
    assert run(sequences) == ["a1", "b1", "c1"]
    admit(sequences, "c2", 3)
    assert run(sequences) == [None, None, "c2"]
    admit(sequences, "b2", 2)
    assert run(sequences) == [None, "b2"]  # never past the highest ready slot
    admit(sequences, "a2", 1)
    assert run(sequences) == ["a2"]


def test_a_freed_slot_in_the_middle_leaves_an_empty_row() -> None:
    sequences = make(slots=3, max_batch_size=3)
    admit(sequences, "a1", 1, start=True)
    admit(sequences, "b1", 2, start=True, end=True)
    admit(sequences, "c1", 3, start=True)
    assert run(sequences) == ["a1", "b1", "c1"]  # b's END frees slot 1
    admit(sequences, "a2", 1)
    admit(sequences, "c2", 3)
    assert run(sequences) == ["a2", None, "c2"]


def test_a_new_sequence_takes_the_lowest_free_slot_of_any_instance() -> None:
    sequences = make(lanes=2, slots=4, max_batch_size=4)
    for id_, ends in ((1, False), (2, True), (3, True), (4, False), (5, True), (6, False)):
        admit(sequences, f"s{id_}", id_, start=True, end=ends)
    assert (run(sequences, 0), run(sequences, 1)) == (["s1", "s3", "s5"], ["s2", "s4", "s6"])
    # lane 0 holds slot 0 (3 free), lane 1 slots 1 and 2 (2 free): slot 0 of lane 1 is lowest
    admit(sequences, "s7", 7, start=True)
    assert (sequences.take(0, 0), run(sequences, 1)) == (([], None), ["s7"])


def test_a_request_whose_input_shapes_differ_from_the_first_ready_slot_waits_in_an_empty_row() -> None:
    sequences = make(slots=3, max_batch_size=3)
    admit(sequences, "a1", 1, start=True, shape=(4,))
    admit(sequences, "b1", 2, start=True, shape=(7,))
    admit(sequences, "c1", 3, start=True, shape=(4,))
    assert run(sequences) == ["a1", None, "c1"]
    assert run(sequences) == [None, "b1"]


def test_direct_minimum_slot_utilization_counts_ready_slots_against_max_batch_size() -> None:
    sequences = make(slots=4, max_batch_size=4, strategy=SequenceStrategy(
        "direct", max_queue_delay_microseconds=100, minimum_slot_utilization=0.5))
    admit(sequences, "a1", 1, start=True)
    assert sequences.take(0, 0) == ([], 100 * US)  # 1/4 < 0.5
    admit(sequences, "b1", 2, start=True)
    assert names(sequences.take(0, 0)[0]) == ["a1", "b1"]  # 2/4 >= 0.5


def test_direct_minimum_slot_utilization_of_zero_runs_at_once_whatever_the_delay() -> None:
    sequences = make(slots=2, strategy=SequenceStrategy("direct", max_queue_delay_microseconds=100))
    admit(sequences, "a1", 1, start=True)
    assert names(sequences.take(0, 0)[0]) == ["a1"]


def test_oldest_batches_only_requests_of_the_oldest_sequences_shape() -> None:
    sequences = make(slots=3, max_batch_size=3, strategy=SequenceStrategy("oldest", max_candidate_sequences=3))
    admit(sequences, "a1", 1, start=True, now=1, shape=(4,))
    admit(sequences, "b1", 2, start=True, now=2, shape=(7,))
    admit(sequences, "c1", 3, start=True, now=3, shape=(4,))
    assert run(sequences) == ["a1", "c1"]
    assert run(sequences) == ["b1"]


# -- timeouts and idle sequences in the backlog ------------------------------------------------


def test_a_backlogged_sequence_is_rejected_at_the_earliest_of_its_requests_timeouts() -> None:
    sequences = make(slots=1)
    admit(sequences, "a1", 1, start=True, timeout_us=10)  # in a slot: never times out
    admit(sequences, "b1", 2, start=True, now=0, timeout_us=100)
    admit(sequences, "b2", 2, now=20 * US, timeout_us=50)
    admit(sequences, "c1", 3, start=True, now=0)  # no timeout: waits as long as it takes
    assert sequences.next_expiry_ns() == 70 * US
    assert sequences.expire_backlog(69 * US) == []
    expired = sequences.expire_backlog(70 * US)
    assert [(o.id, [p.request for p in o.queue]) for o in expired] == [(2, ["b1", "b2"])]
    assert [o.id for o in sequences.backlog] == [3] and sequences.next_expiry_ns() is None
    with pytest.raises(InvalidInputError, match="sequence 2 to model 'm' must specify the START flag"):
        admit(sequences, "b3", 2, now=71 * US)


def test_a_backlogged_sequence_that_gets_a_slot_no_longer_times_out() -> None:
    sequences = make(slots=1)
    admit(sequences, "a1", 1, start=True, end=True)
    admit(sequences, "b1", 2, start=True, timeout_us=100)
    assert run(sequences) == ["a1"]  # a ended: b has the slot
    assert sequences.next_expiry_ns() is None
    assert sequences.expire_backlog(10**12) == []


def test_an_idle_sequence_in_the_backlog_keeps_waiting_and_is_released_once_its_requests_ran() -> None:
    """SequenceBatchScheduler::ReaperThread releases only sequences in a slot; one idle in
    the backlog is looked at again later, and once in a slot its idle time counts from its
    last request."""
    sequences = make(slots=1, idle_us=500)
    admit(sequences, "a1", 1, start=True, now=0)
    admit(sequences, "b1", 2, start=True, now=0)
    assert run(sequences) == ["a1"]
    released = sequences.release_idle(1000 * US)
    assert [o.id for o in released] == [1]  # b, idle as long, was in the backlog: kept
    assert run(sequences, now=1000 * US) == ["b1"]
    assert sequences.next_idle_ns() == 500 * US  # idle since its last request at 0
    assert [o.id for o in sequences.release_idle(1000 * US)] == [2]


# -- cancellation ends a sequence (ReleaseSequenceSlot with a cancelled request) ---------------


def test_a_cancelled_request_in_a_slot_ends_its_sequence_after_the_requests_ahead_of_it() -> None:
    sequences = make(slots=1)
    first, second, third = pending("a1"), pending("a2"), pending("a3")
    sequences.admit(first, SequenceFlags(1, True), 1, 0)
    sequences.admit(second, SequenceFlags(1), 1, 0)
    sequences.admit(third, SequenceFlags(1), 1, 0)
    admit(sequences, "b1", 2, start=True)  # backlog
    cancelled = sequences.withdraw(second)
    assert [p.request for p in cancelled or []] == ["a2", "a3"]
    assert run(sequences) == ["a1"]  # ahead of it: still runs, then the slot frees
    assert run(sequences) == ["b1"]
    with pytest.raises(InvalidInputError, match="sequence 1 to model 'm' must specify the START flag"):
        admit(sequences, "a4", 1)


def test_a_cancelled_request_in_the_backlog_cancels_its_whole_sequence() -> None:
    sequences = make(slots=1)
    admit(sequences, "a1", 1, start=True)
    first, second = pending("b1"), pending("b2")
    sequences.admit(first, SequenceFlags(2, True), 1, 0)
    sequences.admit(second, SequenceFlags(2), 1, 0)
    assert [p.request for p in sequences.withdraw(second) or []] == ["b2", "b1"]
    assert not sequences.backlog
    with pytest.raises(InvalidInputError, match="sequence 2 to model 'm' must specify the START flag"):
        admit(sequences, "b3", 2)


def test_a_cancelled_idle_sequences_slot_frees_at_once() -> None:
    sequences = make(slots=1)
    admit(sequences, "a1", 1, start=True)
    assert run(sequences) == ["a1"]
    second = pending("a2")
    sequences.admit(second, SequenceFlags(1), 1, 0)
    admit(sequences, "b1", 2, start=True)  # backlog
    sequences.withdraw(second)
    assert run(sequences) == ["b1"]
