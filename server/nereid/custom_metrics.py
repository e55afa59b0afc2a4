"""Custom metrics from model code: the families and series a server's models make
(``context.metric_family(...)``, Triton's ``pb_utils.MetricFamily``), kept in one registry
per server, and the handles model code holds on them.

Owns the values and the rules (Triton's: a counter only grows, a gauge is set, a histogram
observes into its buckets; a name is one kind). Knows nothing about Prometheus text
(``metrics/collector.py`` reads ``CustomMetrics.read()``) nor about processes: a process
instance's model code holds handles through ``instances/calls.py``'s proxy, which speaks
the same ``MetricsSink`` protocol as the registry's per-instance view.

Lifetimes are Triton's: a family (a series) exists while some handle on it is open; a
handle closes when model code drops the object (``del``, garbage collection) or when its
instance closes (the model unloads), so a model's families leave ``/metrics`` with it.
Closing a family handle clears the series handles made from it: using one then raises.
"""

from __future__ import annotations

import bisect
import enum
import math
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from nereid.errors import NereidError

__all__ = [
    "CLEARED", "CustomMetrics", "FamilyReading", "Metric", "MetricError", "MetricFamily", "MetricKind",
    "MetricsSink", "OwnedMetrics", "SeriesReading", "misuse",
]

#: Triton's words for using a series whose family handle was dropped first.
CLEARED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
    "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class MetricError(NereidError):
    """A custom metric used against its rules (a counter decremented, a name reused with
    another kind, unsorted buckets, ...). Triton models see it as TritonModelException."""


class MetricKind(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"

    @classmethod
    def of(cls, kind: MetricKind | str) -> MetricKind:
        """A kind from itself or its name (``"counter"``, ``"COUNTER"``)."""
        if isinstance(kind, MetricKind):
            return kind
        if isinstance(kind, str) and kind.lower() in {k.value for k in cls}:
            return cls(kind.lower())
        raise MetricError(f"metric kind: expected one of counter, gauge, histogram, got {kind!r}")


# -- readings (what /metrics shows) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SeriesReading:
    """One series: its labels (in the order given), its value (counter, gauge) or its
    histogram (upper bounds, cumulative counts per bound, sum, count)."""

    labels: tuple[tuple[str, str], ...]
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    cumulative: tuple[int, ...] = ()
    total: float = 0.0
    count: int = 0


@dataclass(frozen=True, slots=True)
class FamilyReading:
    name: str
    description: str
    kind: MetricKind
    series: tuple[SeriesReading, ...]


# -- the registry -------------------------------------------------------------------------


@dataclass(slots=True)
class _Family:
    name: str
    description: str
    kind: MetricKind
    handles: int = 0
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)


@dataclass(slots=True)
class _Series:
    labels: tuple[tuple[str, str], ...]
    bounds: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # per bucket, the last one +Inf
    total: float = 0.0
    count: int = 0
    handles: int = 0


@dataclass(slots=True)
class _Handle:
    owner: object
    family: _Family
    series: _Series | None = None  # None: a family handle
    parent: int | None = None  # a series handle: the family handle it was made from
    cleared: bool = False


class CustomMetrics:
    """One server's custom metric families (thread safe). Model code reaches it through a
    ``MetricsSink`` (``view(owner)``); ``/metrics`` reads it with ``read()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._handles: dict[int, _Handle] = {}
        self._next = 1

    def view(self, owner: object) -> OwnedMetrics:
        """The sink of one instance (``owner``): its handles close together at ``release_all``."""
        return OwnedMetrics(self, owner)

    def open_family(self, owner: object, name: str, description: str, kind: MetricKind) -> int:
        if not isinstance(name, str) or not _NAME.match(name):
            raise MetricError(f"metric family name: expected a Prometheus metric name, got {name!r}")
        if not isinstance(description, str):
            raise MetricError(f'metric family "{name}": description: expected a str, got {type(description).__name__}')
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, kind)
            elif family.kind is not kind:
                raise MetricError(
                    f'metric family "{name}" already exists with kind {family.kind.name}, not {kind.name}'
                )
            family.handles += 1  # a second description is ignored, as Triton does
            return self._add(_Handle(owner, family))

    def open_metric(
        self, family_handle: int, labels: Mapping[str, str] | None, buckets: Sequence[float] | None
    ) -> int:
        with self._lock:
            parent = self._live(family_handle)
            family = parent.family
            key = _labels(family.name, labels)
            bounds = _bounds(family, buckets)
            series = family.series.get(key)
            if series is None:
                histogram = family.kind is MetricKind.HISTOGRAM
                series = family.series[key] = _Series(key, bounds, counts=[0] * (len(bounds) + 1) if histogram else [])
            series.handles += 1
            return self._add(_Handle(parent.owner, family, series, family_handle))

    def close(self, handle: int) -> None:
        """Drop one handle (a family handle clears the series handles made from it)."""
        with self._lock:
            record = self._handles.pop(handle, None)
            if record is None:
                return
            if record.series is None:
                for child_id, child in self._handles.items():
                    if child.parent == handle and not child.cleared:
                        child.cleared = True
                        self._drop_series(child)
                record.family.handles -= 1
                self._drop_family_if_unused(record.family)
            elif not record.cleared:
                self._drop_series(record)

    def release_owner(self, owner: object) -> None:
        """Close every handle ``owner`` holds (its instance closed: its model unloads)."""
        with self._lock:
            mine = [h for h, record in self._handles.items() if record.owner == owner]
        for handle in mine:
            self.close(handle)

    def increment(self, handle: int, value: float) -> None:
        with self._lock:
            series = self._checked("increment", handle, value)
            series.value += value

    def set(self, handle: int, value: float) -> None:
        with self._lock:
            self._checked("set", handle, value).value = value

    def observe(self, handle: int, value: float) -> None:
        with self._lock:
            series = self._checked("observe", handle, value)
            series.counts[bisect.bisect_left(series.bounds, value)] += 1
            series.total += value
            series.count += 1

    def value(self, handle: int) -> float:
        with self._lock:
            return self._checked("value", handle, 0.0).value

    def apply(self, op: str, handle: int, value: float) -> None:
        """``increment``, ``set`` or ``observe`` by name (a process instance's queued update)."""
        {"increment": self.increment, "set": self.set, "observe": self.observe}[op](handle, value)

    def kind(self, handle: int) -> MetricKind:
        with self._lock:
            return self._live(handle).family.kind

    def read(self) -> list[FamilyReading]:
        """Every family and its series, in the order they were made."""
        with self._lock:
            return [
                FamilyReading(f.name, f.description, f.kind, tuple(_reading(s) for s in f.series.values()))
                for f in self._families.values()
            ]

    # -- inside the lock ---------------------------------------------------------------

    def _add(self, record: _Handle) -> int:
        handle = self._next
        self._next += 1
        self._handles[handle] = record
        return handle

    def _live(self, handle: int) -> _Handle:
        record = self._handles.get(handle)
        if record is None:
            raise MetricError(f"metric handle {handle} is closed")
        if record.cleared:
            raise MetricError(CLEARED)
        return record

    def _checked(self, op: str, handle: int, value: float) -> _Series:
        """The series of ``handle``, if ``op`` with ``value`` is allowed on it."""
        record = self._live(handle)
        assert record.series is not None, "a family handle where a metric handle was expected"
        problem = misuse(record.family.kind, op, value)
        if problem is not None:
            raise MetricError(f"{_subject(record)}: {problem}")
        return record.series

    def _drop_series(self, record: _Handle) -> None:
        series = record.series
        assert series is not None
        series.handles -= 1
        if series.handles == 0:
            record.family.series.pop(series.labels, None)

    def _drop_family_if_unused(self, family: _Family) -> None:
        if family.handles == 0 and self._families.get(family.name) is family:
            del self._families[family.name]


def misuse(kind: MetricKind, op: str, value: float) -> str | None:
    """Why ``op`` (increment, set, observe, value) with ``value`` is not allowed on a
    series of ``kind`` (Triton's rules), or None."""
    if kind is MetricKind.COUNTER and op == "increment" and value < 0:
        return f"a counter can only be incremented by non-negative values, got {value!r}"
    allowed = {MetricKind.COUNTER: ("increment", "value"), MetricKind.GAUGE: ("increment", "set", "value"),
               MetricKind.HISTOGRAM: ("observe",)}[kind]
    return None if op in allowed else f"a {kind.value} does not support {op}"


def _subject(record: _Handle) -> str:
    assert record.series is not None
    labels = ",".join(f'{k}="{v}"' for k, v in record.series.labels)
    return f"metric {record.family.name}{{{labels}}}"


def _labels(family: str, labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    if labels is None:
        return ()
    if not isinstance(labels, Mapping):
        raise MetricError(f'metric family "{family}": labels: expected a dict, got {type(labels).__name__}')
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.match(key):
            raise MetricError(f'metric family "{family}": label name: expected a Prometheus label name, got {key!r}')
        if not isinstance(value, str):
            raise MetricError(
                f'metric family "{family}": label "{key}": expected a str value, got {type(value).__name__}'
            )
    return tuple(sorted(labels.items()))


def _bounds(family: _Family, buckets: Sequence[float] | None) -> tuple[float, ...]:
    if family.kind is not MetricKind.HISTOGRAM:
        if buckets is not None:
            raise MetricError(f'metric family "{family.name}": a {family.kind.value} takes no buckets')
        return ()
    if buckets is None:
        raise MetricError(f'metric family "{family.name}": a histogram needs buckets (a list of upper bounds)')
    if not isinstance(buckets, (list, tuple)):
        raise MetricError(f'metric family "{family.name}": buckets: expected a list, got {type(buckets).__name__}')
    bounds = tuple(float(b) for b in buckets)
    if any(not a < b for a, b in zip(bounds, bounds[1:])) or any(math.isnan(b) for b in bounds):
        raise MetricError(
            f'metric family "{family.name}": buckets: expected strictly increasing upper bounds, got {list(buckets)}'
        )
    return bounds


def _reading(series: _Series) -> SeriesReading:
    if not series.counts:  # a counter or a gauge
        return SeriesReading(series.labels, series.value)
    cumulative: list[int] = []
    running = 0
    for count in series.counts:
        running += count
        cumulative.append(running)
    return SeriesReading(series.labels, series.value, series.bounds, tuple(cumulative), series.total, series.count)


# -- what model code holds ----------------------------------------------------------------


class MetricsSink(Protocol):
    """Where one instance's model code sends its metric operations: the registry's view
    (``OwnedMetrics``, thread instances) or the proxy of a process instance."""

    def open_family(self, name: str, description: str, kind: MetricKind, /) -> int: ...
    def open_metric(self, family: int, labels: Mapping[str, str] | None, buckets: Sequence[float] | None, /) -> int: ...
    def close(self, handle: int, /) -> None: ...
    def increment(self, handle: int, value: float, /) -> None: ...
    def set(self, handle: int, value: float, /) -> None: ...
    def observe(self, handle: int, value: float, /) -> None: ...
    def value(self, handle: int, /) -> float: ...


class OwnedMetrics:
    """One owner's way into a CustomMetrics (a MetricsSink)."""

    def __init__(self, registry: CustomMetrics, owner: object) -> None:
        self.registry = registry
        self.owner = owner
        self.close = registry.close
        self.increment = registry.increment
        self.set = registry.set
        self.observe = registry.observe
        self.value = registry.value

    def open_family(self, name: str, description: str, kind: MetricKind) -> int:
        return self.registry.open_family(self.owner, name, description, kind)

    def open_metric(self, family: int, labels: Mapping[str, str] | None, buckets: Sequence[float] | None) -> int:
        return self.registry.open_metric(family, labels, buckets)

    def release_all(self) -> None:
        self.registry.release_owner(self.owner)

    def __reduce__(self) -> tuple[object, ...]:
        # a context pickled for a process instance carries no view: the process makes its own
        return (_no_sink, ())


def _no_sink() -> None:
    return None


class MetricFamily:
    """A family of series with one name, description and kind (``context.metric_family``)."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, sink: MetricsSink, name: str, description: str, kind: MetricKind | str) -> None:
        self.name = name
        self.kind = MetricKind.of(kind)
        self._sink = sink
        self._handle = sink.open_family(name, description, self.kind)
        self._finalizer = weakref.finalize(self, _close_quietly, sink, self._handle)

    def metric(self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:
        """The series of this family with ``labels`` (made at 0 if new; a histogram's
        ``buckets`` are its upper bounds, strictly increasing, +Inf implied). The series
        keeps its family alive."""
        return Metric(self._sink, self._sink.open_metric(self._handle, labels, buckets), self.kind, self)

    def close(self) -> None:
        """Drop this family handle now: its series handles are cleared (using one raises),
        the family leaves ``/metrics`` when no other handle holds it."""
        self._finalizer()


class Metric:
    """One series: ``increment`` (counter, gauge), ``set`` (gauge), ``observe`` (histogram),
    ``value`` (counter, gauge). Misuse raises MetricError naming the series."""

    def __init__(self, sink: MetricsSink, handle: int, kind: MetricKind, family: MetricFamily | None = None) -> None:
        self.kind = kind
        self.family = family
        self._sink = sink
        self._handle = handle
        weakref.finalize(self, _close_quietly, sink, handle)

    def increment(self, value: float) -> None:
        self._sink.increment(self._handle, float(value))

    def set(self, value: float) -> None:
        self._sink.set(self._handle, float(value))

    def observe(self, value: float) -> None:
        self._sink.observe(self._handle, float(value))

    def value(self) -> float:
        return self._sink.value(self._handle)


def _close_quietly(sink: MetricsSink, handle: int) -> None:
    """A handle's object went away: close it (nothing to tell if the server went first)."""
    try:
        sink.close(handle)
    except Exception:  # the process's channel closed at exit: the server releases its handles
        pass
