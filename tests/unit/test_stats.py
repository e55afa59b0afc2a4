"""ModelStats: a batch's successes recorded at once give Triton's per-request totals."""

from __future__ import annotations

import bisect

from hypothesis import given
from hypothesis import strategies as st

from nereid.stats import QUEUE_BUCKETS_US, ModelStats

NS = st.integers(min_value=0, max_value=10**12)


@given(
    requests=st.lists(st.tuples(NS, NS), min_size=0, max_size=40),
    compute=st.tuples(NS, NS, NS),
)
def test_record_successes_charges_every_request_its_own_times_and_the_batch_compute(
    requests: list[tuple[int, int]], compute: tuple[int, int, int]
) -> None:
    stats = ModelStats("m", 1)
    stats.record_successes(sum(t for t, _ in requests), [q for _, q in requests], *compute)
    count = len(requests)
    inference = stats.snapshot()["inference_stats"]
    assert inference["success"] == {"count": count, "ns": sum(t for t, _ in requests)}
    assert inference["queue"] == {"count": count, "ns": sum(q for _, q in requests)}
    for key, ns in zip(("compute_input", "compute_infer", "compute_output"), compute):
        assert inference[key] == {"count": count, "ns": ns * count}
    expected = [0] * (len(QUEUE_BUCKETS_US) + 1)
    for _, queue_ns in requests:
        expected[bisect.bisect_left([us * 1000 for us in QUEUE_BUCKETS_US], queue_ns)] += 1
    assert stats.queue_buckets == expected


@given(requests=st.lists(st.tuples(NS, NS), min_size=1, max_size=20), compute=st.tuples(NS, NS, NS))
def test_record_successes_equals_one_record_success_per_request(
    requests: list[tuple[int, int]], compute: tuple[int, int, int]
) -> None:
    one_by_one = ModelStats("m", 1)
    at_once = ModelStats("m", 1)
    for total_ns, queue_ns in requests:
        one_by_one.record_success(total_ns, queue_ns, *compute)
    at_once.record_successes(sum(t for t, _ in requests), [q for _, q in requests], *compute)
    for stats in (one_by_one, at_once):
        stats.last_inference_ms = 0  # wall clock: not part of the comparison
    assert at_once.snapshot() == one_by_one.snapshot()
    assert at_once.queue_buckets == one_by_one.queue_buckets


def _busy(stats: ModelStats) -> None:
    stats.record_batch(3, 300, [1, 2, 3], (4, 5, 6), (7, 8, 9))
    stats.record_batch(1, 100, [4], (1, 1, 1), (2, None, 3))
    stats.record_failure(50, "REJECTED")
    stats.record_answer(12)
    stats.record_formation(13)


def test_counters_make_a_model_stats_that_reports_the_same() -> None:
    stats = ModelStats("m", 2)
    _busy(stats)
    again = ModelStats.from_counters("m", 2, stats.counters())
    assert again.snapshot() == stats.snapshot()
    assert again.scheduling_json() == stats.scheduling_json()
    assert again.counters() == stats.counters()


def test_every_record_marks_the_figures_changed() -> None:
    stats = ModelStats("m", 1)
    records = [
        lambda: stats.record_batch(2, 10, [1, 2], (1, 1, 1), None),
        lambda: stats.record_batch(2, 10, [], (1, 1, 1), (1, None, 1)),
        lambda: stats.record_execution(1, 1, 1, 1),
        lambda: stats.record_success(1, 1, 1, 1, 1),
        lambda: stats.record_successes(2, [1, 1], 1, 1, 1),
        lambda: stats.record_failure(1, "CANCELED"),
        lambda: stats.record_scheduling(1, 2, 3),
        lambda: stats.record_answer(1),
        lambda: stats.record_formation(1),
    ]
    for index, record in enumerate(records):
        stats.changed = False
        before = stats.counters()
        record()
        assert stats.changed, index
        assert stats.counters() != before, index
    assert stats.changed_batch_sizes == {1, 2}
