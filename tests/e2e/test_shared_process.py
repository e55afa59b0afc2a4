"""Process instances sharing one worker process (``processes = "per_device"``, the default
on a GPU; chosen here on the CPU): one OS process holds every instance of the model on its
device, each with its own Model, thread and channels; a crash of that process fails the
batches in it and it restarts; unload, reload, BLS and custom metrics work as for a
process each."""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer
from tests.waiting import MODEL_GATE, wait_until

SHARED = IDENTITY_CONFIG + """
[[instance_group]]
count = 2
kind = "KIND_CPU"
isolation = "process"
processes = "per_device"
"""

SPLIT = SHARED.replace('"per_device"', '"per_instance"')

# value 2: wait until the other instance is in infer too (a barrier of the module, which
# both instances see when they share a process); 4: wait for a file "release" next to
# model.py (after writing "holding"); 7: the process exits; 9: hang (after writing "hanging")
MODEL = """
import os, threading, time
from pathlib import Path

BARRIER = threading.Barrier(2, timeout=60)
HERE = Path(__file__).parent


class Model:
    def __init__(self, context):
        self.pid = os.getpid()
        self.number = int(context.instance_name.rsplit("_", 1)[1])

    def infer(self, inputs):
        x = inputs["INPUT0"]
        value = x[0, 0]
        if value == 2:
            BARRIER.wait()
        if value == 4:
            (HERE / "holding").write_text("")
            wait_for_file(HERE / "release")
        if value == 7:
            os._exit(7)
        if value == 9:
            (HERE / "hanging").write_text("")
            time.sleep(60)
        out = x.copy()
        out[:, 1] = self.pid
        out[:, 2] = self.number
        return {"OUTPUT0": out}
""" + MODEL_GATE

# A Triton model that asks "steady" over BLS and counts its calls per instance.
TRITON_MODEL = """
import os, threading
import triton_python_backend_utils as pb_utils

BARRIER = threading.Barrier(2, timeout=60)


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="shared_calls", description="BLS calls per instance", kind=pb_utils.MetricFamily.COUNTER)
        self.calls = self.family.Metric(labels={"instance": args["model_instance_name"]})

    def execute(self, requests):
        BARRIER.wait()
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="steady", requested_output_names=["OUTPUT0"], inputs=[pb_utils.Tensor("INPUT0", x)]
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy().copy()
            y[:, 1] = os.getpid()
            self.calls.increment(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""


def send(server: RunningServer, model: str, value: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    try:
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[value, 0, 0, 0]], np.float32))
        return client.infer(model, [x]).as_numpy("OUTPUT0")
    finally:
        client.close()


def send_together(server: RunningServer, model: str, values: list[float]) -> list[np.ndarray]:
    with ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(lambda value: send(server, model, value), values))


def error(server: RunningServer, model: str, value: float) -> str:
    with pytest.raises(InferenceServerException) as caught:
        send(server, model, value)
    return str(caught.value.message())


def stats(server: RunningServer, model: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{server.http}/v2/models/{model}/stats", timeout=10) as response:
        return json.loads(response.read())["model_stats"][0]  # type: ignore[no-any-return]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace")


def pid_and_instance(rows: np.ndarray) -> tuple[int, int]:
    return int(rows[0, 1]), int(rows[0, 2])


@pytest.fixture
def shared(serve, repo: RepoBuilder) -> RunningServer:  # type: ignore[no-untyped-def]
    repo.add("shared", SHARED, model=MODEL)
    repo.add("split", SPLIT, model=MODEL)
    repo.add("steady", IDENTITY_CONFIG)
    return serve(repo.root, "--model-control-mode", "explicit", "--load-model", "*")  # type: ignore[no-any-return]


def test_instances_share_one_process_and_run_batches_at_once(shared: RunningServer) -> None:
    # both requests wait at a barrier in model code: they pass only if the two instances
    # run their batches at the same time
    answers = [pid_and_instance(rows) for rows in send_together(shared, "shared", [2, 2])]
    assert {instance for _, instance in answers} == {0, 1}
    (pid,) = {pid for pid, _ in answers}
    assert pid != shared.process.pid and alive(pid)


def test_per_instance_gives_each_instance_a_process(shared: RunningServer, repo: RepoBuilder) -> None:
    folder = repo.root / "split"
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(send, shared, "split", 4)  # one instance waits for "release" ...
        wait_until((folder / "holding").exists, "one instance is holding")
        other = pid_and_instance(send(shared, "split", 1))  # ... the other answers meanwhile
        (folder / "release").write_text("")
        first = pid_and_instance(held.result())
    assert first[1] != other[1] and first[0] != other[0]


def test_a_crash_fails_the_batches_in_the_process_and_it_restarts(shared: RunningServer, repo: RepoBuilder) -> None:
    first, _ = pid_and_instance(send(shared, "shared", 1))
    hanging = repo.root / "shared" / "hanging"
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(error, shared, "shared", 9)  # runs on one instance ...
        wait_until(hanging.exists, "the hanging batch is running")
        crash = error(shared, "shared", 7)  # ... the crash on the other
        caught = stuck.result()
    for message in (crash, caught):
        assert message.startswith('model "shared" instance shared_')
        assert message.endswith(": its process exited with code 7 while running this batch (the instance restarts)")
    assert crash != caught  # each names its own instance
    # back: one new process for both instances
    answers = [pid_and_instance(rows) for rows in send_together(shared, "shared", [2, 2])]
    (second,) = {pid for pid, _ in answers}
    assert second != first and not alive(first)
    assert stats(shared, "shared")["instance_restarts"] == 2  # the restart of each instance in it
    assert send(shared, "steady", 3).tolist() == [[3.0, 0, 0, 0]]
    assert "model 'shared' instance shared_0, shared_1: process exited with code 7; restarting" in shared.log()


def test_unload_ends_the_process_and_reload_starts_a_new_one(shared: RunningServer) -> None:
    first, _ = pid_and_instance(send(shared, "shared", 1))
    client = httpclient.InferenceServerClient(shared.url, network_timeout=120)
    try:
        client.unload_model("shared")
        wait_until(lambda: not alive(first), "the shared process ended")
        client.load_model("shared")
    finally:
        client.close()
    answers = [pid_and_instance(rows) for rows in send_together(shared, "shared", [2, 2])]
    (second,) = {pid for pid, _ in answers}
    assert second != first


def test_statistics_count_the_batches_of_every_instance(shared: RunningServer) -> None:
    send_together(shared, "shared", [2, 2])
    send(shared, "shared", 1)
    model = stats(shared, "shared")
    assert model["inference_count"] == 3 and model["execution_count"] == 3
    assert model["inference_stats"]["success"]["count"] == 3


def test_bls_and_custom_metrics_work_from_shared_instances(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("caller", SHARED, model=TRITON_MODEL)
    repo.add("steady", IDENTITY_CONFIG)
    server = serve(repo.root)
    rows = send_together(server, "caller", [5, 6])
    assert sorted(float(r[0, 0]) for r in rows) == [5.0, 6.0]
    assert len({int(r[0, 1]) for r in rows}) == 1  # one process
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counted = sorted(line for line in text.splitlines() if line.startswith("shared_calls{"))
    assert counted == ['shared_calls{instance="caller_0"} 1', 'shared_calls{instance="caller_1"} 1']
