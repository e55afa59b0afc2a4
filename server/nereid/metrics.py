"""Prometheus metrics for the metrics port: Triton's per-model series plus nereid's
batching view, read from ModelStats at scrape time, and the tiny listener serving them.

The only module that knows prometheus_client. Each server builds its own ``Metrics``
(its own CollectorRegistry), so two servers in one process never share a series.
Nothing is counted twice: a Collector turns the ModelStats counters the batcher keeps
into metric families when ``/metrics`` is scraped.

Two choices worth knowing:

* Text rendering is done here, not by ``prometheus_client.generate_latest``: that one
  renames every counter to ``<name>_total``, and Triton's series (and the dashboards and
  tools written for them) have no such suffix. The renderer below writes Prometheus text
  format 0.0.4 with the names as given, integral values without a decimal point, labels
  sorted, as Triton's prometheus-cpp does.
* The listener is a minimal HTTP/1.1 responder on ``asyncio.start_server`` in the
  server's own event loop, so it works the same under uvicorn, hypercorn and granian and
  reads the statistics on the thread that writes them. It answers exactly what Triton's
  metrics port answers: ``GET /metrics`` (or ``/metrics/``) the text, any other GET path
  200 with an empty body, any other method 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from operator import attrgetter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from nereid.network.access import Refusals, Restriction
from nereid.models.manager import ModelManager
from nereid.stats import QUEUE_BUCKETS_US, ModelStats

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "CONTENT_TYPE",
    "Metrics",
    "MetricsListener",
    "ModelReading",
    "ModelStatsCollector",
    "render",
]

_log = logging.getLogger("nereid.metrics")

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
                labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(sample.labels.items()))
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
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


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

    def render(self) -> bytes:
        return render(self.registry)


# -- the listener -------------------------------------------------------------------------

_MAX_HEADER_LINES = 100
_MAX_BODY = 1 << 20
_IDLE_SECONDS = 75.0
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed"}


class MetricsListener:
    """A minimal HTTP/1.1 server for the metrics port, on the running event loop.

    ``await listener.start(host, port)`` binds (port 0 picks one; ``listener.port``
    tells which); ``await listener.aclose()`` stops listening and drops connections.
    Keep-alive and pipelined requests are served in order; request bodies are read and
    ignored; anything unparsable gets 400 and the connection is closed.
    """

    def __init__(
        self, render: Callable[[], bytes], restriction: Restriction | None = None, refusals: Refusals | None = None,
    ) -> None:
        self._render = render
        #: --metrics-restricted-api: the header every request needs (None: none)
        self._restriction = restriction
        self._refusals = refusals if refusals is not None else Refusals()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port: int | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._connection, host, port, limit=64 * 1024)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True to keep the connection for the next one."""
        line = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        while line in (b"\r\n", b"\n"):  # stray CRLF between requests (RFC 9112 §2.2)
            line = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        if not line:
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _respond(writer, 400, b"", close=True)
            return False
        method, target, version = parts
        head = await _read_headers(reader, version == "HTTP/1.1", self._restriction)
        if head is None:
            await _respond(writer, 400, b"", close=True)
            return False
        if head.chunked or head.length > _MAX_BODY:
            head.keep_alive = False  # the body is not read: the connection cannot be reused
        elif head.length:
            await reader.readexactly(head.length)
        await self._answer(writer, method, target, head)
        return head.keep_alive

    async def _answer(self, writer: asyncio.StreamWriter, method: str, target: str, head: _Head) -> None:
        """What Triton's metrics port answers ``method`` on ``target``."""
        path = target.split("?", 1)[0]
        if "://" in path:  # absolute-form target
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        close = not head.keep_alive
        restriction = self._restriction
        if restriction is not None and not restriction.allows(head.presented):
            self._refusals.count("metrics", "metrics")
            body = json.dumps({"error": restriction.http_message()}, separators=(",", ":")).encode()
            await _respond(writer, 403, body, close=close, content_type="application/json",
                           head_only=method == "HEAD")
        elif method != "GET":
            await _respond(writer, 405, b'{"error":"Method Not Allowed"}', close=close,
                           content_type="application/json", head_only=method == "HEAD")
        elif path in ("/metrics", "/metrics/"):
            await _respond(writer, 200, self._render(), close=close)
        else:
            await _respond(writer, 200, b"", close=close)


@dataclass(slots=True)
class _Head:
    """What the listener reads of a request's headers."""

    keep_alive: bool
    length: int = 0
    chunked: bool = False
    #: the value of the restricted group's key header, when the metrics API is restricted
    presented: str | None = None


async def _read_headers(
    reader: asyncio.StreamReader, keep_alive: bool, restriction: Restriction | None
) -> _Head | None:
    """A request's headers, read up to the blank line; None for a bad request (a bad
    Content-Length, or more than _MAX_HEADER_LINES lines)."""
    head = _Head(keep_alive)
    for _ in range(_MAX_HEADER_LINES):
        header = await asyncio.wait_for(reader.readline(), _IDLE_SECONDS)
        if header in (b"\r\n", b"\n", b""):
            return head
        name, _, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length":
            if not value.isdigit():
                return None
            head.length = int(value)
        elif name == "transfer-encoding":
            head.chunked = "chunked" in value.lower()
        elif restriction is not None and name == restriction.name and head.presented is None:
            head.presented = value
        elif name == "connection":
            tokens = {t.strip().lower() for t in value.split(",")}
            if "close" in tokens:
                head.keep_alive = False
            elif "keep-alive" in tokens:
                head.keep_alive = True
    return None


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes,
    *,
    close: bool,
    content_type: str = CONTENT_TYPE,
    head_only: bool = False,
) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    writer.write(head.encode("latin-1") + (b"" if head_only else body))
    await writer.drain()
