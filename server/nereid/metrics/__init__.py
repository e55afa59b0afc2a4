"""Prometheus metrics for the metrics port: Triton's per-model series plus nereid's
batching view, read from ModelStats at scrape time, the custom families model code makes, and the tiny listener serving
them (``collector.py``, ``listener.py``).

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

from nereid.metrics.collector import (
    BATCH_SIZE_BUCKETS,
    CONTENT_TYPE,
    CustomMetricsCollector,
    Metrics,
    ModelReading,
    ModelStatsCollector,
    render,
)
from nereid.metrics.listener import MetricsListener

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "CONTENT_TYPE",
    "CustomMetricsCollector",
    "Metrics",
    "MetricsListener",
    "ModelReading",
    "ModelStatsCollector",
    "render",
]
