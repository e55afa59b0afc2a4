"""The GPU data path (``input_tensors = "torch"``) and GPU instances in processes (the
default there). Run where a CUDA device is visible; skipped cleanly elsewhere."""

from __future__ import annotations

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
[[output]]
name = "SPAN"
data_type = "TYPE_INT64"
dims = [2]
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
        self.instance = context.instance_name

    def infer(self, inputs):
        began = time.monotonic_ns()
        ids = inputs["IDS"]
        assert isinstance(ids, torch.Tensor) and ids.device == self.device, (type(ids), getattr(ids, "device", None))
        time.sleep(0.05)  # long enough for concurrent requests to reach both instances
        where = f"{ids.device}/{os.getpid()}/{self.instance}"
        span = torch.tensor([[began, time.monotonic_ns()]] * ids.shape[0])
        return {"DOUBLED": ids * 2, "HALF": ids.float() / 2, "WHERE": [[where]] * ids.shape[0], "SPAN": span}
"""


def infer_many(url: str, count: int) -> list[tuple[np.ndarray, np.ndarray, str, tuple[int, int]]]:
    def one(index: int) -> tuple[np.ndarray, np.ndarray, str, tuple[int, int]]:
        client = httpclient.InferenceServerClient(url)
        try:
            ids = httpclient.InferInput("IDS", [1, 3], "INT64")
            ids.set_data_from_numpy(np.full((1, 3), index, np.int64))
            result = client.infer("gpu_tensors", [ids])
            began, ended = (int(t) for t in result.as_numpy("SPAN")[0])
            return (result.as_numpy("DOUBLED"), result.as_numpy("HALF"), result.as_numpy("WHERE")[0, 0].decode(),
                    (began, ended))
        finally:
            client.close()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize(
    ("isolation", "processes"),
    [("", 1), ('isolation = "process"', 1), ('isolation = "process"\nprocesses = "per_instance"', 2),
     ('isolation = "thread"', 0)],
    ids=["default-is-process", "process-per-device", "process-per-instance", "thread"],
)
def test_gpu_instances_get_tensors_on_their_device_and_both_take_work(
    serve, repo: RepoBuilder, isolation: str, processes: int  # type: ignore[no-untyped-def]
) -> None:
    """Both instances on the GPU take work, with tensors on the device, in the processes
    the group asks for: on a GPU, process instances share one process per device by
    default (``processes = "per_device"``), a process each with ``"per_instance"``;
    thread instances run in the server's own process (``processes``: 0)."""
    repo.add("gpu_tensors", CONFIG.format(isolation=isolation), MODEL)
    server = serve(repo.root)
    results = infer_many(server.url, 16)
    for index, (doubled, half, _, _) in enumerate(results):
        np.testing.assert_array_equal(doubled, np.full((1, 3), 2 * index))
        np.testing.assert_allclose(half, np.full((1, 3), index / 2))
    places = [where.split("/") for _, _, where, _ in results]
    assert all(device.startswith("cuda:") for device, _, _ in places)
    assert {instance for _, _, instance in places} == {"gpu_tensors_0", "gpu_tensors_1"}
    pids = {pid for _, pid, _ in places}
    if processes:
        assert len(pids) == processes and str(server.process.pid) not in pids
    else:
        assert pids == {str(server.process.pid)}
    if processes != 2:  # instances in one process take turns in infer (DispatchTurns)
        spans = sorted({(span, where.split("/")[2]) for _, _, where, span in results})
        for ((_, ended), _), ((began, _), _) in zip(spans, spans[1:]):
            assert ended <= began, spans
