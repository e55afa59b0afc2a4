"""The dynamic batcher's decisions, as pure code with an injected clock (no sleeping)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereid.config.schema import DynamicBatching, QueuePolicy
from nereid.errors import QueueFullError
from nereid.scheduling.queue import QueuedRequest, RequestQueue

US = 1_000


def make_queue(max_batch_size: int = 8, **batching: object) -> RequestQueue[Named]:
    return RequestQueue(max_batch_size=max_batch_size, dynamic_batching=DynamicBatching(**batching))  # type: ignore[arg-type]


@dataclass(slots=True, eq=False)
class Named(QueuedRequest):
    """A queue entry that says which request it is."""

    name: str


def push(queue: RequestQueue[Named], now: int, cost: int = 1, signature: object = "s", priority: int = 0,
         timeout_us: int | None = None, name: str = "") -> Named:
    level = queue.level_for(priority)
    item = Named(cost=cost, signature=signature, level=level, enqueued_ns=now,
                 deadline_ns=queue.deadline_for(level, now, timeout_us), name=name)
    queue.push(item)
    return item


def sizes(decision) -> int:  # type: ignore[no-untyped-def]
    return sum(item.cost for item in decision.batch)


def test_partial_batch_waits_until_the_queue_delay_from_the_oldest_request() -> None:
    queue = make_queue(max_queue_delay_microseconds=100)
    push(queue, 0)
    decision = queue.decide(99 * US)
    assert decision.batch == ()
    assert decision.wake_at_ns == 100 * US


def test_partial_batch_leaves_when_queue_delay_expires() -> None:
    queue = make_queue(max_queue_delay_microseconds=100)
    push(queue, 0)
    push(queue, 50 * US)
    decision = queue.decide(101 * US)
    assert sizes(decision) == 2
    assert len(queue) == 0


def test_zero_delay_takes_whatever_is_queued_at_once() -> None:
    queue = make_queue(max_queue_delay_microseconds=0)
    push(queue, 0)
    push(queue, 0)
    assert sizes(queue.decide(0)) == 2


def test_full_batch_leaves_without_waiting_for_the_delay() -> None:
    queue = make_queue(max_batch_size=4, max_queue_delay_microseconds=10**9)
    for _ in range(6):
        push(queue, 0)
    decision = queue.decide(1)
    assert sizes(decision) == 4
    assert len(queue) == 2


def test_request_rows_count_against_max_batch_size() -> None:
    queue = make_queue(max_batch_size=4, max_queue_delay_microseconds=10**9)
    push(queue, 0, cost=3)
    push(queue, 0, cost=3)
    decision = queue.decide(1)
    assert [item.cost for item in decision.batch] == [3]


def test_preferred_size_leaves_before_the_delay() -> None:
    queue = make_queue(max_batch_size=8, preferred_batch_size=(2, 4), max_queue_delay_microseconds=10**9)
    for _ in range(3):
        push(queue, 0)
    decision = queue.decide(1)
    # 3 queued: the largest preferred prefix (2) leaves now, the third waits.
    assert sizes(decision) == 2
    assert len(queue) == 1


def test_largest_preferred_size_wins() -> None:
    queue = make_queue(max_batch_size=8, preferred_batch_size=(2, 4), max_queue_delay_microseconds=10**9)
    for _ in range(5):
        push(queue, 0)
    assert sizes(queue.decide(1)) == 4


def test_after_delay_expires_everything_pending_leaves_even_past_a_preferred_size() -> None:
    queue = make_queue(max_batch_size=8, preferred_batch_size=(2,), max_queue_delay_microseconds=100)
    for _ in range(3):
        push(queue, 0)
    assert sizes(queue.decide(200 * US)) == 3  # Triton: delay exceeded -> the whole pending batch


def test_requests_with_different_signatures_never_share_a_batch() -> None:
    queue = make_queue(max_queue_delay_microseconds=10**9)
    push(queue, 0, signature="a")
    push(queue, 0, signature="b")
    push(queue, 0, signature="a")
    decision = queue.decide(1)
    assert [item.signature for item in decision.batch] == ["a"]
    assert [item.signature for item in queue.decide(2).batch] == ["b"]


def test_queue_full_is_rejected_with_tritons_message() -> None:
    queue = make_queue(default_queue_policy=QueuePolicy(max_queue_size=2), max_queue_delay_microseconds=10**9)
    push(queue, 0)
    push(queue, 0)
    with pytest.raises(QueueFullError, match="^Exceeds maximum queue size$"):
        push(queue, 0)


def test_timeout_reject_expires_the_request() -> None:
    queue = make_queue(default_queue_policy=QueuePolicy(default_timeout_microseconds=50),
                       max_queue_delay_microseconds=10**9)
    item = push(queue, 0)
    decision = queue.decide(60 * US)
    assert decision.expired == (item,)
    assert len(queue) == 0


def test_wake_time_is_the_earlier_of_delay_and_timeout() -> None:
    queue = make_queue(default_queue_policy=QueuePolicy(default_timeout_microseconds=50),
                       max_queue_delay_microseconds=100)
    push(queue, 0)
    assert queue.decide(1).wake_at_ns == 50 * US


def test_request_timeout_counts_only_with_allow_timeout_override() -> None:
    strict = make_queue(default_queue_policy=QueuePolicy(default_timeout_microseconds=0), max_queue_delay_microseconds=10**9)
    push(strict, 0, timeout_us=10)
    assert strict.decide(20 * US).expired == ()
    lenient = make_queue(default_queue_policy=QueuePolicy(allow_timeout_override=True), max_queue_delay_microseconds=10**9)
    push(lenient, 0, timeout_us=10)
    assert len(lenient.decide(20 * US).expired) == 1


def test_timeout_delay_moves_the_request_behind_unexpired_ones() -> None:
    queue = make_queue(max_batch_size=1, max_queue_delay_microseconds=0,
                       default_queue_policy=QueuePolicy(timeout_action="DELAY", default_timeout_microseconds=10,
                                                        allow_timeout_override=True))
    push(queue, 0, name="late", timeout_us=10)
    push(queue, 1, name="fresh", timeout_us=10**6)
    first = queue.decide(20 * US)
    assert first.expired == ()
    assert [i.name for i in first.batch] == ["fresh"]
    assert [i.name for i in queue.decide(21 * US).batch] == ["late"]


def test_higher_priority_level_goes_first() -> None:
    queue = make_queue(max_batch_size=1, priority_levels=2, default_priority_level=2)
    push(queue, 0, name="low")
    push(queue, 1, name="high", priority=1)
    assert [i.name for i in queue.decide(2).batch] == ["high"]
    assert [i.name for i in queue.decide(3).batch] == ["low"]


def test_out_of_range_priority_uses_the_default_level() -> None:
    queue = make_queue(priority_levels=2, default_priority_level=2)
    assert queue.level_for(0) == 2
    assert queue.level_for(7) == 2
    assert queue.level_for(1) == 1


def test_max_queue_size_is_per_priority_level() -> None:
    queue = make_queue(priority_levels=2, default_priority_level=2, max_queue_delay_microseconds=10**9,
                       priority_queue_policy={1: QueuePolicy(max_queue_size=1)})
    push(queue, 0, priority=1)
    with pytest.raises(QueueFullError):
        push(queue, 0, priority=1)
    push(queue, 0, priority=2)  # level 2 is unbounded


def test_discarded_request_is_never_taken() -> None:
    queue = make_queue(max_queue_delay_microseconds=0)
    gone = push(queue, 0, name="gone")
    push(queue, 0, name="kept")
    assert queue.discard(gone) is True
    assert queue.discard(gone) is False
    assert [i.name for i in queue.decide(1).batch] == ["kept"]


def test_without_dynamic_batching_each_batch_is_one_request() -> None:
    queue: RequestQueue[Named] = RequestQueue(max_batch_size=8, dynamic_batching=None)
    push(queue, 0)
    push(queue, 0)
    assert len(queue.decide(0).batch) == 1


def test_flush_ignores_the_queue_delay() -> None:
    queue = make_queue(max_queue_delay_microseconds=10**9)
    push(queue, 0)
    assert sizes(queue.decide(1, flush=True)) == 1


workloads = st.lists(
    st.tuples(st.integers(1, 4), st.sampled_from(["a", "b"]), st.integers(0, 2)), min_size=1, max_size=40
)


@settings(max_examples=200, deadline=None)
@given(workloads, st.integers(1, 8), st.integers(0, 5))
def test_the_queue_never_holds_more_than_max_queue_size_and_every_request_leaves_once(
    workload: list[tuple[int, str, int]], max_batch: int, max_queue: int
) -> None:
    queue = make_queue(max_batch_size=max_batch, max_queue_delay_microseconds=10,
                       default_queue_policy=QueuePolicy(max_queue_size=max_queue), priority_levels=2,
                       default_priority_level=1)
    accepted: list[QueuedRequest] = []
    now = 0
    for cost, signature, priority in workload:
        now += 3 * US
        try:
            accepted.append(push(queue, now, cost=min(cost, max_batch), signature=signature, priority=priority))
        except QueueFullError:
            pass
        if max_queue:
            assert all(queue._sizes[level] <= max_queue for level in queue.levels)  # noqa: SLF001 - invariant check
        decision = queue.decide(now)
        assert sizes(decision) <= max_batch
        assert len({item.signature for item in decision.batch}) <= 1
    taken: list[QueuedRequest] = []
    while len(queue):
        now += 100 * US
        taken.extend(queue.decide(now).batch)
    # every accepted request leaves exactly once
    assert len(taken) + sum(1 for i in accepted if i.removed) >= len(accepted)


def _items(queue: RequestQueue[Named], now: int, count: int, timeout_us: int | None = None) -> list[Named]:
    level = queue.level_for(0)
    return [Named(cost=1, signature="s", level=level, enqueued_ns=now,
                  deadline_ns=queue.deadline_for(level, now, timeout_us), name=str(index)) for index in range(count)]


def test_push_many_queues_in_order_as_much_as_max_queue_size_lets_in() -> None:
    queue = make_queue(default_queue_policy=QueuePolicy(max_queue_size=3), max_queue_delay_microseconds=0)
    push(queue, 0, name="before")
    items = _items(queue, 0, 4)
    assert queue.push_many(items) == 2  # one place was taken: two of the four fit
    assert len(queue) == 3 and queue.queued_cost == 3
    assert [item.name for item in queue.decide(0).batch] == ["before", "0", "1"]
    assert queue.push_many(items[2:]) == 2  # room again
    assert queue.push_many([]) == 0


def test_push_many_times_out_each_request_as_push_does() -> None:
    queue = make_queue(default_queue_policy=QueuePolicy(default_timeout_microseconds=50),
                       max_queue_delay_microseconds=10**9)
    items = _items(queue, 0, 3)
    assert queue.push_many(items) == 3
    assert queue.decide(40 * US).wake_at_ns == 50 * US
    assert set(queue.decide(60 * US).expired) == set(items)
    assert len(queue) == 0


def test_waiting_counts_the_requests_each_entry_stands_for_until_it_leaves() -> None:
    queue = make_queue(max_batch_size=8, max_queue_delay_microseconds=100)
    bundle = Named(cost=3, signature="s", level=0, enqueued_ns=0, deadline_ns=0, name="bundle")
    bundle.count = 3
    queue.push(bundle)
    push(queue, 0, name="one")
    assert (len(queue), queue.waiting, queue.queued_cost) == (2, 4, 4)
    queue.recost(bundle, 2, 2)  # a request left the bundle
    assert (bundle.cost, bundle.count, queue.waiting, queue.queued_cost) == (2, 2, 3, 3)
    decision = queue.decide(200 * US)
    assert [item.name for item in decision.batch] == ["bundle", "one"]
    assert (len(queue), queue.waiting, queue.queued_cost) == (0, 0, 0)
    queue.hold(decision.batch)
    assert queue.held == 3
    queue.release(decision.batch)
    assert queue.held == 0


# -- entries of several requests cut at the batch's bound --------------------------------


@dataclass(slots=True, eq=False)
class Run(QueuedRequest):
    """An entry of ``count`` alike requests, numbered from ``first`` (a bundle's)."""

    name: str
    first: int = 0

    def requests(self) -> list[tuple[str, int]]:
        return [(self.name, self.first + index) for index in range(self.count)]


def cut_run(item: Run, count: int) -> Run:
    """The queue's splitter for Runs: the first ``count`` requests, ``item`` keeps the rest."""
    part = Run(cost=item.cost // item.count * count, signature=item.signature, level=item.level,
               enqueued_ns=item.enqueued_ns, deadline_ns=item.deadline_ns, name=item.name, first=item.first)
    part.count = count
    item.first += count
    return part


def push_run(queue: RequestQueue[Run], now: int, name: str, count: int, each: int = 1, signature: object = "s") -> Run:
    run = Run(cost=each * count, signature=signature, level=0, enqueued_ns=now, deadline_ns=0, name=name)
    run.count = count
    queue.push(run)
    return run


def taken(decision) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    return [request for item in decision.batch for request in item.requests()]


def test_an_entry_of_several_requests_gives_the_batch_what_fits_and_keeps_its_place() -> None:
    queue: RequestQueue[Run] = RequestQueue(max_batch_size=8, dynamic_batching=DynamicBatching())
    queue.splitter = cut_run
    push_run(queue, 0, "a", 3)
    b = push_run(queue, 0, "b", 4, each=2)
    push_run(queue, 0, "c", 1)
    first = queue.decide(0)
    assert taken(first) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]  # 3 + 2 x 2 rows of 8
    assert first.batch[-1] is not b and first.batch[-1].removed
    assert (b.cost, b.count, len(queue), queue.waiting, queue.queued_cost) == (4, 2, 2, 3, 5)
    assert taken(queue.decide(0)) == [("b", 2), ("b", 3), ("c", 0)]  # the rest first, in its place
    assert (len(queue), queue.waiting, queue.queued_cost) == (0, 0, 0)


def test_without_a_splitter_or_room_for_one_request_an_entry_waits_whole() -> None:
    queue: RequestQueue[Run] = RequestQueue(max_batch_size=8, dynamic_batching=DynamicBatching())
    push_run(queue, 0, "a", 3)
    push_run(queue, 0, "b", 4, each=2)
    assert len(taken(queue.decide(0))) == 3  # no splitter: the bundle waits for the next batch
    queue = RequestQueue(max_batch_size=8, dynamic_batching=DynamicBatching())
    queue.splitter = cut_run
    push_run(queue, 0, "a", 7)
    push_run(queue, 0, "b", 4, each=2)
    assert len(taken(queue.decide(0))) == 7  # 1 row of room, 2 rows a request


def test_with_preferred_sizes_an_entry_is_cut_only_where_the_batch_reaches_max_batch_size() -> None:
    batching = DynamicBatching(preferred_batch_size=[4], max_queue_delay_microseconds=100)
    queue: RequestQueue[Run] = RequestQueue(max_batch_size=8, dynamic_batching=batching)
    queue.splitter = cut_run
    push_run(queue, 0, "a", 2)
    push_run(queue, 0, "b", 4)
    push_run(queue, 0, "c", 4)
    assert taken(queue.decide(10 * US)) == [("a", 0), ("a", 1)]  # "b" would pass 4: the prefix leaves whole
    assert taken(queue.decide(200 * US)) == [("b", 0), ("b", 1), ("b", 2), ("b", 3), ("c", 0), ("c", 1), ("c", 2),
                                             ("c", 3)]
    push_run(queue, 300 * US, "d", 6)
    push_run(queue, 300 * US, "e", 6)
    assert len(taken(queue.decide(500 * US))) == 8  # past the delay: up to max_batch_size, "e" cut
    assert taken(queue.decide(700 * US)) == [("e", 2), ("e", 3), ("e", 4), ("e", 5)]


runs = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3), st.sampled_from(["a", "b"]), st.booleans()),
                min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(runs, st.integers(3, 12), st.sampled_from([0, 50]), st.booleans())
def test_entries_cut_at_the_bound_form_the_batches_their_requests_would_one_by_one(
    workload: list[tuple[int, int, str, bool]], max_batch: int, delay_us: int, only_full: bool
) -> None:
    batching = DynamicBatching(max_queue_delay_microseconds=delay_us)
    bundled: RequestQueue[Run] = RequestQueue(max_batch_size=max_batch, dynamic_batching=batching)
    bundled.splitter = cut_run
    single: RequestQueue[Run] = RequestQueue(max_batch_size=max_batch, dynamic_batching=batching)
    now = 0
    for index, (count, each, signature, decide) in enumerate(workload):
        now += 20 * US
        each = min(each, max_batch)
        push_run(bundled, now, str(index), count, each, signature)
        for first in range(count):
            single.push(Run(cost=each, signature=signature, level=0, enqueued_ns=now, deadline_ns=0,
                            name=str(index), first=first))
        if decide:
            expected = single.decide(now, only_full=only_full)
            got = bundled.decide(now, only_full=only_full)
            assert taken(got) == taken(expected)
            assert got.wake_at_ns == expected.wake_at_ns
            assert (bundled.waiting, bundled.queued_cost) == (single.waiting, single.queued_cost)
    while len(single):
        now += 100 * US
        assert taken(bundled.decide(now)) == taken(single.decide(now))
    assert len(bundled) == 0
