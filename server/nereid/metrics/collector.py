"""The metric families of one server: Triton's per-model series plus nereid's batching
view, read from ModelStats at scrape time (``ModelStatsCollector``), the refusals of
restricted groups, the families model code made (``CustomMetricsCollector``), each server's own registry (``Metrics``), and the Prometheus text
they are rendered as (``render``). The listener serving them is ``listener.py``'s.
"""

from __future__ import annotations

import math
from operator import attrgetter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from nereid.custom_metrics import CustomMetrics, FamilyReading, MetricKind
from nereid.network.access import Refusals
from nereid.models.manager import ModelManager
from nereid.stats import QUEUE_BUCKETS_US, ModelStats

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "CONTENT_TYPE",
    "CustomMetricsCollector",
    "Metrics",
    "ModelReading",
    "ModelStatsCollector",
    "render",
]

CONTENT_TYPE = "text/plain; charset=utf-8"
#: Upper bounds of the batch-size histogram (rows per executed batch).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Triton's failure reasons; every one is reported, zeros included.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(frozen=True, slots=True)
class ModelReading:
    """What one scrape reads of a served model version: its statistics, the requests
    waiting in its queue, and the batches running now."""

    stats: ModelStats
    pending: int = 0
    executing: int = 0
    restarts: int = 0


def read_models(manager: ModelManager) -> list[ModelReading]:
    """A ModelReading per READY model version."""
    return [
        ModelReading(s.stats, s.queue_depth, s.executing, s.restarts) for s in manager.serving_models()
    ]


# -- the collector ------------------------------------------------------------------------

def _microseconds(duration: str) -> Callable[[ModelStats], float]:
    """The cumulative time of the ModelStats duration named ``duration``, in microseconds."""
    read_ns = attrgetter(duration + ".ns")
    return lambda stats: read_ns(stats) // 1000


# (name, help, value of a ModelStats) for Triton's per-model counters.
_COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], float]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)", _microseconds("success")),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", _microseconds("queue")),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     _microseconds("compute_input")),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     _microseconds("compute_infer")),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     _microseconds("compute_output")),
)


class ModelStatsCollector(Collector):
    """Metric families built from ``readings()`` at every collect (scrape)."""

    def __init__(self, readings: Callable[[], Sequence[ModelReading]]) -> None:
        self._readings = readings

    def collect(self) -> Iterator[Metric]:
        readings = self._readings()
        labelled = [({"model": r.stats.name, "version": str(r.stats.version)}, r) for r in readings]

        success_name, success_help, success_of = _COUNTERS[0]
        yield _counter(success_name, success_help, ((labels, success_of(r.stats)) for labels, r in labelled))
        failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter")
        for labels, r in labelled:
            by_reason = r.stats.failures_by_reason
            for reason in (*FAILURE_REASONS, *sorted(set(by_reason) - set(FAILURE_REASONS))):
                failure.add_sample(failure.name, {**labels, "reason": reason}, by_reason.get(reason, 0))
        yield failure
        for name, help_text, value_of in _COUNTERS[1:]:
            yield _counter(name, help_text, ((labels, value_of(r.stats)) for labels, r in labelled))

        for family, name, help_text, values_of in _PER_MODEL:
            metric = family(name, help_text, labels=("model", "version"))
            for labels, r in labelled:
                metric.add_metric([labels["model"], labels["version"]], *values_of(r))
            yield metric
        for name, help_text, microseconds in _SCHEDULING:
            yield _counter(name, help_text, ((labels, microseconds(r)) for labels, r in labelled))
        yield _counter(
            "nereid_instance_restarts",
            "Restarts of a model version's process instances (a crash, an exit, an execution timeout).",
            ((labels, r.restarts) for labels, r in labelled),
        )


def _batch_sizes(reading: ModelReading) -> tuple[list[tuple[str, float]], int]:
    """The batch-size histogram's buckets and sum. batch_stats counts executions per exact
    size: the histogram is exact."""
    executions = {size: entry.compute_infer.count for size, entry in reading.stats.batch_stats.items()}
    counts = [
        sum(n for size, n in executions.items() if low < size <= high)
        for low, high in zip((0, *BATCH_SIZE_BUCKETS), BATCH_SIZE_BUCKETS)
    ]
    return _buckets(BATCH_SIZE_BUCKETS, counts, sum(executions.values())), sum(size * n for size, n in executions.items())


def _queue_times(reading: ModelReading) -> tuple[list[tuple[str, float]], float]:
    """The queue-time histogram's buckets and sum (microseconds)."""
    counts = reading.stats.queue_buckets
    return _buckets(QUEUE_BUCKETS_US, counts, sum(counts)), reading.stats.queue.ns / 1000


# (family, name, help, its values for a ModelReading) for the per-model gauges and histograms.
_PER_MODEL: tuple[
    tuple[type[GaugeMetricFamily | HistogramMetricFamily], str, str, Callable[[ModelReading], tuple[Any, ...]]], ...
] = (
    (GaugeMetricFamily, "nv_inference_pending_request_count",
     "Instantaneous number of pending requests awaiting execution per-model.", lambda r: (r.pending,)),
    (HistogramMetricFamily, "nereid_batch_size",
     "Rows per batch executed by the dynamic batcher (successful executions).", _batch_sizes),
    (HistogramMetricFamily, "nereid_queue_duration_us",
     "Time successful requests waited in the queue, in microseconds.", _queue_times),
    (GaugeMetricFamily, "nereid_batches_executing",
     "Batches a model version's instances are executing now.", lambda r: (r.executing,)),
)


#: nereid's scheduling counters per model version (stats.ModelStats.scheduling_json):
#: (name, help, microseconds for a ModelReading).
_SCHEDULING: tuple[tuple[str, str, Callable[[ModelReading], float]], ...] = (
    ("nereid_instance_busy_us",
     "Cumulative time the model version's instances executed batches, in microseconds "
     "(its rate: the share of wall time an instance is busy).",
     lambda r: r.stats.busy.ns / 1000),
    ("nereid_instance_idle_between_batches_us",
     "Cumulative time instances stood idle between a batch and the next one, ready at once, in microseconds.",
     lambda r: r.stats.idle_between.ns / 1000),
    ("nereid_batch_formation_us",
     "Cumulative event-loop time spent forming batches, in microseconds.",
     lambda r: r.stats.formation.ns / 1000),
    ("nereid_batch_answer_us",
     "Cumulative event-loop time spent answering executed batches' requests, in microseconds.",
     lambda r: r.stats.answer.ns / 1000),
)


def _counter(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> Metric:
    # A bare Metric, not CounterMetricFamily: that one names its samples <name>_total.
    metric = Metric(name, help_text, "counter")
    for labels, value in samples:
        metric.add_sample(name, labels, value)
    return metric


def _buckets(bounds: Sequence[int], counts: Sequence[int], total: int) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs from per-bucket counts, ``+Inf`` = ``total``."""
    pairs: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip(bounds, counts):
        running += count
        pairs.append((_number(bound), running))
    pairs.append(("+Inf", total))
    return pairs


# -- rendering ----------------------------------------------------------------------------

_TYPE_NAMES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text format (0.0.4) of everything in ``registry``, names as given."""
    lines: list[str] = []
    for metric in registry.collect():
        name = metric.name
        samples = [s for s in metric.samples if s.name != name + "_created"]
        if metric.type == "counter" and any(s.name == name + "_total" for s in samples):
            name += "_total"  # a prometheus_client Counter someone registered: keep its sample names
        elif metric.type == "info":
            name += "_info"
        help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {_TYPE_NAMES.get(metric.type, metric.type)}")
        for sample in samples:
            if sample.labels:
                # sorted, ``le`` last: prometheus-cpp's (Triton's) order
                ordered = sorted(sample.labels.items(), key=lambda item: (item[0] == "le", item[0]))
                labels = ",".join(f'{key}="{_escape(value)}"' for key, value in ordered)
                lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
            else:
                lines.append(f"{sample.name} {_number(sample.value)}")
    lines.append("")
    return "\n".join(lines).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    """Integral values without a decimal point (as Triton writes counters), others as
    Python's shortest repr; NaN and infinities in Prometheus' spelling."""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, _Exact):
        return _cpp_number(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


# -- custom metrics (model code's) ----------------------------------------------------------


class CustomMetricsCollector(Collector):
    """The families model code made (``pb_utils.MetricFamily``, ``context.metric_family``),
    written as Triton's prometheus-cpp writes them: a histogram's ``_count`` and ``_sum``
    before its buckets, values with 16 significant digits."""

    def __init__(self, registry: CustomMetrics) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.read():
            yield _custom_family(family)


def _custom_family(family: FamilyReading) -> Metric:
    metric = Metric(family.name, family.description, family.kind.value)
    for series in family.series:
        labels = dict(series.labels)
        if family.kind is not MetricKind.HISTOGRAM:
            metric.add_sample(family.name, labels, _Exact(series.value))
            continue
        metric.add_sample(family.name + "_count", labels, series.count)
        metric.add_sample(family.name + "_sum", labels, _Exact(series.total))
        for bound, count in zip((*series.bounds, math.inf), series.cumulative):
            metric.add_sample(family.name + "_bucket", {**labels, "le": _cpp_number(bound)}, count)
    return metric


class _Exact(float):
    """A value written as prometheus-cpp writes a double (``render``)."""


def _cpp_number(value: float) -> str:
    """A double as prometheus-cpp writes it (``%.16g``; ``+Inf``, ``NaN``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return format(value, ".16g")


# -- the server's metrics -----------------------------------------------------------------


class RefusalsCollector(Collector):
    """``nereid_restricted_refusals``: requests refused for want of a restricted group's
    key, by protocol (http, grpc, metrics) and group. Only groups that refused appear."""

    def __init__(self, refusals: Refusals) -> None:
        self._refusals = refusals

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "nereid_restricted_refusals",
            "Requests refused for want of a restricted endpoint group's key (--http-restricted-api, "
            "--grpc-restricted-protocol, --metrics-restricted-api)",
            (({"protocol": protocol, "group": group}, count)
             for (protocol, group), count in sorted(self._refusals.counts.items())),
        )


class Metrics:
    """One server's registry: Triton's per-model series and nereid's batching series
    for the models of ``manager``, and the refusals of restricted groups.
    ``registry`` is exposed for extra collectors."""

    def __init__(self, manager: ModelManager, refusals: Refusals | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ModelStatsCollector(lambda: read_models(manager)))
        if refusals is not None:
            self.registry.register(RefusalsCollector(refusals))
        self.registry.register(CustomMetricsCollector(manager.custom_metrics))

    def render(self) -> bytes:
        return render(self.registry)
