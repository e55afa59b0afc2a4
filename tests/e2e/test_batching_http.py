"""The dynamic batcher seen from outside: stock tritonclient against a real server,
batch sizes checked through the statistics endpoint."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RepoBuilder, RunningServer, start_server

BATCHED = """
max_batch_size = {max_batch}
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [{dims}]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [{dims}]
[dynamic_batching]
max_queue_delay_microseconds = {delay}
"""

RECORDING = """
import numpy as np
class Model:
    def __init__(self, context):
        pass
    def infer(self, inputs):
        x = inputs["INPUT0"]
        if np.any(x == -1):
            raise ValueError("negative one is poison")
        return {"OUTPUT0": x * 2}
"""


PADDED = BATCHED.format(max_batch=8, dims="-1", delay=2_000_000).replace(
    'dims = [-1]\n[[output]]', 'dims = [-1]\npad_value = 0\n[[output]]', 1)

SCALED = """
import numpy as np

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs, parameters):
        # one dict of request parameters per row of the batch
        scale = np.array([[float(p.get("scale", 1))] for p in parameters], np.float32)
        return {"OUTPUT0": inputs["INPUT0"] * scale}
"""

#: The models of the tests that share one server: each test has its own model (so its
#: batches and statistics are its own), with the config it is about.
MODELS = {
    # 8 requests, max_batch_size 8, a 2 s delay: the batch leaves when full, long before the delay
    "burst": (BATCHED.format(max_batch=8, dims="4", delay=2_000_000), RECORDING),
    "variable": (BATCHED.format(max_batch=8, dims="-1", delay=300_000), RECORDING),
    "padded": (PADDED, RECORDING),
    "poisoned": (BATCHED.format(max_batch=8, dims="2", delay=2_000_000), RECORDING),
    "counted": (BATCHED.format(max_batch=8, dims="2", delay=0), RECORDING),
    "scaled": (BATCHED.format(max_batch=8, dims="2", delay=2_000_000), SCALED),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module (a server start per test cost more than the tests)."""
    repo = RepoBuilder(tmp_path_factory.mktemp("batching") / "models")
    for name, (config, model) in MODELS.items():
        repo.add(name, config, model)
    running = start_server(repo.root, log_dir=tmp_path_factory.mktemp("batching-logs"))
    yield running
    running.stop()


def infer_one(url: str, model: str, data: np.ndarray) -> Any:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer(model, [tensor]).as_numpy("OUTPUT0")
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def batch_sizes(url: str, model: str) -> dict[int, int]:
    client = httpclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}


def burst(url: str, model: str, arrays: list[np.ndarray]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(len(arrays)) as pool:
        return list(pool.map(lambda a: infer_one(url, model, a), arrays))


def test_a_burst_of_concurrent_requests_with_a_long_queue_delay_forms_one_batch(server: RunningServer) -> None:
    arrays = [np.full((1, 4), i, np.float32) for i in range(8)]
    results = burst(server.url, "burst", arrays)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full((1, 4), 2 * i, np.float32))
    assert batch_sizes(server.url, "burst") == {8: 1}


def test_requests_with_different_variable_dims_never_share_a_batch(server: RunningServer) -> None:
    arrays = [np.ones((1, 3), np.float32)] * 3 + [np.ones((1, 5), np.float32)] * 3
    results = burst(server.url, "variable", arrays)
    for array, result in zip(arrays, results):
        np.testing.assert_array_equal(result, array * 2)
    sizes = batch_sizes(server.url, "variable")
    assert sum(size * count for size, count in sizes.items()) == 6
    assert max(sizes) <= 3


def test_padded_input_lets_different_lengths_share_a_batch(server: RunningServer) -> None:
    arrays = [np.ones((1, n), np.float32) for n in (2, 3, 4, 5, 2, 3, 4, 5)]
    results = burst(server.url, "padded", arrays)
    for array, result in zip(arrays, results):
        # rows come back padded to the longest in the batch: the request's own part is intact
        np.testing.assert_array_equal(result[:, : array.shape[1]], array * 2)
        assert np.all(result[:, array.shape[1]:] == 0)
    assert batch_sizes(server.url, "padded") == {8: 1}


def test_a_failing_request_fails_alone_and_the_server_stays_up(server: RunningServer) -> None:
    arrays = [np.full((1, 2), i, np.float32) for i in range(7)] + [np.full((1, 2), -1, np.float32)]
    results = burst(server.url, "poisoned", arrays)
    error = results[7]
    assert isinstance(error, InferenceServerException)
    assert error.status() == "500"
    assert 'model "poisoned" raised in infer: ValueError: negative one is poison' in error.message()
    for i in range(7):
        np.testing.assert_array_equal(results[i], np.full((1, 2), 2 * i, np.float32))
    # and the next request still works
    np.testing.assert_array_equal(infer_one(server.url, "poisoned", np.ones((1, 2), np.float32)),
                                  np.full((1, 2), 2, np.float32))


def test_statistics_count_requests_rows_and_executions(server: RunningServer) -> None:
    for _ in range(3):
        infer_one(server.url, "counted", np.ones((2, 2), np.float32))
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("counted")["model_stats"][0]
    all_stats = client.get_inference_statistics()["model_stats"]
    client.close()
    assert stats["name"] == "counted" and stats["version"] == "1"
    assert stats["inference_count"] == 6
    assert stats["execution_count"] == 3
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3
    assert inference["queue"]["count"] == 3
    assert inference["compute_infer"]["count"] == 3
    assert inference["fail"]["count"] == 0
    assert stats["last_inference"] > 0
    # every model's entry, "counted"'s the same as asked for alone
    assert sorted(s["name"] for s in all_stats) == sorted(MODELS)
    assert [s for s in all_stats if s["name"] == "counted"] == [stats]


@pytest.mark.parametrize("kind", ["KIND_GPU", "GPU"])
def test_kind_gpu_without_a_gpu_is_unavailable_with_the_reason(serve, repo: RepoBuilder, kind: str) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    repo.add("gpu_model", BATCHED.format(max_batch=8, dims="2", delay=0) + f'\n[[instance_group]]\nkind = "{kind}"\n', RECORDING)
    repo.add("cpu_model", BATCHED.format(max_batch=8, dims="2", delay=0), RECORDING)
    server = serve(repo.root, "--strict-readiness", "false")
    client = httpclient.InferenceServerClient(server.url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index["cpu_model"]["state"] == "READY"
    assert index["gpu_model"]["state"] == "UNAVAILABLE"
    assert "KIND_GPU requested but no GPU is visible" in index["gpu_model"]["reason"]



def test_request_parameters_reach_a_model_whose_infer_takes_them_one_dict_per_row(server: RunningServer) -> None:
    def call(scale: int) -> Any:
        client = httpclient.InferenceServerClient(server.url)
        try:
            tensor = httpclient.InferInput("INPUT0", [2, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((2, 2), np.float32))
            return client.infer("scaled", [tensor], parameters={"scale": scale}).as_numpy("OUTPUT0")
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, [1, 2, 3, 4]))
    for scale, result in zip([1, 2, 3, 4], results):
        np.testing.assert_array_equal(result, np.full((2, 2), scale, np.float32))
    assert batch_sizes(server.url, "scaled") == {8: 1}  # four requests, two rows each, one batch
