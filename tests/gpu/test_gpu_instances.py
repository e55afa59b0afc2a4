"""GPU instances (run where a CUDA device is visible; skipped cleanly elsewhere)."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

from tests.conftest import IDENTITY_CONFIG, RepoBuilder

CONFIG = IDENTITY_CONFIG + """\
[[output]]
name = "DEVICE"
data_type = "TYPE_STRING"
dims = [1]
[dynamic_batching]
[[instance_group]]
count = 2
kind = "{kind}"
isolation = "{isolation}"
"""

MODEL = """
import torch

class Model:
    def __init__(self, context):
        self.device = torch.device(context.device)
        self.name = context.device

    def infer(self, inputs):
        x = torch.as_tensor(inputs["INPUT0"]).to(self.device)
        return {"OUTPUT0": x * 2, "DEVICE": [[self.name]] * x.shape[0]}  # a CUDA tensor out; DEVICE is [rows, 1]
"""


def run(server_url: str) -> tuple[np.ndarray, list[bytes]]:
    client = httpclient.InferenceServerClient(server_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 4), np.float32))
        result = client.infer("gpu_model", [tensor])
        return result.as_numpy("OUTPUT0"), list(result.as_numpy("DEVICE").reshape(-1))
    finally:
        client.close()


def test_kind_gpu_instances_get_a_cuda_device_and_cuda_outputs_come_back(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("gpu_model", CONFIG.format(kind="KIND_GPU", isolation="thread"), MODEL)
    server = serve(repo.root)
    outputs, devices = run(server.url)
    np.testing.assert_array_equal(outputs, np.full((2, 4), 2, np.float32))
    assert all(device.startswith(b"cuda:") for device in devices)


def test_kind_auto_picks_the_gpu_when_one_is_visible(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("gpu_model", CONFIG.format(kind="KIND_AUTO", isolation="thread"), MODEL)
    server = serve(repo.root)
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config("gpu_model")
    client.close()
    assert [group["kind"] for group in config["instance_group"]] == ["KIND_GPU"]
    _, devices = run(server.url)
    assert devices[0].startswith(b"cuda:")


def test_process_instances_set_their_cuda_device_in_their_own_process(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("gpu_model", CONFIG.format(kind="KIND_GPU", isolation="process"), MODEL)
    server = serve(repo.root)
    outputs, devices = run(server.url)
    np.testing.assert_array_equal(outputs, np.full((2, 4), 2, np.float32))  # a CUDA tensor, moved by the worker
    assert all(device.startswith(b"cuda:") for device in devices)
