"""The metrics collector and renderer (exact text from known ModelStats) and the metrics
port's tiny HTTP listener."""

from __future__ import annotations

import asyncio

from prometheus_client import Counter
from prometheus_client.registry import CollectorRegistry

from nereid.custom_metrics import CustomMetrics, MetricKind
from nereid.metrics import CustomMetricsCollector, MetricsListener, ModelReading, ModelStatsCollector, render
from nereid.stats import ModelStats


def scraped(*readings: ModelReading) -> list[str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelStatsCollector(lambda: list(readings)))
    text = render(registry).decode()
    assert text.endswith("\n")
    return text.splitlines()


def busy_stats() -> ModelStats:
    """Two batches (3 rows, then 1 row) of successful requests, and two failures."""
    stats = ModelStats("add_one", 2)
    stats.record_execution(3, 4_000, 40_000, 6_000)
    for queue_ns in (30_000, 80_000, 700_000):  # 30 us, 80 us, 700 us
        stats.record_success(1_500_000, queue_ns, 4_000, 40_000, 6_000)
    stats.record_execution(1, 1_000, 9_000, 2_000)
    stats.record_success(2_000_500, 20_000_000_000, 1_000, 9_000, 2_000)  # 20 s: past the last bound
    stats.record_failure(10_000, "REJECTED")
    stats.record_failure(10_000, "BACKEND")
    return stats


def test_triton_counters_have_triton_names_help_types_and_labels() -> None:
    lines = scraped(ModelReading(busy_stats(), pending=5, executing=1))
    assert lines[:3] == [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="add_one",version="2"} 4',
    ]
    expected = [
        'nv_inference_request_failure{model="add_one",reason="REJECTED",version="2"} 1',
        'nv_inference_request_failure{model="add_one",reason="CANCELED",version="2"} 0',
        'nv_inference_request_failure{model="add_one",reason="BACKEND",version="2"} 1',
        'nv_inference_request_failure{model="add_one",reason="OTHER",version="2"} 0',
        'nv_inference_count{model="add_one",version="2"} 4',
        'nv_inference_exec_count{model="add_one",version="2"} 2',
        # 3 x 1.5 ms + 2.0005 ms = 6500.5 us, truncated as Triton's integer microseconds
        'nv_inference_request_duration_us{model="add_one",version="2"} 6500',
        'nv_inference_queue_duration_us{model="add_one",version="2"} 20000810',
        'nv_inference_compute_input_duration_us{model="add_one",version="2"} 13',
        'nv_inference_compute_infer_duration_us{model="add_one",version="2"} 129',
        'nv_inference_compute_output_duration_us{model="add_one",version="2"} 20',
        'nv_inference_pending_request_count{model="add_one",version="2"} 5',
        'nereid_batches_executing{model="add_one",version="2"} 1',
    ]
    for line in expected:
        assert line in lines
    assert "# TYPE nv_inference_pending_request_count gauge" in lines
    assert not any("_total" in line or "_created" in line for line in lines)


def test_failure_reasons_exist_before_any_failure() -> None:
    lines = scraped(ModelReading(ModelStats("m", 1)))
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert f'nv_inference_request_failure{{model="m",reason="{reason}",version="1"}} 0' in lines


def test_batch_size_histogram_is_exact_from_batch_stats() -> None:
    lines = scraped(ModelReading(busy_stats()))
    start = lines.index("# TYPE nereid_batch_size histogram")
    assert lines[start + 1 : start + 16] == [
        'nereid_batch_size_bucket{model="add_one",version="2",le="1"} 1',
        'nereid_batch_size_bucket{model="add_one",version="2",le="2"} 1',
        'nereid_batch_size_bucket{model="add_one",version="2",le="4"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="8"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="16"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="32"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="64"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="128"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="256"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="512"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="1024"} 2',
        'nereid_batch_size_bucket{model="add_one",version="2",le="+Inf"} 2',
        'nereid_batch_size_count{model="add_one",version="2"} 2',
        'nereid_batch_size_sum{model="add_one",version="2"} 4',
        "# HELP nereid_queue_duration_us Time successful requests waited in the queue, in microseconds.",
    ]


def test_queue_time_histogram_counts_each_request_in_its_bucket() -> None:
    lines = scraped(ModelReading(busy_stats()))
    buckets = {
        line.split('le="')[1].split('"')[0]: int(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("nereid_queue_duration_us_bucket")
    }
    assert buckets["50"] == 1  # 30 us
    assert buckets["100"] == 2  # + 80 us
    assert buckets["500"] == 2
    assert buckets["1000"] == 3  # + 700 us
    assert buckets["10000000"] == 3
    assert buckets["+Inf"] == 4  # + 20 s
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert 'nereid_queue_duration_us_count{model="add_one",version="2"} 4' in lines
    assert 'nereid_queue_duration_us_sum{model="add_one",version="2"} 20000810' in lines


def test_each_family_appears_once_with_every_model_under_it() -> None:
    lines = scraped(ModelReading(ModelStats("a", 1)), ModelReading(ModelStats("b", 3)))
    assert lines.count("# TYPE nv_inference_count counter") == 1
    start = lines.index("# TYPE nv_inference_count counter")
    assert lines[start + 1 : start + 3] == [
        'nv_inference_count{model="a",version="1"} 0',
        'nv_inference_count{model="b",version="3"} 0',
    ]


def test_no_models_still_describes_the_families() -> None:
    lines = scraped()
    assert "# TYPE nv_inference_request_success counter" in lines
    assert not any(line and not line.startswith("#") for line in lines)


def test_label_values_are_escaped() -> None:
    lines = scraped(ModelReading(ModelStats('we"ird\\name', 1)))
    assert 'nv_inference_count{model="we\\"ird\\\\name",version="1"} 0' in lines


def test_two_registries_never_share_counts() -> None:
    busy, idle = busy_stats(), ModelStats("add_one", 2)
    assert 'nv_inference_count{model="add_one",version="2"} 4' in scraped(ModelReading(busy))
    assert 'nv_inference_count{model="add_one",version="2"} 0' in scraped(ModelReading(idle))


def test_a_standard_prometheus_counter_keeps_its_total_suffix() -> None:
    registry = CollectorRegistry(auto_describe=False)
    Counter("things", "Things done", registry=registry).inc(2)
    assert render(registry).decode().splitlines() == [
        "# HELP things_total Things done",
        "# TYPE things_total counter",
        "things_total 2",
    ]


# -- the listener -------------------------------------------------------------------------


async def _exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    writer.close()
    return data


def _listen(coro_factory):  # type: ignore[no-untyped-def]
    async def main() -> object:
        listener = MetricsListener(lambda: b"# metrics\n")
        await listener.start("127.0.0.1", 0)
        try:
            assert listener.port
            return await coro_factory(listener.port)
        finally:
            await listener.aclose()

    return asyncio.run(main())


def test_listener_serves_metrics_and_slash_metrics() -> None:
    for path in ("/metrics", "/metrics/", "/metrics?name[]=x"):
        reply = _listen(lambda port: _exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()))
        assert reply == (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 10\r\n"
            b"Connection: close\r\n\r\n# metrics\n"
        )


def test_listener_answers_other_get_paths_with_an_empty_200() -> None:
    reply = _listen(lambda port: _exchange(port, b"GET /metricsx HTTP/1.0\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert reply.endswith(b"Content-Length: 0\r\nConnection: close\r\n\r\n")


def test_listener_refuses_other_methods_with_405() -> None:
    reply = _listen(lambda port: _exchange(port, b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"))
    assert reply.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert reply.endswith(b'\r\n\r\n{"error":"Method Not Allowed"}')
    head = _listen(lambda port: _exchange(port, b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"))
    assert head.startswith(b"HTTP/1.1 405 ") and head.endswith(b"\r\n\r\n")


def test_listener_keeps_the_connection_for_pipelined_requests() -> None:
    async def two_on_one_connection(port: int) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        replies = []
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            replies.append(head + await reader.readexactly(length))
        writer.close()
        return replies

    first, second = _listen(two_on_one_connection)
    assert first.endswith(b"\r\n\r\n# metrics\n") and b"Connection: close" not in first
    assert second.endswith(b"Content-Length: 0\r\n\r\n")


def test_listener_answers_garbage_with_400_and_closes() -> None:
    reply = _listen(lambda port: _exchange(port, b"HELLO\r\n\r\n"))
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")


def test_custom_families_are_written_as_tritons_prometheus_cpp_writes_them() -> None:
    custom = CustomMetrics()
    counter = custom.open_metric(custom.open_family("o", "latency_ns", "Cumulative time", MetricKind.COUNTER),
                                 {"version": "1", "model": "m"}, None)
    custom.increment(counter, 1.5e12)
    histogram = custom.open_metric(custom.open_family("o", "sizes", "Sizes", MetricKind.HISTOGRAM), {"k": "v"},
                                   [0.1, 2.5])
    for value in (0.05, 1.5, 6.0):
        custom.observe(histogram, value)
    gauge = custom.open_metric(custom.open_family("o", "ratio", "A ratio", MetricKind.GAUGE), None, None)
    custom.set(gauge, 0.1 + 0.2)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CustomMetricsCollector(custom))
    assert render(registry).decode().splitlines() == [
        "# HELP latency_ns Cumulative time",
        "# TYPE latency_ns counter",
        'latency_ns{model="m",version="1"} 1500000000000',
        "# HELP sizes Sizes",
        "# TYPE sizes histogram",
        'sizes_count{k="v"} 3',
        'sizes_sum{k="v"} 7.55',
        'sizes_bucket{k="v",le="0.1"} 1',
        'sizes_bucket{k="v",le="2.5"} 2',
        'sizes_bucket{k="v",le="+Inf"} 3',
        "# HELP ratio A ratio",
        "# TYPE ratio gauge",
        "ratio 0.3",  # 16 significant digits, as prometheus-cpp: not 0.30000000000000004
    ]
