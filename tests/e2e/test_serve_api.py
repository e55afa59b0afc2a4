"""``nereid.serve()``: the whole server (HTTP, gRPC, metrics) started from a Python script,
as a user runs it: the script in its own process, the stock clients against it, then
SIGINT or SIGTERM stops it cleanly and ``serve`` returns the exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder, RunningServer, free_port
from tests.waiting import START_TIMEOUT_S, wait_until

SCRIPT = """
import sys

import nereid

status = nereid.serve(
    sys.argv[1],
    http_port=int(sys.argv[2]),
    grpc_port=int(sys.argv[3]),
    metrics_port=int(sys.argv[4]),
    model_control_mode="explicit",
    load_model=["doubler"],
    exit_timeout_secs=10,
)
print(f"serve returned {status}", flush=True)
sys.exit(status)
"""

DOUBLER_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
[dynamic_batching]
"""

DOUBLER = """
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""


def start_script(tmp_path: Path, repository: Path) -> tuple[RunningServer, int]:
    script = tmp_path / "serve_models.py"
    script.write_text(textwrap.dedent(SCRIPT))
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "serve_models.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(script), str(repository), str(port), str(grpc_port), str(metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=tmp_path,
        )
    server = RunningServer(process, port, log_path, grpc_port=grpc_port)

    def ready() -> bool:
        assert process.poll() is None, f"the script exited with {process.returncode}:\n{server.log()}"
        try:
            with urllib.request.urlopen(server.http + "/v2/health/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    wait_until(ready, f"the script's server ready on {server.url}", timeout=START_TIMEOUT_S, every=0.05)
    return server, metrics_port


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_from_a_script_serves_http_grpc_and_metrics_until_a_signal(
    tmp_path: Path, repo: RepoBuilder, stop_signal: signal.Signals
) -> None:
    repo.add("doubler", DOUBLER_CONFIG, DOUBLER)
    repo.add("other", DOUBLER_CONFIG, DOUBLER)  # not in load_model: the option reached the server
    server, metrics_port = start_script(tmp_path, repo.root)
    try:
        data = np.array([[1, 2, 3, 4]], dtype=np.float32)

        http = httpclient.InferenceServerClient(server.url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(data)
        np.testing.assert_array_equal(http.infer("doubler", [x]).as_numpy("OUTPUT0"), data * 2)
        assert not http.is_model_ready("other")
        http.close()

        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        y = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        y.set_data_from_numpy(data)
        np.testing.assert_array_equal(grpc.infer("doubler", [y]).as_numpy("OUTPUT0"), data * 2)
        grpc.close()

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'nv_inference_count{model="doubler",version="1"} 2' in metrics, metrics
    finally:
        server.process.send_signal(stop_signal)
        try:
            status = server.process.wait(60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
            raise AssertionError(f"the script did not stop on {stop_signal.name}:\n{server.log()}") from None
    log = server.log()
    assert status == 0, log
    assert "serve returned 0" in log and "nereid stopped" in log, log
    assert "Traceback" not in log, log


def test_serve_refuses_what_the_command_refuses_before_starting(tmp_path: Path) -> None:
    """The keywords go through `nereid serve`'s own flag parsers: the same refusals, raised
    in the script before any port is bound."""
    code = textwrap.dedent(
        """
        import sys
        import nereid

        for kwargs in ({"http_port": 70000}, {"http_prot": 9000}, {"model_control_mode": "pol"}):
            try:
                nereid.serve(sys.argv[1], **kwargs)
            except (TypeError, ValueError) as exc:
                print(type(exc).__name__, exc)
        """
    )
    (tmp_path / "models").mkdir()
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "models")], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.splitlines() == [
        "ValueError nereid.serve(): http_port: expected a port 0..65535, got '70000'",
        "TypeError nereid.serve() got an unexpected keyword argument 'http_prot' (did you mean 'http_port'?)",
        "ValueError nereid.serve(): model_control_mode: expected one of none, poll, explicit, got 'pol'",
    ]
    cli = subprocess.run([sys.executable, "-m", "nereid", "serve", "--model-repository", str(tmp_path / "models"),
                          "--http-port", "70000"], capture_output=True, text=True, timeout=60)
    assert "expected a port 0..65535, got '70000'" in cli.stderr
