"""Sequence batching end to end: stateful models served by the real server and called
with stock tritonclient over HTTP (JSON and binary) and gRPC (unary and streaming), and
through the in-process API. Several sequences interleave from several threads; each must
see only its own state, in order. Refusals carry Triton's status and message."""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import nereid
from tests.conftest import RepoBuilder, RunningServer

ACCUMULATOR = """
name = "acc"
max_batch_size = 4
[[input]]
name = "INPUT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "OUTPUT"
data_type = "TYPE_INT32"
dims = [1]
[sequence_batching]
max_sequence_idle_microseconds = 60000000
{strategy}
[[sequence_batching.control_input]]
name = "START"
control = [{{ kind = "CONTROL_SEQUENCE_START", int32_false_true = [0, 1] }}]
[[sequence_batching.control_input]]
name = "END"
control = [{{ kind = "CONTROL_SEQUENCE_END", bool_false_true = [false, true] }}]
[[sequence_batching.control_input]]
name = "CORRID"
control = [{{ kind = "CONTROL_SEQUENCE_CORRID", data_type = "TYPE_UINT64" }}]
[[sequence_batching.state]]
input_name = "STATE_IN"
output_name = "STATE_OUT"
data_type = "TYPE_INT32"
dims = [1]
initial_state = [{{ data_type = "TYPE_INT32", dims = [1], zero_data = true, name = "zero" }}]
[[instance_group]]
count = 2
[[model_warmup]]
name = "a sequence of one step"
batch_size = 2
inputs = {{ INPUT = {{ data_type = "TYPE_INT32", dims = [1], zero_data = true }} }}
"""

#: nereid's own model API: the state arrives as an input and leaves as an output.
ACCUMULATOR_MODEL = """
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        total = inputs["STATE_IN"] + inputs["INPUT"]
        return {"OUTPUT": total, "STATE_OUT": total}
"""

#: Triton's python_backend API, string correlation ids (a TYPE_STRING CORRID) and no batching:
#: one slot per instance, so two instances for two sessions at once.
TRITON_SESSIONS = """
name = "sessions"
max_batch_size = 0
[[input]]
name = "WORD"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "TEXT"
data_type = "TYPE_STRING"
dims = [1]
[sequence_batching]
direct = {}
[[sequence_batching.control_input]]
name = "CORRID"
control = [{ kind = "CONTROL_SEQUENCE_CORRID", data_type = "TYPE_STRING" }]
[[sequence_batching.state]]
input_name = "SO_FAR"
output_name = "SO_FAR_OUT"
data_type = "TYPE_STRING"
dims = [1]
[[instance_group]]
count = 2
kind = "KIND_CPU"
"""

TRITON_SESSIONS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            word = pb_utils.get_input_tensor_by_name(request, "WORD").as_numpy()[0]
            so_far = pb_utils.get_input_tensor_by_name(request, "SO_FAR").as_numpy()[0]
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()[0]
            assert request.correlation_id() == corrid.decode()  # Triton's request.correlation_id()
            first = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            assert first == (so_far == b"")
            text = np.array([so_far + word], dtype=object)
            tagged = np.array([corrid + b":" + so_far + word], dtype=object)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT", tagged), pb_utils.Tensor("SO_FAR_OUT", text)]))
        return responses
"""


#: A model that keeps its state per batch row, as Triton's own sequence test models do
#: (qa/L0_sequence_batcher): with the direct strategy a row is a slot, an empty slot below
#: a ready one gets a null request (READY false) so every sequence keeps its row.
ROWS = """
name = "rows"
max_batch_size = 4
[[input]]
name = "INPUT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "OUTPUT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "READY_SEEN"
data_type = "TYPE_INT32"
dims = [4]
[sequence_batching]
max_sequence_idle_microseconds = 60000000
direct = {}
[[sequence_batching.control_input]]
name = "START"
control = [{ kind = "CONTROL_SEQUENCE_START", int32_false_true = [0, 1] }]
[[sequence_batching.control_input]]
name = "END"
control = [{ kind = "CONTROL_SEQUENCE_END", int32_false_true = [0, 1] }]
[[sequence_batching.control_input]]
name = "READY"
control = [{ kind = "CONTROL_SEQUENCE_READY", int32_false_true = [0, 1] }]
[[sequence_batching.control_input]]
name = "CORRID"
control = [{ kind = "CONTROL_SEQUENCE_CORRID", data_type = "TYPE_UINT64" }]
[[instance_group]]
count = 1
kind = "KIND_CPU"
"""

ROWS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0, 0])


class TritonPythonModel:
    def initialize(self, args):
        self.totals = [0, 0, 0, 0]  # one running sum per batch row: a row is a slot

    def execute(self, requests):
        ready = [_value(request, "READY") for request in requests]
        seen = np.array([ready + [-1] * (4 - len(ready))], dtype=np.int32)
        responses = []
        for row, request in enumerate(requests):
            if ready[row]:
                value = _value(request, "INPUT")
                self.totals[row] = value if _value(request, "START") else self.totals[row] + value
                assert _value(request, "CORRID") == request.correlation_id()
            else:  # a null request: nothing in it is meaningful, and its answer is dropped
                assert (_value(request, "START"), _value(request, "END"), _value(request, "CORRID")) == (0, 0, 0)
                assert (request.correlation_id(), request.flags()) == (0, 0)
            total = np.array([[self.totals[row] if ready[row] else -1]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("READY_SEEN", seen)]))
        return responses
"""

#: One slot (no batching, one instance): a second sequence waits in the backlog.
ONE_SLOT = """
name = "one_slot"
max_batch_size = 0
[[input]]
name = "INPUT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "OUTPUT"
data_type = "TYPE_INT32"
dims = [1]
[sequence_batching]
max_sequence_idle_microseconds = 60000000
[[instance_group]]
count = 1
kind = "KIND_CPU"
"""

ONE_SLOT_MODEL = """
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        return {"OUTPUT": inputs["INPUT"]}
"""

#: Both gRPC engines: nereid's own transport and grpcio's server.
GRPC_ENGINES = ["native", "grpcio"]


def _serve_acc(repo: RepoBuilder, serve: Callable[..., RunningServer], strategy: str = "direct = {}",
               *args: str) -> RunningServer:
    repo.add("acc", ACCUMULATOR.format(strategy=strategy), ACCUMULATOR_MODEL)
    return serve(repo.root, *args)


def _http_input(value: int, binary: bool = True) -> list[httpclient.InferInput]:
    item = httpclient.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(np.array([[value]], dtype=np.int32), binary_data=binary)
    return [item]


def _grpc_input(value: int) -> list[grpcclient.InferInput]:
    item = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [item]


def _run_threads(count: int, body: Callable[[int], list[int]]) -> dict[int, list[int]]:
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = body(index)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return results


def _expected(index: int, steps: int) -> list[int]:
    """Running sums of index*100 + k, k = 1..steps."""
    values = [index * 100 + k for k in range(1, steps + 1)]
    return [sum(values[: k + 1]) for k in range(steps)]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_interleaved_http_sequences_from_several_threads_each_keep_their_own_state(
    repo: RepoBuilder, serve: Callable[..., RunningServer], binary: bool
) -> None:
    server = _serve_acc(repo, serve)
    steps = 6

    def sequence(index: int) -> list[int]:
        client = httpclient.InferenceServerClient(server.url)
        outputs = []
        for k in range(1, steps + 1):
            result = client.infer("acc", _http_input(index * 100 + k, binary), sequence_id=1000 + index,
                                  sequence_start=k == 1, sequence_end=k == steps,
                                  outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)])
            outputs.append(int(result.as_numpy("OUTPUT")[0, 0]))
            assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT"]  # the state stays inside
        client.close()
        return outputs

    results = _run_threads(6, sequence)
    assert results == {index: _expected(index, steps) for index in range(6)}
    with httpclient.InferenceServerClient(server.url) as one_off:
        stats = one_off.get_inference_statistics("acc")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 36


@pytest.mark.parametrize("engine", GRPC_ENGINES)
def test_interleaved_grpc_sequences_with_the_oldest_strategy(
    repo: RepoBuilder, serve: Callable[..., RunningServer], engine: str
) -> None:
    server = _serve_acc(repo, serve, "oldest = { max_candidate_sequences = 4, max_queue_delay_microseconds = 1000 }",
                        "--grpc-server", engine)
    steps = 5

    def sequence(index: int) -> list[int]:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        outputs = []
        for k in range(1, steps + 1):
            result = client.infer("acc", _grpc_input(index * 100 + k), sequence_id=2000 + index,
                                  sequence_start=k == 1, sequence_end=k == steps)
            outputs.append(int(result.as_numpy("OUTPUT")[0, 0]))
        client.close()
        return outputs

    assert _run_threads(10, sequence) == {index: _expected(index, steps) for index in range(10)}


@pytest.mark.parametrize("engine", GRPC_ENGINES)
def test_grpc_streaming_carries_several_sequences_on_one_stream(
    repo: RepoBuilder, serve: Callable[..., RunningServer], engine: str
) -> None:
    server = _serve_acc(repo, serve, "direct = {}", "--grpc-server", engine)
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    for k in range(1, 4):
        for index in range(3):
            client.async_stream_infer("acc", _grpc_input(index * 100 + k), request_id=f"{index}_{k}",
                                      sequence_id=3000 + index, sequence_start=k == 1, sequence_end=k == 3)
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(9):
        answer = answers.get(timeout=60)
        assert not isinstance(answer, InferenceServerException), answer
        index = int(answer.get_response().id.split("_")[0])
        got[index].append(int(answer.as_numpy("OUTPUT")[0, 0]))
    client.stop_stream()
    client.close()
    assert got == {index: _expected(index, 3) for index in range(3)}


def test_a_request_without_a_sequence_id_is_refused_as_triton_refuses_it(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    server = _serve_acc(repo, serve)
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as raised:
        http.infer("acc", _http_input(1))
    assert raised.value.status() == "400"
    assert raised.value.message() == (
        "inference request to model 'acc' must specify a non-zero or non-empty correlation ID")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as raised:
        grpc.infer("acc", _grpc_input(1))
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify a non-zero or non-empty correlation ID" in str(raised.value.message())


def test_an_unknown_sequence_without_start_and_a_wrong_id_type_are_refused(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    server = _serve_acc(repo, serve)
    http = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as raised:
        http.infer("acc", _http_input(1), sequence_id=77)
    assert raised.value.message() == ("inference request for sequence 77 to model 'acc' must specify the START "
                                      "flag on the first request of the sequence")
    with pytest.raises(InferenceServerException) as raised:
        http.infer("acc", _http_input(1), sequence_id="seventy-seven", sequence_start=True, request_id="r1")
    assert raised.value.message() == ("[request id: r1] sequence batching control 'CORRID' data-type is 'BYTES', "
                                      "but model 'acc' expects 'UINT64'")
    with pytest.raises(InferenceServerException) as raised:  # a finished sequence needs START again
        http.infer("acc", _http_input(1), sequence_id=78, sequence_start=True, sequence_end=True)
        http.infer("acc", _http_input(1), sequence_id=78)
    assert "sequence 78 to model 'acc' must specify the START flag" in str(raised.value.message())
    assert int(http.infer("acc", _http_input(5), sequence_id=79, sequence_start=True).as_numpy("OUTPUT")[0, 0]) == 5


def test_config_and_metadata_show_sequence_batching_and_not_the_hidden_tensors(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    server = _serve_acc(repo, serve)
    http = httpclient.InferenceServerClient(server.url)
    config = http.get_model_config("acc")
    batching = config["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == 60000000 and "direct" in batching
    assert [c["name"] for c in batching["control_input"]] == ["START", "END", "CORRID"]
    assert batching["state"][0]["input_name"] == "STATE_IN"
    assert "dynamic_batching" not in config
    metadata = http.get_model_metadata("acc")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT"]
    grpc_config = grpcclient.InferenceServerClient(server.grpc_url).get_model_config("acc", as_json=True)
    assert grpc_config["config"]["sequence_batching"]["control_input"][2]["control"][0]["data_type"] == "TYPE_UINT64"


def test_a_triton_model_keeps_string_state_per_string_correlation_id(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    repo.add("sessions", TRITON_SESSIONS, TRITON_SESSIONS_MODEL, version=1)
    server = serve(repo.root)
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def say(session: str, word: str, start: bool = False) -> str:
        item = grpcclient.InferInput("WORD", [1], "BYTES")
        item.set_data_from_numpy(np.array([word.encode()], dtype=object))
        result = client.infer("sessions", [item], sequence_id=session, sequence_start=start)
        return result.as_numpy("TEXT")[0].decode()

    assert say("alice", "a", start=True) == "alice:a"
    assert say("bob", "x", start=True) == "bob:x"
    assert say("alice", "b") == "alice:ab"
    assert say("bob", "y") == "bob:xy"
    assert say("alice", "c", start=True) == "alice:c"  # a START begins afresh
    assert say("bob", "z") == "bob:xyz"


@pytest.mark.without_workers("in process: no server")
def test_the_in_process_api_takes_sequence_arguments(repo: RepoBuilder) -> None:
    repo.add("acc", ACCUMULATOR.format(strategy="direct = {}"), ACCUMULATOR_MODEL)
    with nereid.Server(repo.root) as server:
        infer = partial(server.infer, "acc", sequence_id=5)
        first = infer({"INPUT": np.array([[2]], dtype=np.int32)}, sequence_start=True)
        second = infer({"INPUT": np.array([[3]], dtype=np.int32)}, sequence_end=True)
        assert (int(first["OUTPUT"][0, 0]), int(second["OUTPUT"][0, 0])) == (2, 5)
        assert list(second) == ["OUTPUT"]
        with pytest.raises(nereid.InvalidInputError, match="must specify a non-zero or non-empty correlation ID"):
            server.infer("acc", {"INPUT": np.array([[1]], dtype=np.int32)})


@pytest.mark.perf
# HTTP in --sync mode: asynchronous perf_analyzer sends a sequence's requests on several
# connections, so when it ends its sequences at exit an END can overtake that sequence's
# START still in flight (refused as Triton refuses it); a gRPC stream keeps their order.
@pytest.mark.parametrize("protocol", [
    pytest.param(["-i", "http", "--sync"], id="http"),
    pytest.param(["-i", "grpc", "--streaming"], id="grpc-stream"),
])
def test_perf_analyzer_drives_a_sequence_model(
    repo: RepoBuilder, serve: Callable[..., RunningServer], protocol: list[str]
) -> None:
    """Stock perf_analyzer sees sequence_batching in the config and sends sequences (ids,
    START and END) by itself; a smoke run, not a measurement."""
    from tests.e2e.test_perf_analyzer import PERF_ANALYZER, SMOKE_WINDOWS, perf_analyzer_missing

    missing = perf_analyzer_missing()
    if missing is not None:
        pytest.fail(f"perf_analyzer is not installed (make perf-analyzer): {missing}")
    server = _serve_acc(repo, serve)
    url = server.url if protocol[1] == "http" else server.grpc_url
    result = subprocess.run(
        [str(PERF_ANALYZER), "-m", "acc", "-u", url, *protocol, "--concurrency-range", "4", "--sequence-length", "5",
         *SMOKE_WINDOWS],
        check=False, capture_output=True, text=True, timeout=100,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "error" not in output.lower(), output
    with httpclient.InferenceServerClient(server.url) as one_off:
        stats = one_off.get_inference_statistics("acc")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["inference_stats"]["success"]["count"] > 0


def test_direct_batch_rows_are_slots_with_ready_false_in_empty_slots_below_a_ready_one(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    repo.add("rows", ROWS, ROWS_MODEL, version=1)
    server = serve(repo.root)
    client = httpclient.InferenceServerClient(server.url)

    def step(sequence: int, value: int, start: bool = False, end: bool = False) -> tuple[int, list[int]]:
        result = client.infer("rows", _http_input(value), sequence_id=sequence, sequence_start=start,
                              sequence_end=end)
        return int(result.as_numpy("OUTPUT")[0, 0]), result.as_numpy("READY_SEEN")[0].tolist()

    assert step(1, 1, start=True) == (1, [1, -1, -1, -1])  # slot 0
    assert step(2, 10, start=True) == (10, [0, 1, -1, -1])  # slot 1, slot 0 not ready
    assert step(3, 100, start=True) == (100, [0, 0, 1, -1])  # slot 2
    assert step(2, 20) == (30, [0, 1, -1, -1])  # the batch stops at the highest ready slot
    assert step(1, 2) == (3, [1, -1, -1, -1])  # row 0's sum survived the null rows
    assert step(3, 300, end=True) == (400, [0, 0, 1, -1])
    assert step(1, 3, end=True) == (6, [1, -1, -1, -1])
    stats = client.get_inference_statistics("rows")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 7  # null requests are not requests
    client.close()


def test_a_backlogged_sequence_past_its_timeout_is_rejected_with_tritons_status_and_message(
    repo: RepoBuilder, serve: Callable[..., RunningServer]
) -> None:
    repo.add("one_slot", ONE_SLOT, ONE_SLOT_MODEL)
    server = serve(repo.root)
    client = httpclient.InferenceServerClient(server.url)
    item = httpclient.InferInput("INPUT", [1], "INT32")
    item.set_data_from_numpy(np.array([7], dtype=np.int32))
    client.infer("one_slot", [item], sequence_id=1, sequence_start=True)  # holds the one slot
    with pytest.raises(InferenceServerException) as raised:  # waits for a slot 50 ms, gets none
        client.infer("one_slot", [item], sequence_id=2, sequence_start=True, timeout=50_000)
    assert raised.value.status() == "503"
    assert raised.value.message() == "timeout of the corresponding sequence has been expired"
    with pytest.raises(InferenceServerException, match="sequence 2 to model 'one_slot' must specify the START"):
        client.infer("one_slot", [item], sequence_id=2)
    # in a slot, a timeout never applies
    assert int(client.infer("one_slot", [item], sequence_id=1, timeout=1).as_numpy("OUTPUT")[0]) == 7
    stats = client.get_inference_statistics("one_slot")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 1
    client.close()
