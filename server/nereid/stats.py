"""Per-model-version counters and cumulative durations, in Triton's statistics shape.

Owns the numbers and their JSON-ready snapshot (protocol.md §1.3.4). Updated only from
the event loop (the batcher's tasks), so no locks. Knows nothing about HTTP or Prometheus.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Duration", "BatchStats", "ModelStats", "QUEUE_BUCKETS_US", "COUNTERS_HEAD", "COUNTERS_PER_BATCH_SIZE"]

#: Upper bounds (inclusive, microseconds) of the queue-time distribution kept per model;
#: ``ModelStats.queue_buckets`` has one more slot for longer waits.
QUEUE_BUCKETS_US = (50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000,
                    250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000)
_QUEUE_BUCKETS_NS = tuple(us * 1000 for us in QUEUE_BUCKETS_US)

#: ``ModelStats.counters()``: this many integers, then ``COUNTERS_PER_BATCH_SIZE`` per batch size
COUNTERS_HEAD = 24
COUNTERS_PER_BATCH_SIZE = 7


@dataclass(slots=True)
class Duration:
    """A count and cumulative nanoseconds (Triton's ``{"count", "ns"}``)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    """Executions at one batch size, with their cumulative compute durations."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ModelStats:
    """Statistics of one model version, as Triton counts them.

    ``success``/``fail`` count requests with their end-to-end time; ``queue`` and the
    three ``compute_*`` count successful requests (each request of a batch is charged the
    batch's compute time, as Triton does); ``inference_count`` counts rows,
    ``execution_count`` batches; ``batch_stats`` is keyed by batch size in rows.
    """

    name: str
    version: int
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batch_stats: dict[int, BatchStats] = field(default_factory=dict)
    #: failures by Triton's metric reason: REJECTED, CANCELED, BACKEND, OTHER.
    failures_by_reason: dict[str, int] = field(
        default_factory=lambda: {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    )
    #: successful requests by queue time: slot i counts waits <= QUEUE_BUCKETS_US[i]
    #: (and above the previous bound); the last slot counts longer waits.
    queue_buckets: list[int] = field(default_factory=lambda: [0] * (len(QUEUE_BUCKETS_US) + 1))
    #: nereid's scheduling view (``scheduling_json``), per batch: how long its instance was
    #: busy with it (as the instance times it: a thread instance from picking it up to
    #: handing back its split outputs, a process instance while the batch holds its turn in
    #: the process), how long the instance stood idle between the batch before and this one
    #: when this one was ready as that one ended (the gap pipelining closes), and the
    #: event loop's time to form it and to answer its requests.
    busy: Duration = field(default_factory=Duration)
    idle_between: Duration = field(default_factory=Duration)
    formation: Duration = field(default_factory=Duration)
    answer: Duration = field(default_factory=Duration)
    #: whether anything changed, and the batch sizes whose ``batch_stats`` entry changed,
    #: since the front-end workers' table took the figures (frontends/shared_stats.py
    #: resets both; otherwise they cost a store per record and an add per batch)
    changed: bool = False
    changed_batch_sizes: set[int] = field(default_factory=set)

    def record_execution(
        self, rows: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One successful batch of ``rows`` rows."""
        entry = self._executed(rows)
        entry.compute_input.add(compute_input_ns)
        entry.compute_infer.add(compute_infer_ns)
        entry.compute_output.add(compute_output_ns)

    def _executed(self, rows: int) -> BatchStats:
        """One more batch of ``rows`` rows counted; the entry of its batch size."""
        self.changed = True
        self.execution_count += 1
        self.inference_count += rows
        self.changed_batch_sizes.add(rows)
        entry = self.batch_stats.get(rows)
        if entry is None:
            entry = self.batch_stats[rows] = BatchStats()
        return entry

    def record_success(
        self,
        total_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One successful request."""
        self.record_successes(total_ns, [queue_ns], compute_input_ns, compute_infer_ns, compute_output_ns)

    def record_successes(
        self,
        total_ns: int,
        queue_times_ns: list[int],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """The successful requests of one batch at once: ``total_ns`` is the sum of their
        end-to-end times, ``queue_times_ns`` one entry per request; each is charged the
        batch's compute times, as Triton does."""
        self.changed = True
        count = len(queue_times_ns)
        if not count:
            return
        self.success.add(total_ns, count)
        self.queue.add(sum(queue_times_ns), count)
        for queue_ns in queue_times_ns:
            self.record_queue_time(queue_ns)
        self.compute_input.add(compute_input_ns * count, count)
        self.compute_infer.add(compute_infer_ns * count, count)
        self.compute_output.add(compute_output_ns * count, count)
        self.last_inference_ms = time.time_ns() // 1_000_000  # reported as wall-clock ms

    def record_batch(
        self, rows: int, total_ns: int, queue_times_ns: list[int], compute: tuple[int, int, int],
        scheduling: tuple[int, int | None, int] | None,
    ) -> None:
        """One successful batch, in one call: ``record_execution`` and ``record_successes``
        (``compute``: its input, infer and output ns), and its ``record_scheduling``
        figures (busy, idle, formation ns; None: not counted, a rerun). Spelled out: once
        per batch on the event loop."""
        compute_input_ns, compute_infer_ns, compute_output_ns = compute
        entry = self._executed(rows)
        entry.compute_input.count += 1
        entry.compute_input.ns += compute_input_ns
        entry.compute_infer.count += 1
        entry.compute_infer.ns += compute_infer_ns
        entry.compute_output.count += 1
        entry.compute_output.ns += compute_output_ns
        count = len(queue_times_ns)
        if count:
            self.success.count += count
            self.success.ns += total_ns
            self.queue.count += count
            self.queue.ns += sum(queue_times_ns)
            buckets = self.queue_buckets
            for queue_ns in queue_times_ns:
                buckets[bisect.bisect_left(_QUEUE_BUCKETS_NS, queue_ns)] += 1
            self.compute_input.count += count
            self.compute_input.ns += compute_input_ns * count
            self.compute_infer.count += count
            self.compute_infer.ns += compute_infer_ns * count
            self.compute_output.count += count
            self.compute_output.ns += compute_output_ns * count
            self.last_inference_ms = time.time_ns() // 1_000_000  # reported as wall-clock ms
        if scheduling is not None:
            self.record_scheduling(*scheduling)

    def record_scheduling(self, busy_ns: int, idle_ns: int | None, formation_ns: int) -> None:
        """One batch's time on its instance, the instance's idle time before it (None: it
        was not ready when the batch before ended) and the time forming it took."""
        self.changed = True
        self.busy.count += 1
        self.busy.ns += busy_ns
        if idle_ns is not None:
            self.idle_between.count += 1
            self.idle_between.ns += idle_ns
        self.formation.count += 1
        self.formation.ns += formation_ns

    def record_queue_time(self, queue_ns: int) -> None:
        """Count one successful request's queue time in ``queue_buckets``."""
        self.changed = True
        self.queue_buckets[bisect.bisect_left(_QUEUE_BUCKETS_NS, queue_ns)] += 1

    def record_failure(self, total_ns: int, reason: str = "OTHER", count: int = 1) -> None:
        """One failed request (``count`` alike, each after ``total_ns``); ``reason`` is
        Triton's metric label."""
        self.changed = True
        self.fail.add(total_ns * count, count)
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + count
        self.last_inference_ms = time.time_ns() // 1_000_000

    def record_answer(self, ns: int) -> None:
        """The event loop's time answering one batch's requests (``batch_answer``)."""
        self.changed = True
        self.answer.count += 1
        self.answer.ns += ns

    def record_formation(self, ns: int) -> None:
        """The event loop's time forming one batch (``batch_formation``)."""
        self.changed = True
        self.formation.count += 1
        self.formation.ns += ns

    def counters(self) -> list[int]:
        """Every figure the statistics answers report (``snapshot``, ``scheduling_json``),
        as integers: ``COUNTERS_HEAD`` of them, then ``COUNTERS_PER_BATCH_SIZE`` per batch
        size (size first). ``from_counters`` makes the ModelStats that reports the same."""
        values = self.head_counters()
        for size in self.batch_stats:
            values += self.batch_counters(size)
        return values

    def head_counters(self) -> list[int]:
        """The first ``COUNTERS_HEAD`` of ``counters()``: all but the batch sizes' figures
        (the last one: how many batch sizes follow). Spelled out: the main process takes
        them after each batch when front-end workers answer statistics."""
        success, fail, queue, busy, idle, formation, answer = (
            self.success, self.fail, self.queue, self.busy, self.idle_between, self.formation, self.answer)
        compute_input, compute_infer, compute_output = self.compute_input, self.compute_infer, self.compute_output
        return [
            self.last_inference_ms, self.inference_count, self.execution_count, success.count, success.ns,
            fail.count, fail.ns, queue.count, queue.ns, compute_input.count, compute_input.ns,
            compute_infer.count, compute_infer.ns, compute_output.count, compute_output.ns, busy.count, busy.ns,
            idle.count, idle.ns, formation.count, formation.ns, answer.count, answer.ns, len(self.batch_stats),
        ]

    def batch_counters(self, size: int) -> tuple[int, ...]:
        """The ``COUNTERS_PER_BATCH_SIZE`` figures of batch size ``size`` in ``counters()``."""
        entry = self.batch_stats[size]
        compute_input, compute_infer, compute_output = entry.compute_input, entry.compute_infer, entry.compute_output
        return (size, compute_input.count, compute_input.ns, compute_infer.count, compute_infer.ns,
                compute_output.count, compute_output.ns)

    @classmethod
    def from_counters(cls, name: str, version: int, values: Sequence[int]) -> ModelStats:
        """The ModelStats whose ``counters()`` are ``values`` (what it does not report, the
        failures by reason and the queue-time buckets, left at zero)."""
        stats = cls(name, version, last_inference_ms=values[0], inference_count=values[1],
                    execution_count=values[2])
        durations = [Duration(values[index], values[index + 1]) for index in range(3, COUNTERS_HEAD - 1, 2)]
        (stats.success, stats.fail, stats.queue, stats.compute_input, stats.compute_infer, stats.compute_output,
         stats.busy, stats.idle_between, stats.formation, stats.answer) = durations
        at = COUNTERS_HEAD
        for _ in range(values[COUNTERS_HEAD - 1]):
            size, *figures = values[at:at + COUNTERS_PER_BATCH_SIZE]
            stats.batch_stats[size] = BatchStats(
                Duration(figures[0], figures[1]), Duration(figures[2], figures[3]), Duration(figures[4], figures[5]))
            at += COUNTERS_PER_BATCH_SIZE
        return stats

    def scheduling_json(self) -> dict[str, dict[str, int]]:
        """nereid's scheduling figures (the statistics' ``scheduling`` entry): cumulative
        ``{"count", "ns"}`` per batch for ``instance_busy``, ``instance_idle_between_batches``,
        ``batch_formation`` and ``batch_answer``."""
        return {
            "instance_busy": self.busy.as_json(),
            "instance_idle_between_batches": self.idle_between.as_json(),
            "batch_formation": self.formation.as_json(),
            "batch_answer": self.answer.as_json(),
        }

    def snapshot(self) -> dict[str, Any]:
        """The ``model_stats`` entry of Triton's statistics JSON."""
        zero = {"count": 0, "ns": 0}
        return {
            "name": self.name,
            "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": dict(zero),
                "cache_miss": dict(zero),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": entry.compute_input.as_json(),
                    "compute_infer": entry.compute_infer.as_json(),
                    "compute_output": entry.compute_output.as_json(),
                }
                for size, entry in sorted(self.batch_stats.items())
            ],
            "memory_usage": [],
        }
