"""Custom metrics as a Triton Python-backend model makes them: ``pb_utils.MetricFamily(name,
description, kind)`` and its ``.Metric(labels=..., buckets=...)``, over nereid's
``custom_metrics`` (the rules, the values, the lifetimes live there).

The sink (where the operations go: the server's registry, or a process instance's proxy to
it) is the calling model's, set by the adapter around ``initialize``, ``execute`` and
``finalize`` in a context variable (``metrics_through``), as ``bls.py`` does for BLS.
Errors are raised as Triton's stub raises them: TritonModelException, its message
prefixed as Triton's (``Failed to increment metric value: ...``).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

from nereid import custom_metrics
from nereid.custom_metrics import MetricError, MetricKind, MetricsSink
from nereid.triton_python.context_scope import set_within
from nereid.triton_python.messages import TritonModelException

__all__ = ["Metric", "MetricFamily", "current_sink", "metrics_through"]

_sink: contextvars.ContextVar[MetricsSink | None] = contextvars.ContextVar("nereid_metrics_sink", default=None)
_T = TypeVar("_T")


def metrics_through(sink: MetricsSink | None) -> contextlib.AbstractContextManager[None]:
    """Model code run inside this block makes its metric families in ``sink``."""
    return set_within(_sink, sink)


def current_sink() -> MetricsSink | None:
    return _sink.get()


def _triton(prefix: str, call: Callable[[], _T]) -> _T:
    """``call()``, a MetricError raised as Triton's TritonModelException."""
    try:
        return call()
    except MetricError as exc:
        raise TritonModelException(f"{prefix}: {exc.message}") from None


class Metric:
    """``pb_utils.Metric``: ``increment``, ``set``, ``observe``, ``value``."""

    def __init__(self, metric: custom_metrics.Metric) -> None:
        self._metric = metric

    def increment(self, value: float) -> None:
        _triton("Failed to increment metric value", lambda: self._metric.increment(value))

    def set(self, value: float) -> None:
        _triton("Failed to set metric value", lambda: self._metric.set(value))

    def observe(self, value: float) -> None:
        _triton("Failed to observe metric value", lambda: self._metric.observe(value))

    def value(self) -> float:
        return _triton("Failed to get metric value", self._metric.value)


class MetricFamily:
    """``pb_utils.MetricFamily(name, description, kind)``; ``kind`` one of
    ``MetricFamily.COUNTER``, ``GAUGE``, ``HISTOGRAM``."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: Any) -> None:
        sink = _sink.get()
        if sink is None:
            raise TritonModelException(
                "Error when creating MetricFamily: custom metrics are not available here (no server, or a thread "
                "the model started outside its execute's context)"
            )
        if not isinstance(kind, MetricKind):
            raise TritonModelException(
                f"Error when creating MetricFamily: kind: expected MetricFamily.COUNTER, GAUGE or HISTOGRAM, got {kind!r}"
            )
        self._family = _triton(
            "Error when creating MetricFamily", lambda: custom_metrics.MetricFamily(sink, name, description, kind)
        )
        # Triton's lifetime: dropping this object deletes the family handle, and the
        # Metric objects made from it are cleared (they do not keep it alive)
        weakref.finalize(self, self._family.close)

    def Metric(self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:  # noqa: N802 - Triton's name
        return Metric(_triton("Failed to create metric", lambda: self._family.metric(labels, buckets)))
