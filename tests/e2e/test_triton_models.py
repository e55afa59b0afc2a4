"""Triton Python-backend models served unchanged: Triton's own python_backend examples
(tests/triton_examples/, laid out as their READMEs show) called with their own stock
tritonclient client scripts; and what nereid adds around them (per-request error
responses, statistics, request parameters, both protocols)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid.config.pbtxt import pbtxt_to_toml
from tests import conftest
from tests.conftest import RepoBuilder, RunningServer, start_server, with_isolation, write_config

TRITON_EXAMPLES = Path(__file__).resolve().parent.parent / "triton_examples"
RUN_CLIENT = TRITON_EXAMPLES / "run_client.py"


def copy_examples(root: Path) -> None:
    """Triton's examples into ``root``; under ``--isolation process`` each config says so
    for its instance groups (converted to TOML and written in --repo-format: nothing
    else changes)."""
    shutil.copytree(TRITON_EXAMPLES / "models", root)
    if conftest.ISOLATION == "thread":  # the examples as they are
        return
    for config in root.glob("*/config.pbtxt"):
        text = with_isolation(pbtxt_to_toml(config, config.parent.name), config.parent.name)
        config.unlink()
        write_config(config.parent, text)


@pytest.fixture(scope="module")
def examples_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("triton-models") / "models"
    copy_examples(root)
    server = start_server(root, log_dir=tmp_path_factory.mktemp("triton-logs"))
    yield server
    server.stop()


@pytest.mark.parametrize(
    "client",
    ["add_sub/client.py", "decoupled/square_client.py", "decoupled/repeat_client.py", "bls/sync_client.py",
     "auto_complete/client.py", "custom_metrics/client.py", "sequence/simple_http_sequence_sync_infer_client.py",
     "sequence/simple_grpc_sequence_sync_infer_client.py", "sequence/simple_grpc_sequence_stream_infer_client.py"],
)
def test_tritons_example_clients_pass_against_nereid(examples_server: RunningServer, client: str) -> None:
    """Each client script runs unchanged; only its hard-coded localhost:8000/8001/8002 is
    pointed at the test server's ports (run_client.py)."""
    assert examples_server.grpc_port is not None
    result = subprocess.run(
        [sys.executable, str(RUN_CLIENT), str(examples_server.port), str(examples_server.grpc_port),
         str(TRITON_EXAMPLES / "clients" / client)],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TRITON_EXAMPLE_METRICS_PORT=str(examples_server.metrics_port)),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PASS" in result.stdout


def test_tritons_aio_sequence_stream_client_passes_against_nereid(examples_server: RunningServer) -> None:
    """The asyncio gRPC client takes its server from ``-u`` (run_client.py patches only the
    sync clients)."""
    result = subprocess.run(
        [sys.executable, str(RUN_CLIENT), str(examples_server.port), str(examples_server.grpc_port),
         str(TRITON_EXAMPLES / "clients" / "sequence" / "simple_grpc_aio_sequence_stream_infer_client.py"),
         "-u", f"127.0.0.1:{examples_server.grpc_port}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "PASS: grpc aio sequence stream" in result.stdout


def test_the_examples_config_and_metadata_are_tritons(examples_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    config = client.get_model_config("square_int32")
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert [i["name"] for i in config["input"]] == ["IN"]
    auto = client.get_model_config("batch_auto_complete")  # no config file: auto_complete_config made it
    assert auto["max_batch_size"] == 4 and "dynamic_batching" in auto
    metadata = client.get_model_metadata("add_sub")
    assert [(i["name"], i["datatype"], i["shape"]) for i in metadata["inputs"]] == [
        ("INPUT0", "FP32", [4]), ("INPUT1", "FP32", [4])]
    client.close()


PER_REQUEST = """
name: "picky"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""

PER_REQUEST_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.batches = []

    def execute(self, requests):
        self.batches.append(len(requests))
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input in request " + request.request_id(),
                                               pb_utils.TritonError.INVALID_ARG)))
                continue
            scale = json.loads(request.parameters()).get("scale", 1)
            out = pb_utils.Tensor("Y", (x * scale + len(self.batches) * 0).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''


def test_an_error_response_fails_only_its_request_and_parameters_reach_the_model(
    repo: RepoBuilder, tmp_path: Path
) -> None:
    folder = repo.root / "picky"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PER_REQUEST)
    (folder / "1" / "model.py").write_text(textwrap.dedent(PER_REQUEST_MODEL))
    server = start_server(repo.root, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: dict[str, object] = {}

        def infer(value: int, request_id: str, scale: int | None = None) -> None:
            data = np.array([[value]], np.int32)
            inputs = [grpcclient.InferInput("X", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(data)
            try:
                answer = client.infer("picky", inputs, request_id=request_id,
                                      parameters={"scale": scale} if scale is not None else None)
                results[request_id] = int(answer.as_numpy("Y")[0, 0])
            except InferenceServerException as exc:
                results[request_id] = exc

        import threading

        threads = [threading.Thread(target=infer, args=args) for args in ((3, "a", 2), (-1, "b"), (5, "c"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert results["a"] == 6 and results["c"] == 5
        failure = results["b"]
        assert isinstance(failure, InferenceServerException)
        assert failure.status() == "StatusCode.INVALID_ARGUMENT"
        assert "negative input in request b" in failure.message()
        stats = client.get_inference_statistics("picky", as_json=True)["model_stats"][0]["inference_stats"]
        assert int(stats["success"]["count"]) == 2 and int(stats["fail"]["count"]) == 1
        client.close()
    finally:
        server.stop()


PROCESS_PBTXT = """
name: "isolated"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { name: "workers" count: 1 kind: KIND_CPU } ]
parameters { key: "instance_group.workers.isolation" value: { string_value: "process" } }
"""


def test_a_triton_model_in_a_process_instance(repo: RepoBuilder, tmp_path: Path) -> None:
    folder = repo.root / "isolated"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PROCESS_PBTXT)
    shutil.copy(TRITON_EXAMPLES / "models" / "add_sub" / "1" / "model.py", folder / "1" / "model.py")
    server = start_server(repo.root, log_dir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(server.url)
        a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
        inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"), httpclient.InferInput("INPUT1", [2, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        answer = client.infer("isolated", inputs)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), a - b)
        client.close()
    finally:
        server.stop()


def test_the_decoupled_example_in_a_process_instance(tmp_path: Path) -> None:
    """square_int32 with its instance group in a process (nereid's extension, carried as
    a config parameter): responses sent from the model's own threads in the process reach
    the stock streaming client."""
    root = tmp_path / "models"
    shutil.copytree(TRITON_EXAMPLES / "models" / "square_int32", root / "square_int32")
    config = root / "square_int32" / "config.pbtxt"
    text = config.read_text().replace("instance_group [{ kind: KIND_CPU }]", "")
    assert text != config.read_text()
    config.write_text(text + textwrap.dedent("""
        instance_group [ { name: "squares" kind: KIND_CPU } ]
        parameters { key: "instance_group.squares.isolation" value: { string_value: "process" } }
    """))
    server = start_server(root, log_dir=tmp_path)
    try:
        assert server.grpc_port is not None
        result = subprocess.run(
            [sys.executable, str(RUN_CLIENT), str(server.port), str(server.grpc_port),
             str(TRITON_EXAMPLES / "clients" / "decoupled" / "square_client.py")],
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "PASS: square_int32" in result.stdout
        with httpclient.InferenceServerClient(server.url) as one_off:
            config_json = one_off.get_model_config("square_int32")
        assert config_json["parameters"]["instance_group.squares.isolation"] == {"string_value": "process"}
    finally:
        server.stop()


def test_tritons_qa_ensemble_of_python_models_passes_its_stock_test(tmp_path: Path) -> None:
    """Triton's qa ensemble of two add_sub Python models (qa/L0_backend_python/ensemble),
    laid out as its test.sh lays it out, passes its own ensemble_test.py unchanged (its CPU
    test, as test.sh runs it where there is no GPU). TEST_JETSON=1 is the script's own
    switch that skips its probe of Triton's Python-backend shared-memory regions, which
    need Triton's triton_shm_monitor module; nereid has no such regions."""
    qa = TRITON_EXAMPLES / "qa"
    models = tmp_path / "models"
    (models / "ensemble" / "1").mkdir(parents=True)
    shutil.copy(qa / "python_models" / "ensemble" / "config.pbtxt", models / "ensemble")
    for name in ("add_sub_1", "add_sub_2"):
        (models / name / "1").mkdir(parents=True)
        shutil.copy(qa / "python_models" / "add_sub" / "config.pbtxt", models / name)
        shutil.copy(qa / "python_models" / "add_sub" / "model.py", models / name / "1")
    server = start_server(models, log_dir=tmp_path)
    try:
        assert server.grpc_port is not None
        test_dir = qa / "L0_backend_python" / "ensemble"
        result = subprocess.run(
            [sys.executable, str(RUN_CLIENT), str(server.port), str(server.grpc_port), "ensemble_test.py",
             "EnsembleTest.test_ensemble"],
            capture_output=True, text=True, timeout=120, cwd=test_dir, env={**os.environ, "TEST_JETSON": "1"},
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Ran 1 test" in result.stderr and "OK" in result.stderr
