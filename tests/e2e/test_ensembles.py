"""Ensembles (``platform = "ensemble"``) on the real server: a preprocess -> model ->
postprocess chain of Python models over HTTP (binary and JSON tensors), gRPC and the
in-process API; per-step batching shown by the step models' statistics; a failing step;
a step model unloaded and loaded again; loading with steps in explicit mode; bad configs.

Under ``make test``'s ``--workers 2`` pass only the tests marked ``workers_sensitive`` run
again: an ensemble's request crosses from a front-end worker as any model's, decoded
against its config (the ensemble's, which those tests infer with and read); its steps,
their batching, statistics, failures and loads all run in the main process.
"""

from __future__ import annotations

import concurrent.futures
import json
import queue
import threading
import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import nereid
from tests.conftest import RepoBuilder, RunningServer, start_server
from tests.waiting import wait_until

STEP_CONFIG = """
max_batch_size = 8
[[input]]
name = "X"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "Y"
data_type = "TYPE_FP32"
dims = [4]
[dynamic_batching]
preferred_batch_size = [4]
max_queue_delay_microseconds = {delay}
"""

PRE = """
class Model:
    def infer(self, inputs):
        return {"Y": inputs["X"] * 2}
"""

#: a Triton Python-backend model as the middle step
MIDDLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

POST = """
class Model:
    def infer(self, inputs):
        return {"Y": inputs["X"] * 10}
"""

ENSEMBLE = """
platform = "ensemble"
max_batch_size = 8
[[input]]
name = "RAW"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "RESULT"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "SCALED"
data_type = "TYPE_FP32"
dims = [4]

[[ensemble_scheduling.step]]
model_name = "pre"
model_version = -1
input_map = { X = "RAW" }
output_map = { Y = "SCALED" }

[[ensemble_scheduling.step]]
model_name = "middle"
input_map = { X = "SCALED" }
output_map = { Y = "shifted" }

[[ensemble_scheduling.step]]
model_name = "post"
input_map = { X = "shifted" }
output_map = { Y = "RESULT" }
"""


def chain(repo: RepoBuilder, delay_us: int = 0) -> Path:
    """pre (x2) -> middle (+1, Triton model; fails on negatives) -> post (x10), and the
    ensemble ``chain`` over them (an empty version folder, as Triton's layout has)."""
    for name, model in (("pre", PRE), ("middle", MIDDLE), ("post", POST)):
        repo.add(name, STEP_CONFIG.format(delay=delay_us), model, version=1)
    repo.add("chain", ENSEMBLE, model=None, version=1)
    return repo.root


def expected(raw: np.ndarray) -> np.ndarray:
    return (raw * 2 + 1) * 10


def stats_of(server: RunningServer, model: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{server.http}/v2/models/{model}/stats", timeout=10) as response:
        entry: dict = json.load(response)["model_stats"][0]  # type: ignore[type-arg]
    return entry


def index_of(server: RunningServer) -> list[dict]:  # type: ignore[type-arg]
    request = urllib.request.Request(f"{server.http}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        rows: list[dict] = json.load(response)  # type: ignore[type-arg]
    return rows


@pytest.fixture(scope="module")
def chain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server over ``chain`` for the tests that only ask it (no statistics, no
    loads): a server start per test cost more than the tests."""
    root = chain(RepoBuilder(tmp_path_factory.mktemp("chain") / "models"))
    running = start_server(root, log_dir=tmp_path_factory.mktemp("chain-logs"))
    yield running
    running.stop()


@pytest.mark.workers_sensitive
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_chain_of_python_models_answers_over_http(chain_server: RunningServer, binary: bool) -> None:
    server = chain_server
    raw = np.arange(8, dtype=np.float32).reshape(2, 4)
    client = httpclient.InferenceServerClient(server.url)
    infer_input = httpclient.InferInput("RAW", [2, 4], "FP32")
    infer_input.set_data_from_numpy(raw, binary_data=binary)
    result = client.infer("chain", [infer_input])
    np.testing.assert_array_equal(result.as_numpy("RESULT"), expected(raw))
    np.testing.assert_array_equal(result.as_numpy("SCALED"), raw * 2)
    # requested outputs filter as for any model
    only = client.infer("chain", [infer_input], outputs=[httpclient.InferRequestedOutput("RESULT", binary_data=binary)])
    assert only.as_numpy("SCALED") is None
    np.testing.assert_array_equal(only.as_numpy("RESULT"), expected(raw))


def test_a_chain_of_python_models_answers_over_grpc_and_in_process(chain_server: RunningServer, repo: RepoBuilder) -> None:
    server = chain_server
    raw = np.ones((1, 4), dtype=np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    infer_input = grpcclient.InferInput("RAW", [1, 4], "FP32")
    infer_input.set_data_from_numpy(raw)
    result = client.infer("chain", [infer_input], outputs=[grpcclient.InferRequestedOutput("RESULT")])
    np.testing.assert_array_equal(result.as_numpy("RESULT"), expected(raw))
    assert result.as_numpy("SCALED") is None
    with nereid.Server(chain(repo)) as local:
        outputs = local.infer("chain", {"RAW": raw})
    np.testing.assert_array_equal(outputs["RESULT"], expected(raw))


@pytest.mark.workers_sensitive
def test_metadata_config_and_index_show_the_ensemble(chain_server: RunningServer) -> None:
    server = chain_server
    client = httpclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("chain")
    assert metadata["platform"] == "ensemble"
    assert [t["name"] for t in metadata["inputs"]] == ["RAW"]
    assert [(t["name"], t["shape"]) for t in metadata["outputs"]] == [("RESULT", [-1, 4]), ("SCALED", [-1, 4])]
    config = client.get_model_config("chain")
    assert config["platform"] == "ensemble" and config["backend"] == ""
    steps = config["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["model_version"], s["input_map"], s["output_map"]) for s in steps] == [
        ("pre", -1, {"X": "RAW"}, {"Y": "SCALED"}),
        ("middle", -1, {"X": "SCALED"}, {"Y": "shifted"}),
        ("post", -1, {"X": "shifted"}, {"Y": "RESULT"}),
    ]
    grpc_config = grpcclient.InferenceServerClient(server.grpc_url).get_model_config("chain", as_json=True)
    assert grpc_config["config"]["platform"] == "ensemble"
    assert {row["name"]: row["state"] for row in index_of(server)} == {
        "chain": "READY", "middle": "READY", "post": "READY", "pre": "READY",
    }


def test_concurrent_ensemble_requests_are_batched_per_step(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    """With preferred_batch_size 4 and a 100 s queue delay, a step batch leaves only when
    four step requests wait together: four concurrent ensemble requests give each step
    one execution of four."""
    server = serve(chain(repo, delay_us=100_000_000))
    raws = [np.full((1, 4), i, dtype=np.float32) for i in range(4)]

    def call(raw: np.ndarray) -> np.ndarray:
        # closed in the thread that made it (tritonclient's gevent pool must not be closed from another)
        with httpclient.InferenceServerClient(server.url, network_timeout=120) as client:
            infer_input = httpclient.InferInput("RAW", [1, 4], "FP32")
            infer_input.set_data_from_numpy(raw)
            return client.infer("chain", [infer_input]).as_numpy("RESULT")  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, raws))
    for raw, result in zip(raws, results):
        np.testing.assert_array_equal(result, expected(raw))
    for step in ("pre", "middle", "post"):
        stats = stats_of(server, step)
        assert (stats["inference_count"], stats["execution_count"]) == (4, 1), step
        assert stats["inference_stats"]["success"]["count"] == 4
    ensemble = stats_of(server, "chain")
    assert (ensemble["inference_count"], ensemble["execution_count"]) == (4, 4)
    assert ensemble["inference_stats"]["success"]["count"] == 4
    assert ensemble["inference_stats"]["compute_infer"]["count"] == 4


def test_a_failing_step_fails_the_request_naming_ensemble_and_step(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(chain(repo))
    client = httpclient.InferenceServerClient(server.url)
    infer_input = httpclient.InferInput("RAW", [1, 4], "FP32")
    infer_input.set_data_from_numpy(-np.ones((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as failure:
        client.infer("chain", [infer_input])
    assert "in ensemble 'chain', step 'middle': " in failure.value.message()
    assert "negative input" in failure.value.message()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc_input = grpcclient.InferInput("RAW", [1, 4], "FP32")
    grpc_input.set_data_from_numpy(-np.ones((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as grpc_failure:
        grpc.infer("chain", [grpc_input])
    assert "in ensemble 'chain', step 'middle': " in grpc_failure.value.message()
    assert stats_of(server, "chain")["inference_stats"]["fail"]["count"] == 2
    assert stats_of(server, "post")["inference_count"] == 0  # the step after the failure never ran
    # the next good request still succeeds
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    np.testing.assert_array_equal(client.infer("chain", [infer_input]).as_numpy("RESULT"), expected(np.ones((1, 4))))


def test_an_ensemble_is_unavailable_while_a_step_model_is_unloaded(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(chain(repo), "--model-control-mode", "explicit", "--load-model", "chain")
    client = httpclient.InferenceServerClient(server.url)
    # loading the ensemble loaded its steps
    assert all(client.is_model_ready(name) for name in ("chain", "pre", "middle", "post"))
    client.unload_model("middle")
    wait_until(lambda: not client.is_model_ready("middle"), "middle unloaded")
    assert not client.is_model_ready("chain")
    # Triton unloads the ensemble then (ModelRepositoryManager::LoadModelByDependency):
    # UNAVAILABLE "unloaded", which strict readiness (the default) accepts
    row = next(row for row in index_of(server) if row["name"] == "chain")
    assert (row["state"], row["reason"]) == ("UNAVAILABLE", "unloaded")
    assert client.is_server_ready()
    infer_input = httpclient.InferInput("RAW", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException) as failure:
        client.infer("chain", [infer_input])
    assert failure.value.message().startswith("in ensemble 'chain', step 'middle': ")
    client.load_model("middle")
    assert client.is_model_ready("chain") and client.is_server_ready()
    np.testing.assert_array_equal(client.infer("chain", [infer_input]).as_numpy("RESULT"), expected(np.ones((1, 4))))


def test_unload_dependents_unloads_the_steps_loaded_for_the_ensemble(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(chain(repo), "--model-control-mode", "explicit", "--load-model", "chain", "--load-model", "post")
    client = httpclient.InferenceServerClient(server.url)
    client.unload_model("chain", unload_dependents=True)
    states = {row["name"]: row.get("state") for row in index_of(server)}
    # pre and middle were loaded for the ensemble only; post was asked for by name
    assert states == {"chain": "UNAVAILABLE", "pre": "UNAVAILABLE", "middle": "UNAVAILABLE", "post": "READY"}
    client.load_model("chain")
    assert all(client.is_model_ready(name) for name in ("chain", "pre", "middle", "post"))
    client.unload_model("chain")  # without unload_dependents the steps stay
    assert all(client.is_model_ready(name) for name in ("pre", "middle", "post"))


def test_an_ensemble_that_does_not_fit_its_steps_is_unavailable_with_tritons_reason(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    root = chain(repo)
    repo.add("bad", ENSEMBLE.replace('input_map = { X = "shifted" }', 'input_map = { Z = "shifted" }'), model=None)
    repo.add("orphan", ENSEMBLE.replace('model_name = "post"', 'model_name = "missing"'), model=None)
    server = serve(root, "--strict-readiness", "false")
    rows = {row["name"]: row for row in index_of(server)}
    assert rows["chain"]["state"] == "READY"
    assert rows["bad"]["state"] == "UNAVAILABLE"
    assert rows["bad"]["reason"] == "in ensemble 'bad', ensemble tensor 'shifted' is mapping to non-existing input 'Z' in model 'post'"
    assert rows["orphan"]["state"] == "UNAVAILABLE"
    assert rows["orphan"]["reason"].startswith("ensemble 'orphan' depends on 'missing' which has no loaded version")


def test_an_ensemble_config_with_an_unused_input_is_refused_naming_it(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    root = chain(repo)
    extra = '[[input]]\nname = "EXTRA"\ndata_type = "TYPE_FP32"\ndims = [4]\n[[output]]'
    repo.add("unused", ENSEMBLE.replace("[[output]]", extra, 1), model=None)
    server = serve(root, "--strict-readiness", "false")
    rows = {row["name"]: row for row in index_of(server)}
    assert rows["unused"]["state"] == "UNAVAILABLE"
    assert "ensemble input 'EXTRA' for ensemble 'unused' is not used" in rows["unused"]["reason"]


#: a decoupled step: one response per count up to X's first element
COUNTER = """
import numpy as np


class Model:
    def infer(self, inputs):
        for step in range(1, int(inputs["X"].max()) + 1):
            yield {"Y": np.full_like(inputs["X"], step)}
"""

STREAMING = ENSEMBLE.replace('model_name = "pre"', 'model_name = "counter"').replace(
    '[[output]]\nname = "SCALED"\ndata_type = "TYPE_FP32"\ndims = [4]\n', "")


def test_a_decoupled_step_streams_one_ensemble_response_per_step_response_over_grpc(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    """counter (decoupled: 3 responses) -> middle -> post: three ensemble responses, and
    the ensemble's config says decoupled, as Triton's does."""
    chain(repo)
    repo.add("counter", STEP_CONFIG.format(delay=0) + "[model_transaction_policy]\ndecoupled = true\n", COUNTER,
             version=1)
    repo.add("streaming", STREAMING, model=None, version=1)
    server = serve(repo.root)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.get_model_config("streaming", as_json=True)["config"]["model_transaction_policy"]["decoupled"]
    results: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client.start_stream(lambda result, error: results.put((result, error)))
    infer_input = grpcclient.InferInput("RAW", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.full((1, 4), 3, dtype=np.float32))
    client.async_stream_infer("streaming", [infer_input])
    answers = [results.get(timeout=60) for _ in range(3)]
    client.stop_stream()
    assert [error for _, error in answers] == [None, None, None]
    assert [result.as_numpy("RESULT")[0, 0] for result, _ in answers] == [(k + 1) * 10 for k in (1, 2, 3)]
    assert stats_of(server, "middle")["inference_count"] == 3
    # one ensemble request, charged what its five step requests were (the decoupled one's too)
    wait_until(lambda: stats_of(server, "streaming")["inference_stats"]["success"]["count"] == 1, "the request counted")
    ensemble = stats_of(server, "streaming")["inference_stats"]
    steps = [stats_of(server, step)["inference_stats"] for step in ("counter", "middle", "post")]
    assert [step["compute_infer"]["count"] for step in steps] == [1, 3, 3]
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert ensemble[part]["ns"] == sum(step[part]["ns"] for step in steps), part


def test_ensemble_inputs_and_outputs_travel_through_shared_memory(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    import uuid

    import tritonclient.utils.shared_memory as shm

    server = serve(chain(repo))
    client = httpclient.InferenceServerClient(server.url)
    suffix = uuid.uuid4().hex[:8]
    in_handle = shm.create_shared_memory_region(f"ens_in_{suffix}", f"/ens_in_{suffix}", 16)
    out_handle = shm.create_shared_memory_region(f"ens_out_{suffix}", f"/ens_out_{suffix}", 16)
    try:
        raw = np.arange(4, dtype=np.float32).reshape(1, 4)
        shm.set_shared_memory_region(in_handle, [raw])
        client.register_system_shared_memory("ens_in", f"/ens_in_{suffix}", 16)
        client.register_system_shared_memory("ens_out", f"/ens_out_{suffix}", 16)
        infer_input = httpclient.InferInput("RAW", [1, 4], "FP32")
        infer_input.set_shared_memory("ens_in", 16)
        requested = httpclient.InferRequestedOutput("RESULT", binary_data=True)
        requested.set_shared_memory("ens_out", 16)
        result = client.infer("chain", [infer_input], outputs=[requested])
        assert result.get_output("RESULT") == {"name": "RESULT", "datatype": "FP32", "shape": [1, 4]}
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, 4]), expected(raw))
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_the_ensembles_statistics_are_the_sums_of_its_step_requests_as_triton_reports_them(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    """Triton's ensemble statistics (ensemble_scheduler.cc, RequestTracker): per request,
    compute_input / compute_infer / compute_output are the sums of what its step requests
    were charged, and it is one execution of its batch size. The steps here serve only
    the ensemble, so the ensemble's sums equal the three steps' together."""
    server = serve(chain(repo))
    client = httpclient.InferenceServerClient(server.url)
    for rows in (2, 2, 1):
        infer_input = httpclient.InferInput("RAW", [rows, 4], "FP32")
        infer_input.set_data_from_numpy(np.ones((rows, 4), dtype=np.float32))
        client.infer("chain", [infer_input])
    steps = [stats_of(server, step) for step in ("pre", "middle", "post")]
    ensemble = stats_of(server, "chain")
    assert (ensemble["inference_count"], ensemble["execution_count"]) == (5, 3)
    inference = ensemble["inference_stats"]
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert inference[part]["count"] == 3
        assert inference[part]["ns"] == sum(step["inference_stats"][part]["ns"] for step in steps), part
    assert inference["compute_infer"]["ns"] > 0
    assert inference["queue"]["count"] == 3 and inference["success"]["count"] == 3
    # compute is what the steps' batches took; the request's whole time is longer
    assert inference["success"]["ns"] > inference["compute_input"]["ns"] + inference["compute_infer"]["ns"] \
        + inference["compute_output"]["ns"]
    by_size = {entry["batch_size"]: entry for entry in ensemble["batch_stats"]}
    assert sorted(by_size) == [1, 2]
    assert by_size[2]["compute_infer"]["count"] == 2 and by_size[1]["compute_infer"]["count"] == 1
    assert by_size[1]["compute_infer"]["ns"] + by_size[2]["compute_infer"]["ns"] == inference["compute_infer"]["ns"]


SEQUENCE_ENSEMBLE = """
platform = "ensemble"
max_batch_size = 4
[[input]]
name = "VALUE"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "TOTAL"
data_type = "TYPE_INT32"
dims = [1]
[[ensemble_scheduling.step]]
model_name = "tens"
input_map = { X = "VALUE" }
output_map = { Y = "scaled" }
[[ensemble_scheduling.step]]
model_name = "acc"
input_map = { INPUT = "scaled" }
output_map = { OUTPUT = "TOTAL" }
"""

TENS_CONFIG = """
max_batch_size = 4
[[input]]
name = "X"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "Y"
data_type = "TYPE_INT32"
dims = [1]
[dynamic_batching]
"""

TENS = """
class Model:
    def infer(self, inputs):
        return {"Y": inputs["X"] * 10}
"""


def test_a_sequence_model_step_keeps_each_ensemble_sequences_state(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    """As Triton's EnsembleContext::InitStep, every step request carries the ensemble
    request's correlation id and start/end flags: a stateful accumulator as a step sums
    each sequence's values alone, with three sequences interleaved from three threads
    (HTTP and gRPC), and a sequence started again starts from zero."""
    from tests.e2e.test_sequences import ACCUMULATOR, ACCUMULATOR_MODEL

    repo.add("acc", ACCUMULATOR.format(strategy="[sequence_batching.direct]"), ACCUMULATOR_MODEL)
    repo.add("tens", TENS_CONFIG, TENS)
    repo.add("seq_chain", SEQUENCE_ENSEMBLE, model=None, version=1)
    server = serve(repo.root)
    values = {101: [1, 2, 3, 4], 202: [5, 6, 7], 303: [9, 9, 9, 9, 9]}
    start = threading.Barrier(len(values))

    def http_sequence(sequence_id: int) -> list[int]:
        client = httpclient.InferenceServerClient(server.url, network_timeout=120)
        start.wait()
        totals = []
        for i, value in enumerate(values[sequence_id]):
            infer_input = httpclient.InferInput("VALUE", [1, 1], "INT32")
            infer_input.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            result = client.infer("seq_chain", [infer_input], sequence_id=sequence_id, sequence_start=i == 0,
                                  sequence_end=i == len(values[sequence_id]) - 1)
            totals.append(int(result.as_numpy("TOTAL")[0, 0]))
        return totals

    def grpc_sequence(sequence_id: int) -> list[int]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        start.wait()
        totals = []
        for i, value in enumerate(values[sequence_id]):
            infer_input = grpcclient.InferInput("VALUE", [1, 1], "INT32")
            infer_input.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            result = client.infer("seq_chain", [infer_input], sequence_id=sequence_id, sequence_start=i == 0,
                                  sequence_end=i == len(values[sequence_id]) - 1)
            totals.append(int(result.as_numpy("TOTAL")[0, 0]))
        return totals

    def expected_totals(sequence_id: int) -> list[int]:
        return [10 * int(total) for total in np.cumsum(values[sequence_id])]

    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        calls = {101: pool.submit(http_sequence, 101), 202: pool.submit(grpc_sequence, 202),
                 303: pool.submit(http_sequence, 303)}
        got = {sequence_id: call.result(timeout=120) for sequence_id, call in calls.items()}
    assert got == {sequence_id: expected_totals(sequence_id) for sequence_id in values}
    # the same correlation id started again: a new sequence, from zero
    start = threading.Barrier(1)
    assert http_sequence(101) == expected_totals(101)
    acc = stats_of(server, "acc")
    assert acc["inference_stats"]["success"]["count"] == 4 + 3 + 5 + 4


def test_a_sequence_model_step_refuses_an_ensemble_request_without_a_sequence_id(repo: RepoBuilder, serve) -> None:  # type: ignore[no-untyped-def]
    from tests.e2e.test_sequences import ACCUMULATOR, ACCUMULATOR_MODEL

    repo.add("acc", ACCUMULATOR.format(strategy="[sequence_batching.direct]"), ACCUMULATOR_MODEL)
    repo.add("tens", TENS_CONFIG, TENS)
    repo.add("seq_chain", SEQUENCE_ENSEMBLE, model=None, version=1)
    server = serve(repo.root)
    client = httpclient.InferenceServerClient(server.url)
    infer_input = httpclient.InferInput("VALUE", [1, 1], "INT32")
    infer_input.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as failure:
        client.infer("seq_chain", [infer_input])
    assert failure.value.message() == ("in ensemble 'seq_chain', step 'acc': inference request to model 'acc' "
                                       "must specify a non-zero or non-empty correlation ID")
