"""The GPU data path (``input_tensors = "torch"``) and GPU instances in processes (the
default there). Run where a CUDA device is visible; skipped cleanly elsewhere."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid.tensors.device import DeviceInputs, outputs_to_host
from tests.conftest import RepoBuilder

torch = pytest.importorskip("torch")


def test_inputs_go_through_a_reused_pinned_buffer_onto_the_device() -> None:
    to_device = DeviceInputs("cuda:0")
    first = to_device({"IDS": np.arange(8, dtype=np.int64).reshape(2, 4)})
    held = to_device.pinned_bytes
    second = to_device({"IDS": np.arange(8, 16, dtype=np.int64).reshape(2, 4)})
    assert first["IDS"].is_cuda and second["IDS"].device == torch.device("cuda:0")
    np.testing.assert_array_equal(first["IDS"].cpu().numpy(), np.arange(8).reshape(2, 4))
    np.testing.assert_array_equal(second["IDS"].cpu().numpy(), np.arange(8, 16).reshape(2, 4))
    assert to_device.pinned_bytes == held == 64  # the same buffer, reused
    larger = to_device({"IDS": np.ones((4, 4), np.int64)})
    assert to_device.pinned_bytes == 128 and int(larger["IDS"].sum()) == 16  # grown once


def test_several_cuda_outputs_come_back_in_one_copy_with_their_dtypes_and_shapes() -> None:
    raw = {
        "A": torch.arange(6, device="cuda", dtype=torch.float16).reshape(2, 3),
        "B": torch.tensor([[1], [2]], device="cuda", dtype=torch.int64),
        "C": np.zeros(2, np.float32),
    }
    host = outputs_to_host(raw)
    np.testing.assert_array_equal(host["A"], np.arange(6, dtype=np.float16).reshape(2, 3))
    assert host["A"].dtype == np.float16 and host["B"].dtype == np.int64
    np.testing.assert_array_equal(host["B"], [[1], [2]])
    assert host["C"] is raw["C"]


CONFIG = """
max_batch_size = 8
input_tensors = "torch"
[[input]]
name = "IDS"
data_type = "TYPE_INT64"
dims = [3]
[[output]]
name = "DOUBLED"
data_type = "TYPE_INT64"
dims = [3]
[[output]]
name = "HALF"
data_type = "TYPE_FP32"
dims = [3]
[[output]]
name = "WHERE"
data_type = "TYPE_STRING"
dims = [1]
[dynamic_batching]
[[instance_group]]
count = 2
kind = "KIND_GPU"
{isolation}
"""

MODEL = """
import os
import time

import torch

class Model:
    def __init__(self, context):
        self.device = torch.device(context.device)

    def infer(self, inputs):
        ids = inputs["IDS"]
        assert isinstance(ids, torch.Tensor) and ids.device == self.device, (type(ids), getattr(ids, "device", None))
        time.sleep(0.05)  # long enough for concurrent requests to reach both instances
        where = f"{ids.device}/{os.getpid()}"
        return {"DOUBLED": ids * 2, "HALF": ids.float() / 2, "WHERE": [[where]] * ids.shape[0]}
"""


def infer_many(url: str, count: int) -> list[tuple[np.ndarray, np.ndarray, str]]:
    def one(index: int) -> tuple[np.ndarray, np.ndarray, str]:
        client = httpclient.InferenceServerClient(url)
        try:
            ids = httpclient.InferInput("IDS", [1, 3], "INT64")
            ids.set_data_from_numpy(np.full((1, 3), index, np.int64))
            result = client.infer("gpu_tensors", [ids])
            return result.as_numpy("DOUBLED"), result.as_numpy("HALF"), result.as_numpy("WHERE")[0, 0].decode()
        finally:
            client.close()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize(
    ("isolation", "in_processes"), [("", True), ('isolation = "process"', True), ('isolation = "thread"', False)],
    ids=["default-is-process", "process", "thread"],
)
def test_gpu_instances_get_tensors_on_their_device_and_both_take_work(
    serve, repo: RepoBuilder, isolation: str, in_processes: bool  # type: ignore[no-untyped-def]
) -> None:
    repo.add("gpu_tensors", CONFIG.format(isolation=isolation), MODEL)
    server = serve(repo.root)
    results = infer_many(server.url, 16)
    for index, (doubled, half, _) in enumerate(results):
        np.testing.assert_array_equal(doubled, np.full((1, 3), 2 * index))
        np.testing.assert_allclose(half, np.full((1, 3), index / 2))
    places = {where for _, _, where in results}
    assert all(where.startswith("cuda:") for where in places)
    pids = {where.split("/")[1] for where in places}
    if in_processes:  # two instances, each a process of its own, both served
        assert len(pids) == 2 and str(os.getpid()) not in pids
    else:
        assert len(pids) == 1
