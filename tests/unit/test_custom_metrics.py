"""nereid.custom_metrics: the registry's rules (Triton's), handles and lifetimes, and the
objects model code holds (``context.metric_family``)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from nereid import ModelContext
from nereid.custom_metrics import (
    CLEARED, CustomMetrics, FamilyReading, MetricError, MetricFamily, MetricKind, SeriesReading, misuse,
)

COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM


def one_series(registry: CustomMetrics) -> SeriesReading:
    [family] = registry.read()
    [series] = family.series
    return series


def test_a_counter_grows_and_refuses_a_negative_increment_naming_the_series() -> None:
    registry = CustomMetrics()
    family = registry.open_family("owner", "requests", "Requests", COUNTER)
    metric = registry.open_metric(family, {"model": "m"}, None)
    registry.increment(metric, 2.5)
    with pytest.raises(MetricError) as caught:
        registry.increment(metric, -1)
    assert caught.value.message == (
        'metric requests{model="m"}: a counter can only be incremented by non-negative values, got -1'
    )
    assert registry.value(metric) == 2.5


@pytest.mark.parametrize(("kind", "op", "allowed"), [
    (COUNTER, "increment", True), (COUNTER, "set", False), (COUNTER, "observe", False), (COUNTER, "value", True),
    (GAUGE, "increment", True), (GAUGE, "set", True), (GAUGE, "observe", False), (GAUGE, "value", True),
    (HISTOGRAM, "increment", False), (HISTOGRAM, "set", False), (HISTOGRAM, "observe", True),
    (HISTOGRAM, "value", False),
])
def test_each_kind_allows_tritons_operations(kind: MetricKind, op: str, allowed: bool) -> None:
    assert (misuse(kind, op, 1.0) is None) is allowed


def test_a_gauge_is_set_incremented_and_decremented() -> None:
    registry = CustomMetrics()
    metric = registry.open_metric(registry.open_family("o", "depth", "", GAUGE), None, None)
    registry.set(metric, 7.5)
    registry.increment(metric, -2)
    assert registry.value(metric) == 5.5


def test_a_histogram_counts_each_value_in_its_bucket_bound_included() -> None:
    registry = CustomMetrics()
    metric = registry.open_metric(registry.open_family("o", "lat", "", HISTOGRAM), {}, [0.1, 1, 2.5])
    for value in (0.05, 1.0, 1.5, 6.0):
        registry.observe(metric, value)
    series = one_series(registry)
    assert (series.bounds, series.cumulative, series.count, series.total) == ((0.1, 1.0, 2.5), (1, 2, 3, 4), 4, 8.55)
    with pytest.raises(MetricError, match="a histogram does not support value"):
        registry.value(metric)


def test_a_histogram_with_no_buckets_has_only_inf() -> None:
    registry = CustomMetrics()
    metric = registry.open_metric(registry.open_family("o", "lat", "", HISTOGRAM), {}, [])
    registry.observe(metric, 3)
    assert one_series(registry).cumulative == (1,)


@pytest.mark.parametrize(("kind", "buckets", "error"), [
    (HISTOGRAM, None, 'metric family "f": a histogram needs buckets (a list of upper bounds)'),
    (HISTOGRAM, [1, 1, 2], 'metric family "f": buckets: expected strictly increasing upper bounds, got [1, 1, 2]'),
    (HISTOGRAM, [2.5, 0.1], 'metric family "f": buckets: expected strictly increasing upper bounds, got [2.5, 0.1]'),
    (COUNTER, [1.0], 'metric family "f": a counter takes no buckets'),
], ids=["missing", "duplicate", "unsorted", "on-a-counter"])
def test_bad_buckets_are_refused(kind: MetricKind, buckets: list[float] | None, error: str) -> None:
    registry = CustomMetrics()
    family = registry.open_family("o", "f", "", kind)
    with pytest.raises(MetricError) as caught:
        registry.open_metric(family, {}, buckets)
    assert caught.value.message == error


@pytest.mark.parametrize(("name", "labels", "error"), [
    ("1bad", None, "metric family name: expected a Prometheus metric name, got '1bad'"),
    ("f", {"a-b": "x"}, "metric family \"f\": label name: expected a Prometheus label name, got 'a-b'"),
    ("f", {"a": 1}, 'metric family "f": label "a": expected a str value, got int'),
], ids=["name", "label-name", "label-value"])
def test_bad_names_and_labels_are_refused(name: str, labels: dict[str, object] | None, error: str) -> None:
    registry = CustomMetrics()
    with pytest.raises(MetricError) as caught:
        registry.open_metric(registry.open_family("o", name, "", COUNTER), labels, None)  # type: ignore[arg-type]
    assert caught.value.message == error


def test_a_name_is_one_kind_and_keeps_its_first_description() -> None:
    registry = CustomMetrics()
    registry.open_family("o", "f", "first", COUNTER)
    with pytest.raises(MetricError) as caught:
        registry.open_family("o", "f", "first", GAUGE)
    assert caught.value.message == 'metric family "f" already exists with kind COUNTER, not GAUGE'
    registry.open_family("o", "f", "second", COUNTER)
    assert [f.description for f in registry.read()] == ["first"]


def test_the_same_labels_in_any_order_are_one_series() -> None:
    registry = CustomMetrics()
    family = registry.open_family("o", "f", "", COUNTER)
    one = registry.open_metric(family, {"b": "2", "a": "1"}, None)
    two = registry.open_metric(family, {"a": "1", "b": "2"}, None)
    registry.increment(one, 1)
    assert registry.value(two) == 1
    assert one_series(registry).labels == (("a", "1"), ("b", "2"))


def test_closing_a_family_handle_clears_the_series_handles_made_from_it() -> None:
    registry = CustomMetrics()
    family = registry.open_family("o", "f", "", GAUGE)
    metric = registry.open_metric(family, None, None)
    registry.close(family)
    with pytest.raises(MetricError) as caught:
        registry.set(metric, 1)
    assert caught.value.message == CLEARED
    assert registry.read() == []


def test_a_family_lives_while_any_owner_holds_it_and_leaves_with_the_last() -> None:
    registry = CustomMetrics()
    for owner in ("m_0", "m_1"):
        registry.open_metric(registry.open_family(owner, "f", "", COUNTER), {"i": owner}, None)
    registry.release_owner("m_0")
    assert registry.read() == [FamilyReading("f", "", COUNTER, (SeriesReading((("i", "m_1"),)),))]
    registry.release_owner("m_1")
    assert registry.read() == []


def test_a_metric_keeps_its_family_object_alive_and_dropping_both_closes_them() -> None:
    registry = CustomMetrics()
    metric = MetricFamily(registry.view("o"), "rows", "Rows", "counter").metric({"m": "x"})
    gc.collect()
    metric.increment(3)
    assert metric.value() == 3
    del metric
    gc.collect()
    assert registry.read() == []


def test_context_metric_family_needs_a_server() -> None:
    context = ModelContext("m", 1, "m_0", "cpu", "CPU", {}, {}, Path("."))
    with pytest.raises(MetricError, match='model "m": custom metrics are not available here'):
        context.metric_family("f", "", "counter")


def test_context_metric_family_reaches_the_registry_and_kinds_are_named() -> None:
    registry = CustomMetrics()
    context = ModelContext("m", 1, "m_0", "cpu", "CPU", {}, {}, Path("."), metrics=registry.view("m_0"))
    gauge = context.metric_family("depth", "Queue depth", "GAUGE").metric()
    gauge.set(4)
    assert registry.read()[0].kind is GAUGE and gauge.value() == 4
    with pytest.raises(MetricError, match="metric kind: expected one of counter, gauge, histogram, got 'summary'"):
        context.metric_family("s", "", "summary")
