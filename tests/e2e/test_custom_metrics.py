"""Custom metrics from model code over a real server: Triton's ``pb_utils.MetricFamily``
and nereid's ``context.metric_family``, on the metrics port as Triton writes them, the
values model code reads back, Triton's errors, and families leaving with their model
(in thread and process instances: the file is isolation_sensitive)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder, RunningServer, start_server
from tests.waiting import wait_until

#: One request; input OP picks what execute does; OUT is a JSON text of what happened.
TRITON_CONFIG = """
max_batch_size = 0
[[input]]
name = "OP"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "OUT"
data_type = "TYPE_STRING"
dims = [1]
[[instance_group]]
count = 2
kind = "KIND_CPU"
"""

TRITON_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(
            name="probe_requests", description="Requests seen by probe", kind=pb_utils.MetricFamily.COUNTER)
        self.count = self.requests.Metric(labels={"model": "probe", "version": "1"})
        # kept: dropping a family object clears the Metric objects made from it (Triton's rule)
        self.depth_family = pb_utils.MetricFamily(
            name="probe_depth", description="A gauge", kind=pb_utils.MetricFamily.GAUGE)
        self.depth = self.depth_family.Metric()
        latency = pb_utils.MetricFamily(
            name="probe_latency", description="A histogram", kind=pb_utils.MetricFamily.HISTOGRAM)
        self.latency_family = latency
        self.latency = latency.Metric(labels={"b": "2", "a": "1"}, buckets=[0.1, 1.0, 2.5])

    def execute(self, requests):
        op = pb_utils.get_input_tensor_by_name(requests[0], "OP").as_numpy()[0].decode()
        self.count.increment(1)
        result = {}
        try:
            if op == "observe":
                for value in (0.05, 1.5, 6.0):
                    self.latency.observe(value)
            elif op == "gauge":
                self.depth.set(7.5)
                self.depth.increment(-2)
                result["value"] = self.depth.value()
            elif op == "value":
                result["value"] = self.count.value()
            elif op == "negative":
                self.count.increment(-1)
            elif op == "set_counter":
                self.count.set(3)
            elif op == "other_kind":
                pb_utils.MetricFamily(name="probe_requests", description="x", kind=pb_utils.MetricFamily.GAUGE)
            elif op == "no_buckets":
                self.latency_family.Metric(labels={})
            elif op == "dropped_family":
                metric = pb_utils.MetricFamily(
                    name="probe_dropped", description="x", kind=pb_utils.MetricFamily.GAUGE).Metric()
                metric.set(1)
            elif op == "unsorted":
                self.latency_family.Metric(labels={}, buckets=[2.5, 0.1])
        except pb_utils.TritonModelException as exc:
            result["error"] = exc.message()
        text = json.dumps(result).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text], dtype=np.object_))])]
"""

NATIVE_CONFIG = """
max_batch_size = 8
[[input]]
name = "X"
data_type = "TYPE_FP32"
dims = [1]
[[output]]
name = "Y"
data_type = "TYPE_FP32"
dims = [1]
"""

NATIVE_MODEL = """
class Model:
    def __init__(self, context):
        family = context.metric_family("native_rows", "Rows the native model saw", "counter")
        self.rows = family.metric(labels={"model": context.model_name})

    def infer(self, inputs):
        self.rows.increment(len(inputs["X"]))
        return {"Y": inputs["X"]}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = RepoBuilder(tmp_path_factory.mktemp("custom-metrics"))
    repo.add("probe", TRITON_CONFIG, TRITON_MODEL)
    repo.add("native", NATIVE_CONFIG, NATIVE_MODEL)
    running = start_server(repo.root, "--model-control-mode", "explicit", "--load-model", "*",
                           log_dir=tmp_path_factory.mktemp("custom-metrics-logs"))
    yield running
    running.stop()


def scrape(server: RunningServer) -> list[str]:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode()).splitlines()


def family(server: RunningServer, name: str) -> list[str]:
    """The lines of family ``name``: its HELP and TYPE lines and its samples, in order."""
    lines: list[str] = []
    current = None
    for line in scrape(server):
        if line.startswith("# HELP "):
            current = line.split(" ")[2]
        if current == name:
            lines.append(line)
    return lines


def ask(server: RunningServer, op: str) -> dict[str, object]:
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([op.encode()], dtype=np.object_)
    request = httpclient.InferInput("OP", [1], "BYTES")
    request.set_data_from_numpy(data)
    answer = client.infer("probe", [request]).as_numpy("OUT")
    client.close()
    assert answer is not None
    return dict(json.loads(bytes(answer[0])))


def test_a_counter_is_on_the_metrics_port_as_triton_writes_it(server: RunningServer) -> None:
    before = ask(server, "value")["value"]
    ask(server, "nothing")
    after = ask(server, "value")["value"]
    assert after == before + 2  # requests to either instance count in one series
    lines = family(server, "probe_requests")
    assert lines[:2] == ["# HELP probe_requests Requests seen by probe", "# TYPE probe_requests counter"]
    [sample] = lines[2:]
    assert sample.startswith('probe_requests{model="probe",version="1"} ')
    assert float(sample.split(" ")[1]) >= after  # value() reads the server's count


def test_a_histogram_writes_count_sum_then_buckets_with_le_last(server: RunningServer) -> None:
    ask(server, "observe")
    assert family(server, "probe_latency") == [
        "# HELP probe_latency A histogram",
        "# TYPE probe_latency histogram",
        'probe_latency_count{a="1",b="2"} 3',
        'probe_latency_sum{a="1",b="2"} 7.55',
        'probe_latency_bucket{a="1",b="2",le="0.1"} 1',
        'probe_latency_bucket{a="1",b="2",le="1"} 1',
        'probe_latency_bucket{a="1",b="2",le="2.5"} 2',
        'probe_latency_bucket{a="1",b="2",le="+Inf"} 3',
    ]


def test_a_gauge_is_set_and_incremented_and_read_back(server: RunningServer) -> None:
    assert ask(server, "gauge") == {"value": 5.5}
    assert "probe_depth 5.5" in scrape(server)


@pytest.mark.parametrize(("op", "error"), [
    pytest.param("negative", "Failed to increment metric value: metric probe_requests{model=\"probe\",version=\"1\"}: "
                 "a counter can only be incremented by non-negative values, got -1.0", id="negative-increment"),
    pytest.param("set_counter", "Failed to set metric value: metric probe_requests{model=\"probe\",version=\"1\"}: "
                 "a counter does not support set", id="set-on-counter"),
    pytest.param("other_kind", 'Error when creating MetricFamily: metric family "probe_requests" already exists with '
                 "kind COUNTER, not GAUGE", id="same-name-other-kind"),
    pytest.param("no_buckets", 'Failed to create metric: metric family "probe_latency": a histogram needs buckets '
                 "(a list of upper bounds)", id="histogram-without-buckets"),
    pytest.param("dropped_family", "Failed to set metric value: Invalid metric operation as the corresponding "
                 "'MetricFamily' has been deleted. The 'MetricFamily' object should be deleted AFTER its "
                 "corresponding 'Metric' objects have been deleted.", id="family-dropped-first"),
    pytest.param("unsorted", 'Failed to create metric: metric family "probe_latency": buckets: expected strictly '
                 "increasing upper bounds, got [2.5, 0.1]", id="unsorted-buckets"),
])
def test_misuse_raises_tritons_exception_naming_the_metric(server: RunningServer, op: str, error: str) -> None:
    assert ask(server, op) == {"error": error}


def test_nereids_context_api_counts_rows(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    request = httpclient.InferInput("X", [3, 1], "FP32")
    request.set_data_from_numpy(np.ones((3, 1), np.float32))
    client.infer("native", [request])
    client.close()
    lines = family(server, "native_rows")
    assert lines[:2] == ["# HELP native_rows Rows the native model saw", "# TYPE native_rows counter"]
    assert lines[2] == 'native_rows{model="native"} 3'


def test_families_leave_the_metrics_port_when_their_model_unloads(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        ask(server, "nothing")
        assert family(server, "probe_requests")
        client.unload_model("probe")
        wait_until(lambda: not family(server, "probe_requests") and not family(server, "probe_latency"),
                   "probe's families to leave /metrics")
        client.load_model("probe")
        ask(server, "nothing")
        assert family(server, "probe_requests")[2] == 'probe_requests{model="probe",version="1"} 1'
    finally:
        client.close()
