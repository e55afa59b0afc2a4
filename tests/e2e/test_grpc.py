"""The gRPC surface with stock tritonclient.grpc (sync, aio, streaming): every admin RPC,
infer on the one flow (same checks, batcher and statistics as HTTP), streaming for
non-decoupled and decoupled models, errors with Triton's status codes."""

from __future__ import annotations

import asyncio
import queue
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RepoBuilder, RunningServer, free_port, start_server
from tests.e2e.test_perf_analyzer import SMOKE_WINDOWS
from tests.waiting import GATED_IDENTITY

CONFIG = """
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

STRINGS = """
max_batch_size = 0
[[input]]
name = "TEXT"
data_type = "TYPE_STRING"
dims = [-1]
[[output]]
name = "LENGTHS"
data_type = "TYPE_INT64"
dims = [-1]
[[output]]
name = "ECHO"
data_type = "TYPE_STRING"
dims = [-1]
"""

STRINGS_MODEL = """
import numpy as np


class Model:
    def infer(self, inputs):
        texts = inputs["TEXT"]
        return {"LENGTHS": np.array([len(t) for t in texts], np.int64), "ECHO": texts}
"""

FAILING = """
class Model:
    def infer(self, inputs):
        raise ValueError("no luck")
"""

STEPS = """
max_batch_size = 0
[[input]]
name = "COUNT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "STEP"
data_type = "TYPE_INT32"
dims = [1]
[model_transaction_policy]
decoupled = true
"""

STEPS_MODEL = """
import numpy as np


class Model:
    def infer(self, inputs):
        for step in range(int(inputs["COUNT"][0])):
            yield {"STEP": np.array([step], np.int32)}
"""


#: Holds its instance until the test creates the file "open" beside model.py.
GATED = GATED_IDENTITY

FILL = """
max_batch_size = 0
[[input]]
name = "SIZE"
data_type = "TYPE_INT64"
dims = [1]
[[output]]
name = "BYTES"
data_type = "TYPE_UINT8"
dims = [-1]
"""

FILL_MODEL = """
import numpy as np


class Model:
    def infer(self, inputs):
        return {"BYTES": np.resize(np.arange(251, dtype=np.uint8), int(inputs["SIZE"][0]))}  # 0, 1, ..., 250, 0, ...
"""

#: Both gRPC engines answer the whole suite: nereid's own transport and grpcio's server.
ENGINES = ["native", "grpcio"]


@pytest.fixture(scope="module", params=ENGINES)
def grpc_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """One server per gRPC engine for the module's tests (a server start per test cost more
    than the tests): they leave every model loaded and ready, and read only statistics
    they moved themselves."""
    repo = RepoBuilder(tmp_path_factory.mktemp("grpc") / "models")
    repo.add("identity", CONFIG)
    repo.add("strings", STRINGS, model=STRINGS_MODEL)
    repo.add("failing", CONFIG, model=FAILING)
    repo.add("steps", STEPS, model=STEPS_MODEL)
    repo.add("gated", CONFIG, model=GATED)
    repo.add("fill", FILL, model=FILL_MODEL)
    grpc_port = free_port()
    server = start_server(repo.root, "--grpc-port", str(grpc_port), "--model-control-mode", "explicit",
                          "--load-model", "*", "--grpc-server", request.param,
                          log_dir=tmp_path_factory.mktemp("grpc-logs"))
    yield server
    server.stop()


def _client(server: RunningServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


def test_health_metadata_config_and_index(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity")
    assert not client.is_model_ready("nope")  # not an error: "not ready"
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "nereid" and "model_repository" in metadata["extensions"]
    model = client.get_model_metadata("identity", as_json=True)
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = client.get_model_config("identity", as_json=True)["config"]
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    index = {entry["name"]: entry for entry in client.get_model_repository_index(as_json=True)["models"]}
    assert index["identity"]["state"] == "READY"
    # the same answers as HTTP's
    http = httpclient.InferenceServerClient(grpc_server.url)
    assert http.get_model_config("identity")["max_batch_size"] == 8
    http.close()
    client.close()


def test_infer_raw_and_typed_contents_answer_as_http(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)

    def successes() -> int:
        stats = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]
        return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))  # JSON leaves zeros out

    before = successes()
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("identity", [_input("INPUT0", data, "FP32")], request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    assert result.get_response().id == "r1"
    texts = np.array([b"a", b"bcd", "é".encode()], dtype=np.object_)
    result = client.infer("strings", [_input("TEXT", texts, "BYTES")])
    np.testing.assert_array_equal(result.as_numpy("LENGTHS"), [1, 3, 2])
    assert list(result.as_numpy("ECHO")) == list(texts)
    only = client.infer("strings", [_input("TEXT", texts, "BYTES")], outputs=[grpcclient.InferRequestedOutput("ECHO")])
    assert only.as_numpy("LENGTHS") is None and list(only.as_numpy("ECHO")) == list(texts)
    assert successes() == before + 1  # counted once (the gRPC JSON's counts are strings)
    client.close()


def test_numbered_requests_each_get_their_own_id_and_values_back(grpc_server: RunningServer) -> None:
    """A client that numbers its requests (perf_analyzer --async): after the first, the
    server makes them from its memo; each answer carries its request's id and outputs,
    the empty id and a non-ASCII one included."""
    client = _client(grpc_server)
    for index, request_id in enumerate(["1", "2", "10", "", "é-7", "281474976710656", "3"]):
        data = np.full((1, 4), index, dtype=np.float32)
        result = client.infer("identity", [_input("INPUT0", data, "FP32")], request_id=request_id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        assert result.get_response().id == request_id
    client.close()


def test_classification_over_grpc(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)
    data = np.array([[0.1, 0.9, 0.5, 0.2]], np.float32)
    result = client.infer("identity", [_input("INPUT0", data, "FP32")],
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert [x.decode() for x in result.as_numpy("OUTPUT0")[0]] == ["0.900000:1", "0.500000:2"]
    client.close()


@pytest.mark.parametrize(
    "call, code, text",
    [
        (lambda c: c.infer("nope", [_input("INPUT0", np.zeros((1, 4), np.float32), "FP32")]),
         "StatusCode.NOT_FOUND", "unknown model"),
        (lambda c: c.infer("identity", [_input("INPUT0", np.zeros((1, 5), np.float32), "FP32")]),
         "StatusCode.INVALID_ARGUMENT", "INPUT0"),
        (lambda c: c.infer("identity", [_input("INPUT0", np.zeros((1, 4), np.int32), "INT32")]),
         "StatusCode.INVALID_ARGUMENT", "INPUT0"),
        (lambda c: c.infer("identity", [_input("INPUT0", np.zeros((9, 4), np.float32), "FP32")]),
         "StatusCode.INVALID_ARGUMENT", "batch"),
        (lambda c: c.infer("identity", [_input("WRONG", np.zeros((1, 4), np.float32), "FP32")]),
         "StatusCode.INVALID_ARGUMENT", "WRONG"),
        (lambda c: c.infer("failing", [_input("INPUT0", np.zeros((1, 4), np.float32), "FP32")]),
         "StatusCode.INTERNAL", "no luck"),
        (lambda c: c.infer("identity", [_input("INPUT0", np.zeros((1, 4), np.float32), "FP32")], model_version="x"),
         "StatusCode.INVALID_ARGUMENT", "version"),
        (lambda c: c.infer("steps", [_input("COUNT", np.array([2], np.int32), "INT32")]),
         "StatusCode.UNIMPLEMENTED", "decoupled"),
        (lambda c: c.get_model_metadata("nope"), "StatusCode.NOT_FOUND", "nope"),
        (lambda c: c.get_inference_statistics("nope"), "StatusCode.INVALID_ARGUMENT", "nope"),
    ],
    ids=["unknown-model", "shape", "datatype", "batch", "unknown-input", "model-raises", "version", "decoupled",
         "metadata-unknown", "stats-unknown"],
)
def test_errors_carry_triton_status_codes_and_name_the_culprit(grpc_server: RunningServer, call: Any, code: str,
                                                               text: str) -> None:
    client = _client(grpc_server)
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert _status(caught.value) == code
    assert text in caught.value.message()
    assert client.is_server_live()  # the server goes on
    client.close()


def test_a_stream_answers_in_order_with_in_band_errors(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for index in range(5):
        data = np.full((1, 4), index, np.float32)
        model = "failing" if index == 2 else "identity"
        client.async_stream_infer(model, [_input("INPUT0", data, "FP32")], request_id=str(index))
    answers = [results.get(timeout=30) for _ in range(5)]
    client.stop_stream()
    for index, (result, error) in enumerate(answers):
        if index == 2:
            assert result is None and "no luck" in str(error)
        else:
            assert error is None and result.get_response().id == str(index)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), index, np.float32))
    client.close()


def test_a_decoupled_model_streams_its_steps_with_the_final_flag(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer("steps", [_input("COUNT", np.array([3], np.int32), "INT32")], request_id="s",
                              enable_empty_final_response=True)
    steps = []
    while True:
        result, error = results.get(timeout=30)
        assert error is None
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if response.outputs:
            steps.append(int(result.as_numpy("STEP")[0]))
        if final:
            assert not response.outputs  # the empty final response asked for
            break
    client.stop_stream()
    assert steps == [0, 1, 2]
    client.close()


def test_the_aio_client_and_the_repository_api(grpc_server: RunningServer) -> None:
    async def main() -> None:
        client = grpcaio.InferenceServerClient(grpc_server.grpc_url)
        data = np.ones((1, 4), np.float32)
        answers = await asyncio.gather(*(client.infer("identity", [_input("INPUT0", data * i, "FP32")])
                                         for i in range(8)))
        for i, answer in enumerate(answers):
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), data * i)
        await client.unload_model("strings")
        assert not await client.is_model_ready("strings")
        await client.load_model("strings")
        assert await client.is_model_ready("strings")
        await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_a_busy_grpc_port_is_one_line_before_any_model_loads(repo: RepoBuilder, tmp_path: Path, engine: str) -> None:
    repo.add("identity", CONFIG)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AssertionError, match=re.escape(f"127.0.0.1:{port}")) as caught:
            start_server(repo.root, "--grpc-port", str(port), "--grpc-server", engine, log_dir=tmp_path)
    assert "loading" not in str(caught.value)


@pytest.mark.parametrize("extra", [[], ["--async"], ["--shared-memory", "system"]], ids=["sync", "async", "shm"])
def test_perf_analyzer_over_grpc(grpc_server: RunningServer, tmp_path: Path, extra: list[str]) -> None:
    import subprocess

    perf_analyzer = Path(__file__).resolve().parents[2] / "perf" / "perf_analyzer"
    result = subprocess.run(
        [str(perf_analyzer), "-m", "identity", "-u", grpc_server.grpc_url, "-i", "grpc", *extra,
         "--concurrency-range", "4", *SMOKE_WINDOWS],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout


def test_perf_analyzer_streams_a_decoupled_model_over_grpc(grpc_server: RunningServer, tmp_path: Path) -> None:
    import json
    import subprocess

    data = tmp_path / "count.json"
    data.write_text(json.dumps({"data": [{"COUNT": [2]}]}))
    perf_analyzer = Path(__file__).resolve().parents[2] / "perf" / "perf_analyzer"
    result = subprocess.run(
        [str(perf_analyzer), "-m", "steps", "-u", grpc_server.grpc_url, "-i", "grpc", "--streaming",
         "--input-data", str(data), "--concurrency-range", "2", *SMOKE_WINDOWS],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput:" in result.stdout


VECTOR = """
max_batch_size = 0
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [-1]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [-1]
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_message_over_the_size_limit_is_refused_and_the_server_goes_on(repo: RepoBuilder, tmp_path: Path,
                                                                          engine: str) -> None:
    repo.add("vector", VECTOR)
    port = free_port()
    server = start_server(repo.root, "--grpc-port", str(port), "--grpc-max-message-size", "2000",
                          "--grpc-server", engine, log_dir=tmp_path)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("vector", [_input("INPUT0", np.zeros(1000, np.float32), "FP32")])
        assert _status(caught.value) == "StatusCode.RESOURCE_EXHAUSTED"
        small = client.infer("vector", [_input("INPUT0", np.ones(10, np.float32), "FP32")])
        np.testing.assert_array_equal(small.as_numpy("OUTPUT0"), np.ones(10, np.float32))
        client.close()
    finally:
        server.stop()


def test_malformed_messages_and_wrong_raw_contents_get_a_status(grpc_server: RunningServer) -> None:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    channel = grpc.insecure_channel(grpc_server.grpc_url)
    raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(b"\xff\xff\xff\xff")  # not a protobuf message
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def request(raw: list[bytes], shape: list[int]) -> Any:
        message = service_pb2.ModelInferRequest(model_name="identity")
        tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
        assert tensor is not None
        message.raw_input_contents.extend(raw)
        return message

    cases = [
        (request([b"\0" * 12], [1, 4]), "input byte size mismatch for input 'INPUT0' for model 'identity'. "
                                         "Expected 16, got 12"),
        (request([b"\0" * 16, b"\0" * 16], [1, 4]), "expected 1 raw input contents (one per input) for model "
                                                      "'identity', got 2"),
        (request([], [1, 4]), "input 'INPUT0' for model 'identity' has no data"),
    ]
    for message, text in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(message)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert text in caught.value.details()
    assert stub.ServerLive(service_pb2.ServerLiveRequest()).live
    channel.close()


def test_text_generator_streams_over_grpc_to_the_stock_clients(example_server: RunningServer, tmp_path: Path) -> None:
    """The example decoupled model: tritonclient's stream gets its tokens, and perf_analyzer
    -i grpc --streaming loads it."""
    import json
    import subprocess

    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    text = np.array([[b"hello"]], dtype=np.object_)  # [batch 1] + dims [1]
    client.async_stream_infer("text_generator", [_input("text_input", text, "BYTES"),
                                                 _input("max_tokens", np.array([[3]], np.int32), "INT32")],
                              enable_empty_final_response=True)
    tokens = []
    while True:
        result, error = results.get(timeout=120)
        assert error is None, error
        response = result.get_response()
        if response.outputs:
            tokens.append(result.as_numpy("text_output")[0][0])
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    assert len(tokens) == 3
    data = tmp_path / "prompt.json"
    data.write_text(json.dumps({"data": [{"text_input": ["hello"], "max_tokens": [2]}]}))
    perf_analyzer = Path(__file__).resolve().parents[2] / "perf" / "perf_analyzer"
    run = subprocess.run(
        [str(perf_analyzer), "-m", "text_generator", "-u", example_server.grpc_url, "-i", "grpc", "--streaming",
         "--input-data", str(data), "--concurrency-range", "2",
         # a generated answer takes a while: windows long enough to hold some on a loaded machine
         "-p", "1000", "--stability-percentage", "1000", "--max-trials", "10"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Throughput:" in run.stdout


def test_a_deadline_that_passes_is_deadline_exceeded_and_the_server_goes_on(grpc_server: RunningServer) -> None:
    client = _client(grpc_server)
    with pytest.raises(InferenceServerException) as caught:  # the model holds until "open"
        client.infer("gated", [_input("INPUT0", np.ones((1, 4), np.float32), "FP32")], client_timeout=0.2)
    assert _status(caught.value) == "StatusCode.DEADLINE_EXCEEDED"
    assert grpc_server.repository is not None
    (grpc_server.repository / "gated" / "open").touch()
    answer = client.infer("identity", [_input("INPUT0", np.ones((1, 4), np.float32), "FP32")], client_timeout=30)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))
    client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_answered(grpc_server: RunningServer, algorithm: str) -> None:
    client = _client(grpc_server)
    data = np.arange(400, dtype=np.float32).reshape(100, 4) % 7
    data = data[:8]
    answer = client.infer("identity", [_input("INPUT0", data, "FP32")], compression_algorithm=algorithm)
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), data)
    client.close()


def test_an_unknown_method_is_unimplemented(grpc_server: RunningServer) -> None:
    import grpc

    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        for path in ("/inference.GRPCInferenceService/NoSuchCall", "/other.Service/Call"):
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary(path)(b"")
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, path
    assert _client(grpc_server).is_server_live()


SIZES = [64 << 10, (64 << 10) + 1, 1 << 20, 64 << 20]


@pytest.mark.parametrize("size", SIZES, ids=["64KiB", "64KiB+1", "1MiB", "64MiB"])
def test_answers_larger_than_one_frame_reach_the_stock_client(grpc_server: RunningServer, size: int) -> None:
    """grpc-core clients allow frames up to 16 MiB: answers past 64 KiB must be framed for them
    (they once hung to the deadline), unary and streaming."""
    expected = np.resize(np.arange(251, dtype=np.uint8), size)
    client = _client(grpc_server)
    answer = client.infer("fill", [_input("SIZE", np.array([size], np.int64), "INT64")], client_timeout=60)
    np.testing.assert_array_equal(answer.as_numpy("BYTES"), expected)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    for _ in range(2):
        client.async_stream_infer("fill", [_input("SIZE", np.array([size], np.int64), "INT64")])
    for _ in range(2):
        result, error = results.get(timeout=60)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("BYTES"), expected)
    client.stop_stream()
    client.close()
