"""GPU instances (run where a CUDA device is visible; skipped cleanly elsewhere)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

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


SHARED_CONFIG = IDENTITY_CONFIG + """\
[[output]]
name = "WHERE"
data_type = "TYPE_STRING"
dims = [1]
[[instance_group]]
count = 2
kind = "KIND_GPU"
gpus = [0]
{processes}
"""

# Each batch answers with its instance's pid and the CUDA stream current in its thread
# (both instances wait at a barrier, so each request is in its own instance).
WHERE_MODEL = """
import os, threading
import torch

BARRIER = threading.Barrier(2, timeout=60)

class Model:
    def __init__(self, context):
        self.device = torch.device(context.device)
        self.name = context.instance_name

    def infer(self, inputs):
        BARRIER.wait()
        x = torch.as_tensor(inputs["INPUT0"]).to(self.device) * 2
        stream = torch.cuda.current_stream(self.device).cuda_stream
        where = f"{self.name} {os.getpid()} {stream}"
        return {"OUTPUT0": x, "WHERE": [[where]] * x.shape[0]}
"""


def where_together(server_url: str) -> list[tuple[str, int, int]]:
    """Two requests at once: (instance, pid, CUDA stream) of each."""

    def one(_: int) -> tuple[str, int, int]:
        client = httpclient.InferenceServerClient(server_url, network_timeout=120)
        try:
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            result = client.infer("gpu_model", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 2, np.float32))
            name, pid, stream = result.as_numpy("WHERE").reshape(-1)[0].decode().split()
            return name, int(pid), int(stream)
        finally:
            client.close()

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(2)))


def test_two_instances_on_one_gpu_share_a_process_and_each_has_its_own_stream(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("gpu_model", SHARED_CONFIG.format(processes=""), WHERE_MODEL)  # per_device: the default on a GPU
    server = serve(repo.root)
    answers = where_together(server.url)
    assert len({name for name, _, _ in answers}) == 2
    assert len({pid for _, pid, _ in answers}) == 1
    assert answers[0][1] != server.process.pid
    streams = {stream for _, _, stream in answers}
    assert len(streams) == 2 and 0 not in streams  # each its own, neither the default stream


def test_per_instance_gives_each_gpu_instance_its_own_process(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("gpu_model", SHARED_CONFIG.format(processes='processes = "per_instance"'), WHERE_MODEL.replace(
        "BARRIER.wait()", "pass"))
    server = serve(repo.root)
    answers = {name: pid for name, pid, _ in where_together(server.url) + where_together(server.url)}
    assert len(set(answers.values())) == len(answers)  # a process each (both requests may meet one instance)
