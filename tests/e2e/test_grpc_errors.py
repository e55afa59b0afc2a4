"""The gRPC twins of the HTTP error suite (test_bad_input.py, test_shared_memory.py): the
same bad requests, against the same models of one real server, sent as ModelInferRequest
messages on grpcio's stock channel; each gets Triton's gRPC status and the same text as
over HTTP, and a good request right after still succeeds."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import RunningServer
from tests.waiting import wait_until
from tests.e2e.test_bad_input import (  # noqa: F401  (module fixtures)
    BROKEN_FAILURE,
    PARTIAL_FAILURE,
    PREFIX,
    SHAPE_NOTE,
    repo_root,
    server,
)

A = np.arange(16, dtype=np.int32)
B = np.ones(16, dtype=np.int32)


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[Any]:  # noqa: F811
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def simple(**changes: Any) -> Any:
    """A good request for ``simple`` (raw contents); ``changes`` set top-level fields."""
    message = service_pb2.ModelInferRequest(model_name="simple")
    for name, data in (("INPUT0", A), ("INPUT1", B)):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(data.tobytes())
    for key, value in changes.items():
        setattr(message, key, value)
    return message


def assert_error(call: Any, code: grpc.StatusCode, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert (caught.value.code(), caught.value.details()) == (code, message)


def assert_serving(stub: Any) -> None:
    response = stub.ModelInfer(simple())
    out0 = np.frombuffer(response.raw_output_contents[0], np.int32)
    np.testing.assert_array_equal(out0, A + B)


# -- unknown models and versions (test_bad_input's first table) ---------------------------


@pytest.mark.parametrize(
    ("rpc", "request_", "code", "message"),
    [
        ("ModelInfer", service_pb2.ModelInferRequest(model_name="nope"), "NOT_FOUND",
         "Request for unknown model: 'nope' is not found"),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="nope"), "NOT_FOUND",
         "Request for unknown model: 'nope' is not found"),
        ("ModelConfig", service_pb2.ModelConfigRequest(name="nope"), "NOT_FOUND",
         "Request for unknown model: 'nope' is not found"),
        ("ModelInfer", service_pb2.ModelInferRequest(model_name="simple", model_version="3"), "NOT_FOUND",
         "Request for unknown model: 'simple' version 3 is not found"),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="simple", version="3"), "NOT_FOUND",
         "Request for unknown model: 'simple' version 3 is not found"),
        ("ModelInfer", service_pb2.ModelInferRequest(model_name="partial", model_version="2"), "UNAVAILABLE",
         "Request for unknown model: 'partial' version 2 is not at ready state; it is UNAVAILABLE: " + PARTIAL_FAILURE),
        ("ModelConfig", service_pb2.ModelConfigRequest(name="partial", version="2"), "UNAVAILABLE",
         "Request for unknown model: 'partial' version 2 is not at ready state; it is UNAVAILABLE: " + PARTIAL_FAILURE),
        ("ModelInfer", service_pb2.ModelInferRequest(model_name="broken"), "NOT_FOUND",
         "Request for unknown model: 'broken' has no available versions; version 1 is UNAVAILABLE: " + BROKEN_FAILURE),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="broken"), "NOT_FOUND",
         "Request for unknown model: 'broken' has no available versions; version 1 is UNAVAILABLE: " + BROKEN_FAILURE),
        ("ModelInfer", service_pb2.ModelInferRequest(model_name="simple", model_version="99999999999999999999"),
         "INVALID_ARGUMENT", "failed to get model version from specified version string '99999999999999999999'"),
        ("ModelReady", service_pb2.ModelReadyRequest(name="simple", version="99999999999999999999"),
         "INVALID_ARGUMENT", "failed to get model version from specified version string '99999999999999999999'"),
        ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="nope"), "INVALID_ARGUMENT",
         "requested model 'nope' is not available"),
        ("ModelStatistics", service_pb2.ModelStatisticsRequest(name="simple", version="3"), "INVALID_ARGUMENT",
         "requested model version is not available for model 'simple'"),
    ],
    ids=["infer-unknown-model", "metadata-unknown-model", "config-unknown-model", "infer-unknown-version",
         "metadata-unknown-version", "infer-version-not-ready", "config-version-not-ready", "infer-no-ready-version",
         "metadata-no-ready-version",
         "infer-version-overflow", "ready-version-overflow", "stats-unknown-model", "stats-unknown-version"],
)
def test_unknown_models_and_versions_get_tritons_status_and_text(
    stub: Any, repo_root: Path, rpc: str, request_: Any, code: str, message: str
) -> None:
    message = message.replace("{root}", str(repo_root))
    assert_error(lambda: getattr(stub, rpc)(request_), getattr(grpc.StatusCode, code), message)
    assert_serving(stub)


def test_model_ready_is_false_for_what_is_not_ready(stub: Any) -> None:
    for name, version in (("nope", ""), ("simple", "3"), ("partial", "2"), ("broken", "")):
        assert not stub.ModelReady(service_pb2.ModelReadyRequest(name=name, version=version)).ready, (name, version)
    assert stub.ModelReady(service_pb2.ModelReadyRequest(name="simple", version="1")).ready


# -- requests that do not fit the model (test_bad_input's second and third tables) ------


def _replace_input(index: int, **fields: Any) -> Any:
    message = simple()
    tensor = message.inputs[index]
    for key, value in fields.items():
        if key == "shape":
            del tensor.shape[:]
            tensor.shape.extend(value)
        else:
            setattr(tensor, key, value)
    return message


def _drop_input1() -> Any:
    message = simple()
    del message.inputs[1]
    del message.raw_input_contents[1]
    return message


def _with_outputs(*names: str) -> Any:
    message = simple()
    for name in names:
        message.outputs.add(name=name)
    return message


def _with_parameter(key: str, **value: Any) -> Any:
    message = simple()
    for kind, setting in value.items():
        setattr(message.parameters[key], kind, setting)
    return message


def _extra_input() -> Any:
    message = simple()
    message.inputs[1].name = "EXTRA"
    return message


def _duplicate_input() -> Any:
    message = simple()
    message.inputs[1].name = "INPUT0"
    return message


def _batch_of(rows: int) -> Any:
    message = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[rows, 16])
        message.raw_input_contents.append(np.zeros((rows, 16), np.int32).tobytes())
    return message


def _raw_and_contents() -> Any:
    message = simple()
    message.inputs[0].contents.int_contents.extend(A.tolist())
    return message


def _short_blob() -> Any:
    message = simple()
    message.raw_input_contents[0] = A.tobytes()[:60]
    return message


def _fp16_contents() -> Any:
    message = service_pb2.ModelInferRequest(model_name="fp16")
    tensor = message.inputs.add(name="INPUT0", datatype="FP16", shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    return message


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_raw_and_contents(), (f"{PREFIX}contents field must not be specified when using raw_input_contents for 'INPUT0' for "
                               "model 'simple'")),
        (_fp16_contents(), (f"{PREFIX}FP16 data for input 'INPUT0' of model 'fp16' must be sent in raw_input_contents (it has "
                            "no typed contents field)")),
        (_replace_input(0, shape=[1, 15]),
         f"{PREFIX}unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]. {SHAPE_NOTE}"),
        (_replace_input(0, datatype="FP32"),
         f"{PREFIX}inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
        (_replace_input(0, datatype="FLOAT"),
         ("invalid datatype for input INPUT0: 'FLOAT' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, "
          "INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES (model 'simple')")),
        (_drop_input1(),
         (f"{PREFIX}expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but missing "
          "required input(s) ['INPUT1']. Please provide all required input(s).")),
        (_extra_input(), "unexpected inference input 'EXTRA' for model 'simple'"),
        (_with_outputs("OUTPUT9"), "unexpected inference output 'OUTPUT9' for model 'simple'"),
        (_with_outputs("OUTPUT0", "OUTPUT0"), f"{PREFIX}output 'OUTPUT0' already exists in request"),
        (_duplicate_input(), f"{PREFIX}input 'INPUT0' already exists in request"),
        (_batch_of(9), f"{PREFIX}inference request batch-size must be <= 8 for 'simple'"),
        (_with_parameter("triton_enable_x", bool_param=True),
         "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
        (_short_blob(), f"{PREFIX}input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"),
    ],
    ids=["raw-and-contents", "fp16-contents", "bad-shape", "wrong-datatype", "unknown-datatype", "missing-input",
         "unknown-input", "unknown-output", "duplicate-output", "duplicate-input", "batch-too-large",
         "triton-parameter", "blob-size-not-the-shapes"],
)
def test_requests_that_do_not_fit_the_model_are_invalid_argument_with_tritons_text(
    stub: Any, request_: Any, message: str
) -> None:
    assert_error(lambda: stub.ModelInfer(request_), grpc.StatusCode.INVALID_ARGUMENT, message)
    assert_serving(stub)


def test_the_request_id_is_named_in_the_message(stub: Any) -> None:
    message = _drop_input1()
    message.id = "abc"
    assert_error(lambda: stub.ModelInfer(message), grpc.StatusCode.INVALID_ARGUMENT,
                 "[request id: abc] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
                 "but missing required input(s) ['INPUT1']. Please provide all required input(s).")


def test_a_decoupled_model_through_model_infer_is_unimplemented(stub: Any) -> None:
    message = service_pb2.ModelInferRequest(model_name="decoupled")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    assert_error(lambda: stub.ModelInfer(message), grpc.StatusCode.UNIMPLEMENTED,
                 "ModelInfer RPC doesn't support models with decoupled transaction policy ('decoupled'); "
                 "use ModelStreamInfer")


def test_a_timeout_spent_in_the_queue_and_a_full_queue_are_unavailable(
    stub: Any, server: RunningServer, repo_root: Path  # noqa: F811
) -> None:
    """The gated model holds its one instance. A request with a 1 µs ``timeout``
    parameter waits in the queue and is rejected when its timeout runs out (UNAVAILABLE,
    Triton's text), never executed; of two contenders then, one finds the queue of one
    full (UNAVAILABLE, as HTTP's 503) and the other is served once the instance frees."""
    folder = repo_root / "gated"
    for stale in ("entered", "open"):
        (folder / stale).unlink(missing_ok=True)

    def gated(timeout_us: int | None = None) -> Any:
        message = service_pb2.ModelInferRequest(model_name="gated")
        message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
        message.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
        if timeout_us is not None:
            message.parameters["timeout"].int64_param = timeout_us
        return message

    def send(message: Any) -> Any:
        try:
            return stub.ModelInfer(message, timeout=60)
        except grpc.RpcError as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        holding = pool.submit(send, gated())
        wait_until(lambda: (folder / "entered").exists() or holding.done(), "the gated model to start")
        assert not holding.done(), "the gated request ended before holding the instance"
        expired = send(gated(timeout_us=1))  # answered while the instance is still held
        contenders = [pool.submit(send, gated()), pool.submit(send, gated())]
        full = next(concurrent.futures.as_completed(contenders, timeout=30)).result()
        (folder / "open").touch()
        results = [holding.result(timeout=30)] + [c.result(timeout=30) for c in contenders]
    assert (expired.code(), expired.details()) == (grpc.StatusCode.UNAVAILABLE, "Request timeout expired")
    assert (full.code(), full.details()) == (grpc.StatusCode.UNAVAILABLE, "Exceeds maximum queue size")
    assert sum(isinstance(r, service_pb2.ModelInferResponse) for r in results) == 2
    assert_serving(stub)


# -- shared memory (test_shared_memory's error cases) -------------------------------------


def test_shared_memory_errors_get_tritons_status(stub: Any) -> None:
    message = simple()
    del message.raw_input_contents[:]
    for tensor in message.inputs:
        tensor.parameters["shared_memory_region"].string_param = "nowhere"
        tensor.parameters["shared_memory_byte_size"].int64_param = 64
    assert_error(lambda: stub.ModelInfer(message), grpc.StatusCode.NOT_FOUND,
                 "Unable to find shared memory region: 'nowhere'")
    assert_error(lambda: stub.SystemSharedMemoryStatus(service_pb2.SystemSharedMemoryStatusRequest(name="nowhere")),
                 grpc.StatusCode.NOT_FOUND, "Unable to find system shared memory region: 'nowhere'")
    register = service_pb2.SystemSharedMemoryRegisterRequest(name="r", key="/nereid-no-such-key", byte_size=64)
    with pytest.raises(grpc.RpcError) as caught:
        stub.SystemSharedMemoryRegister(register)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details().startswith("Unable to open shared memory region: '/nereid-no-such-key'")
    assert_error(lambda: stub.CudaSharedMemoryStatus(service_pb2.CudaSharedMemoryStatusRequest(name="gpu")),
                 grpc.StatusCode.NOT_FOUND, "Unable to find cuda shared memory region: 'gpu'")
    stub.SystemSharedMemoryUnregister(service_pb2.SystemSharedMemoryUnregisterRequest(name="nowhere"))  # OK, as Triton
    assert_serving(stub)
