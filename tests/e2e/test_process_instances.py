"""Process instances (``isolation = "process"``) as a user meets them: a model that
crashes, exits or fails costs only its own request; the instance restarts; the other
models and the batch-mates are served; nothing outlives the server."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer
from tests.waiting import wait_until

PROCESS = IDENTITY_CONFIG + """
[dynamic_batching]
max_queue_delay_microseconds = 200000
[[instance_group]]
count = 1
kind = "KIND_CPU"
isolation = "process"
"""

# A model whose behaviour is chosen by the first value of each request's row.
FRAGILE = """
import ctypes, os, time

class Model:
    def __init__(self, context):
        self.pid = os.getpid()

    def infer(self, inputs):
        x = inputs["INPUT0"]
        for value in x[:, 0]:
            if value == 11:
                ctypes.string_at(0)            # SIGSEGV in this thread
            if value == 7:
                os._exit(7)
            if value == 5:
                raise ValueError("five")
            if value == 3:
                raise SystemExit(3)
            if value == 9:
                time.sleep(60)
        out = x.copy()
        out[:, 1] = self.pid
        return {"OUTPUT0": out}
"""


def send(server: RunningServer, model: str, value: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    try:
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[value, 0, 0, 0]], np.float32))
        return client.infer(model, [x]).as_numpy("OUTPUT0")
    finally:
        client.close()


def error(server: RunningServer, model: str, value: float) -> str:
    with pytest.raises(InferenceServerException) as caught:
        send(server, model, value)
    return str(caught.value.message())


def stats(server: RunningServer, model: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"{server.http}/v2/models/{model}/stats", timeout=10) as response:
        return json.loads(response.read())["model_stats"][0]  # type: ignore[no-any-return]


def children(server: RunningServer) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


@pytest.fixture
def fragile(serve, repo: RepoBuilder) -> RunningServer:  # type: ignore[no-untyped-def]
    repo.add("fragile", PROCESS, model=FRAGILE)
    repo.add("steady", IDENTITY_CONFIG)
    return serve(repo.root)  # type: ignore[no-any-return]


def test_the_model_runs_in_a_process_of_its_own(fragile: RunningServer) -> None:
    pid = int(send(fragile, "fragile", 1)[0, 1])
    assert pid != fragile.process.pid and pid in children(fragile)


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        pytest.param(11, "killed by SIGSEGV", id="segfault"),
        pytest.param(7, "exited with code 7", id="os._exit"),
    ],
)
def test_a_crash_costs_only_its_request_and_the_instance_restarts(fragile: RunningServer, value: int, cause: str) -> None:
    first = int(send(fragile, "fragile", 1)[0, 1])
    assert error(fragile, "fragile", value) == (
        f'model "fragile" instance fragile_0: its process {cause} while running this batch (the instance restarts)'
    )
    assert send(fragile, "steady", 2).tolist() == [[2.0, 0, 0, 0]]  # other models serve throughout
    second = int(send(fragile, "fragile", 1)[0, 1])  # waits for the restart
    assert second != first
    log = fragile.log()
    assert f"model 'fragile' instance fragile_0: process {cause}; restarting" in log


def test_exceptions_and_base_exceptions_fail_only_their_request(fragile: RunningServer) -> None:
    pid = int(send(fragile, "fragile", 1)[0, 1])
    assert error(fragile, "fragile", 5) == 'model "fragile" raised in infer: ValueError: five'
    assert error(fragile, "fragile", 3) == 'model "fragile" raised in infer: SystemExit: 3'
    assert int(send(fragile, "fragile", 1)[0, 1]) == pid  # no restart for an exception
    assert "Traceback (most recent call last)" in fragile.log()  # logged by the instance's process


def test_the_batch_mates_of_a_crashing_request_are_served(fragile: RunningServer) -> None:
    """One batch (a 200 ms queue delay gathers them): the crasher fails alone."""
    before = int(send(fragile, "fragile", 1)[0, 1])
    values = [1, 2, 11, 4, 6]
    with ThreadPoolExecutor(len(values)) as pool:
        futures = [pool.submit(send, fragile, "fragile", v) for v in values]
        outcomes: list[object] = []
        for future in futures:
            try:
                outcomes.append(future.result()[0, :2].tolist())
            except InferenceServerException as exc:
                outcomes.append(str(exc.message()))
    served = outcomes[:2] + outcomes[3:]
    assert [row[0] for row in served] == [1.0, 2.0, 4.0, 6.0]  # type: ignore[index]
    assert "killed by SIGSEGV" in str(outcomes[2])
    # They shared the crasher's batch: each was rerun, alone, on the restarted process.
    assert all(row[1] != before for row in served)  # type: ignore[index]
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats(fragile, "fragile")["batch_stats"]} == {1: 5}
    assert stats(fragile, "fragile")["inference_stats"]["fail"]["count"] == 1


def test_a_crash_while_loading_makes_the_model_unavailable_with_its_cause(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("dies", PROCESS, model="import os\nos._exit(4)\n")
    repo.add("raises", PROCESS, model="class Model:\n    def __init__(self, context):\n        raise RuntimeError('no weights')\n"
                                      "    def infer(self, inputs):\n        return inputs\n")
    server = serve(repo.root, "--strict-readiness", "false")
    log = server.log()
    assert "instance dies_0's process exited with code 4 while loading" in log
    assert "Model.__init__ failed for instance raises_0: RuntimeError: no weights" in log  # as for a thread
    assert "raised in __init__ (logged once" in log  # the traceback, from the instance's process


def test_no_process_outlives_the_server(fragile: RunningServer) -> None:
    send(fragile, "fragile", 1)
    workers = children(fragile)
    assert workers
    assert fragile.stop() == 0
    wait_until(lambda: not any(_alive(pid) for pid in workers), "a worker process outlived the server")


def test_no_process_outlives_a_killed_server(fragile: RunningServer) -> None:
    send(fragile, "fragile", 1)
    workers = children(fragile)
    fragile.process.kill()
    fragile.process.wait()
    fragile.stopped = True
    wait_until(lambda: not any(_alive(pid) for pid in workers), "a worker process outlived its killed server")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited


SLEEPY = """
import time

class Model:
    def infer(self, inputs):
        x = inputs["INPUT0"]
        if (x[:, 0] == 9).any():
            time.sleep(float(x[0, 1]))
        return {"OUTPUT0": x}
"""


def timed_config(isolation: str) -> str:
    return "execution_timeout_ms = 300\n" + IDENTITY_CONFIG + f"""
[[instance_group]]
count = 1
kind = "KIND_CPU"
isolation = "{isolation}"
"""


def send_row(server: RunningServer, model: str, row: list[float]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    try:
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([row], np.float32))
        return client.infer(model, [x]).as_numpy("OUTPUT0")
    finally:
        client.close()


def status(server: RunningServer, path: str) -> int:
    try:
        with urllib.request.urlopen(server.http + path, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_thread_instance_stuck_past_its_timeout_fails_its_batch_and_leaves_rotation(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("sleepy", timed_config("thread"), model=SLEEPY)
    server = serve(repo.root)
    with pytest.raises(InferenceServerException) as caught:
        send_row(server, "sleepy", [9, 3, 0, 0])  # sleeps 3 s; the limit is 300 ms
    assert caught.value.message() == (
        'model "sleepy" instance sleepy_0: the batch ran past execution_timeout_ms (300 ms); '
        "the instance is out of rotation until it returns"
    )
    assert status(server, "/v2/models/sleepy/ready") == 400  # its only instance is stuck
    index = json.loads(urllib.request.urlopen(urllib.request.Request(
        server.http + "/v2/repository/index", data=b"{}", method="POST"), timeout=10).read())
    assert index[0]["state"] == "UNAVAILABLE" and "stuck in a batch past execution_timeout_ms" in index[0]["reason"]
    assert send_row(server, "sleepy", [1, 0, 0, 0]).tolist() == [[1, 0, 0, 0]]  # served once the stuck batch returns
    wait_until(lambda: status(server, "/v2/models/sleepy/ready") == 200, "the instance came back in rotation")


def test_a_process_instance_past_its_timeout_is_killed_and_restarted(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("sleepy", timed_config("process"), model=SLEEPY)
    server = serve(repo.root)
    with pytest.raises(InferenceServerException) as caught:
        send_row(server, "sleepy", [9, 30, 0, 0])
    assert caught.value.message() == (
        'model "sleepy" instance sleepy_0: the batch ran past execution_timeout_ms (300 ms); '
        "its process was killed and restarts"
    )
    assert send_row(server, "sleepy", [1, 0, 0, 0]).tolist() == [[1, 0, 0, 0]]  # after the restart
    wait_until(lambda: status(server, "/v2/models/sleepy/ready") == 200, "ready again after the restart")
    assert stats(server, "sleepy")["instance_restarts"] == 1
    with urllib.request.urlopen(server.http.replace(str(server.port), _metrics_port(server)) + "/metrics") as response:
        assert 'nereid_instance_restarts{model="sleepy",version="1"} 1' in response.read().decode()


def test_a_restarting_model_is_not_ready_and_comes_back_on_its_own(fragile: RunningServer) -> None:
    assert status(fragile, "/v2/models/fragile/ready") == 200
    with pytest.raises(InferenceServerException):
        send(fragile, "fragile", 7)  # exits: the instance restarts (0.1 s backoff, then a new process)
    seen_unready = status(fragile, "/v2/models/fragile/ready") == 400 or "restarting" in fragile.log()
    assert seen_unready
    wait_until(lambda: status(fragile, "/v2/models/fragile/ready") == 200, "the model came back on its own")
    assert stats(fragile, "fragile")["instance_restarts"] >= 1


def _metrics_port(server: RunningServer) -> str:
    args = server.process.args
    assert isinstance(args, list)
    return str(args[args.index("--metrics-port") + 1])
