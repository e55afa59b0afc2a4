"""pb_utils.MetricFamily / Metric (nereid.triton_python.metrics): Triton's names, its
exception and message prefixes, its lifetimes, over the sink the adapter sets."""

from __future__ import annotations

import gc

import pytest

from nereid.custom_metrics import CLEARED, CustomMetrics
from nereid.triton_python import pb_utils
from nereid.triton_python.metrics import metrics_through


def test_a_family_needs_the_sink_of_a_running_model() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="custom metrics are not available here"):
        pb_utils.MetricFamily(name="f", description="", kind=pb_utils.MetricFamily.COUNTER)


def test_the_kind_must_be_one_of_the_familys_constants() -> None:
    with metrics_through(CustomMetrics().view("m_0")):
        with pytest.raises(pb_utils.TritonModelException, match="expected MetricFamily.COUNTER, GAUGE or HISTOGRAM"):
            pb_utils.MetricFamily(name="f", description="", kind="counter")


def test_operations_reach_the_registry_and_misuse_is_tritons_exception() -> None:
    registry = CustomMetrics()
    with metrics_through(registry.view("m_0")):
        family = pb_utils.MetricFamily(name="lat", description="Latency", kind=pb_utils.MetricFamily.COUNTER)
        metric = family.Metric(labels={"model": "m"})
    metric.increment(5)  # outside the block too: the metric holds its sink
    assert metric.value() == 5.0
    with pytest.raises(pb_utils.TritonModelException) as caught:
        metric.set(1)
    assert caught.value.message() == 'Failed to set metric value: metric lat{model="m"}: a counter does not support set'
    with pytest.raises(pb_utils.TritonModelException, match="^Failed to observe metric value: "):
        metric.observe(1)


def test_histogram_metrics_need_buckets() -> None:
    with metrics_through(CustomMetrics().view("m_0")):
        family = pb_utils.MetricFamily(name="h", description="", kind=pb_utils.MetricFamily.HISTOGRAM)
        with pytest.raises(pb_utils.TritonModelException, match="^Failed to create metric: .*needs buckets"):
            family.Metric(labels={})
        family.Metric(labels={}, buckets=[]).observe(2.0)


def test_dropping_the_family_object_clears_its_metrics_as_in_triton() -> None:
    registry = CustomMetrics()
    with metrics_through(registry.view("m_0")):
        family = pb_utils.MetricFamily(name="g", description="", kind=pb_utils.MetricFamily.GAUGE)
        metric = family.Metric()
    del family
    gc.collect()
    with pytest.raises(pb_utils.TritonModelException) as caught:
        metric.set(10)
    assert caught.value.message() == "Failed to set metric value: " + CLEARED
    assert registry.read() == []
