"""A GPU batch's outputs copied to the host behind its kernels (``DeviceOutputs``): the
same arrays as the waiting path, and served, the next batch queues its kernels while the
one before still runs. Run where a CUDA device is visible; skipped cleanly elsewhere."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid.instances.sendable import worker_outputs
from nereid.tensors.device import DeviceOutputs
from tests.conftest import RepoBuilder

torch = pytest.importorskip("torch")

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool"]


def _tensor(rng: random.Random, dtype: str) -> object:
    shape = tuple(rng.choice([0, 1, 2, 3, 5, 7]) for _ in range(rng.randint(0, 3)))
    values = torch.randn(shape, device="cuda") * 100
    tensor = values.to(getattr(torch, dtype))
    if tensor.dim() >= 2 and rng.random() < 0.3:
        tensor = tensor.transpose(0, 1)  # not contiguous
    return tensor


def _same(got: dict[str, object], expected: dict[str, object]) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if isinstance(value, np.ndarray):
            assert isinstance(got[name], np.ndarray), name
            assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
            assert got[name].tobytes() == value.tobytes(), name
        else:
            assert got[name] is value, name


def test_outputs_in_flight_answer_exactly_as_the_waiting_copy() -> None:
    """Property test over dtypes, shapes (empty, scalar, transposed), one to four CUDA
    tensors and values that are not: ``start`` then ``wait`` gives the arrays that
    ``worker_outputs`` (the copy that waits) gives, byte for byte."""
    rng = random.Random(29)
    outputs = DeviceOutputs("cuda:0")
    for _ in range(300):
        raw: dict[str, object] = {f"T{i}": _tensor(rng, rng.choice(DTYPES)) for i in range(rng.randint(1, 4))}
        if rng.random() < 0.3:
            raw["NUMPY"] = np.arange(3, dtype=np.int32)
        if rng.random() < 0.2:
            raw["CPU"] = torch.ones(2, dtype=torch.float32)
        expected = worker_outputs(dict(raw))
        in_flight = outputs.start(raw)
        assert in_flight is not None
        _same(worker_outputs(in_flight.wait()), expected)


def test_nothing_is_queued_without_a_cuda_tensor_and_the_buffer_is_reused() -> None:
    outputs = DeviceOutputs("cuda:0")
    assert outputs.start([torch.ones(2, device="cuda")]) is None
    assert outputs.start({"A": np.ones(2), "B": torch.ones(2)}) is None
    first = outputs.start({"A": torch.full((4,), 7, device="cuda", dtype=torch.int64)})
    assert first is not None and first.wait()["A"].tolist() == [7] * 4
    assert outputs.pinned_bytes == 4 * 8
    second = outputs.start({"A": torch.full((2,), 3, device="cuda", dtype=torch.int64)})
    assert second is not None and second.wait()["A"].tolist() == [3, 3]
    assert outputs.pinned_bytes == 4 * 8  # the first batch's buffer, reused (a new one would hold 2 * 8)


CONFIG = """
max_batch_size = 4
input_tensors = "torch"
[[input]]
name = "IDS"
data_type = "TYPE_INT64"
dims = [2]
[[output]]
name = "DOUBLED"
data_type = "TYPE_INT64"
dims = [2]
[[output]]
name = "OVERLAPPED"
data_type = "TYPE_INT64"
dims = [1]
[dynamic_batching]
[[instance_group]]
count = 1
kind = "KIND_GPU"
"""

MODEL = """
import torch

class Model:
    def __init__(self, context):
        self.device = torch.device(context.device)

    def infer(self, inputs):
        ids = inputs["IDS"]
        # whether the batch before still runs on this instance's stream as this one starts
        overlapped = 0 if torch.cuda.current_stream(self.device).query() else 1
        torch.cuda._sleep(20_000_000)  # a long kernel: the batch's work runs on after infer returns
        doubled = ids * 2
        return {"DOUBLED": doubled, "OVERLAPPED": torch.full((ids.shape[0], 1), overlapped, device=self.device)}
"""


def test_the_next_batch_queues_its_kernels_while_the_one_before_runs(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    """A GPU process instance gives its turn to the next batch once this one's kernels
    and output copy are queued: under load some batch starts while the one before still
    runs on the device (the model sees its stream busy), and every answer is its own."""
    repo.add("in_flight", CONFIG, MODEL)
    server = serve(repo.root)

    def one(index: int) -> tuple[np.ndarray, int]:
        client = httpclient.InferenceServerClient(server.url)
        try:
            ids = httpclient.InferInput("IDS", [1, 2], "INT64")
            ids.set_data_from_numpy(np.array([[index, -index]], np.int64))
            result = client.infer("in_flight", [ids])
            return result.as_numpy("DOUBLED"), int(result.as_numpy("OVERLAPPED")[0, 0])
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(96)))
    for index, (doubled, _) in enumerate(results):
        np.testing.assert_array_equal(doubled, [[2 * index, -2 * index]])
    assert sum(overlapped for _, overlapped in results) > 0
