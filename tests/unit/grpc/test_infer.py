"""grpc/infer.py: the gRPC status of each NereidError, the model version a request names,
and the memo: a repeated request made from its plan and a repeated answer from its
remembered bytes, equal to what the full decoder and encoder make of them; shared memory
leased only by a request that names a region."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from nereid.config import load_model_config
from nereid.errors import (
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelExecutionError,
    ModelNotFoundError,
    NereidError,
    RequestCancelledError,
    UnavailableError,
    UnsupportedError,
)
from nereid.grpc.infer import InferMemo, ModelInfer, status_of
from nereid.grpc.infer_messages import decode_request, encode_response
from nereid.tensors.shared_memory import SharedMemoryManager
from nereid.tensors.tables import ModelTables
from tests.unit.grpc.pair_requests import A, B, CONFIG, raw_request, tables, typed_request  # noqa: F401 (tables: a fixture)


@pytest.mark.parametrize(("error", "code"), [
    (ModelNotFoundError("x"), grpc.StatusCode.NOT_FOUND),
    (InvalidInputError("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedRequestError("x"), grpc.StatusCode.INVALID_ARGUMENT),
    (UnavailableError("x"), grpc.StatusCode.UNAVAILABLE),
    (UnsupportedError("x"), grpc.StatusCode.UNIMPLEMENTED),
    (RequestCancelledError("x"), grpc.StatusCode.CANCELLED),
    (ModelExecutionError("x"), grpc.StatusCode.INTERNAL),
    (InternalError("x"), grpc.StatusCode.INTERNAL),
    (NereidError("x"), grpc.StatusCode.INTERNAL),
], ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.name)
def test_each_error_has_tritons_grpc_status(error: NereidError, code: grpc.StatusCode) -> None:
    assert status_of(error) is code


class _Manager:
    """The manager as ModelInfer reads it: ``latest`` (READY latest versions by name, read
    without a call) and ``get`` (any version, or Triton's error)."""

    def __init__(self, latest: dict[str, Any] | None = None) -> None:
        self.asked: list[tuple[str, int | None]] = []
        self.latest = latest or {}

    def get(self, name: str, version: int | None) -> Any:
        self.asked.append((name, version))
        return name


@pytest.mark.parametrize(("text", "version"), [("", None), ("2", 2)])
def test_the_version_a_request_names_is_the_one_served(text: str, version: int | None) -> None:
    manager = _Manager()
    ModelInfer(manager, None).serving(service_pb2.ModelInferRequest(model_name="pair", model_version=text))  # type: ignore[arg-type]
    assert manager.asked == [("pair", version)]


def test_a_request_naming_no_version_reads_the_latest_without_asking() -> None:
    manager = _Manager(latest={"pair": "pair v3"})
    infer = ModelInfer(manager, None)  # type: ignore[arg-type]
    assert infer.serving(service_pb2.ModelInferRequest(model_name="pair")) == "pair v3"
    assert manager.asked == []
    assert infer.serving(service_pb2.ModelInferRequest(model_name="pair", model_version="2")) == "pair"
    assert manager.asked == [("pair", 2)]


def test_a_version_that_is_not_a_number_is_invalid() -> None:
    with pytest.raises(InvalidInputError, match="failed to get model version from specified version string 'two'"):
        ModelInfer(_Manager(), None).serving(  # type: ignore[arg-type]
            service_pb2.ModelInferRequest(model_name="pair", model_version="two")
        )


# -- the memo --------------------------------------------------------------------------------


def values_request(first: np.ndarray, second: np.ndarray, **fields: Any) -> Any:
    """``raw_request`` with the given input values."""
    message = service_pb2.ModelInferRequest(model_name="pair", **fields)
    message.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    message.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.extend([first.tobytes(), second.tobytes()])
    return message


def _same_request(left: Any, right: Any) -> None:
    for field in ("model_name", "rows", "id", "model_version", "outputs", "parameters", "priority", "timeout_us",
                  "binary_data_output", "sequence"):
        assert getattr(left, field) == getattr(right, field), field
    assert list(left.inputs) == list(right.inputs)
    for name in left.inputs:
        assert left.inputs[name].dtype == right.inputs[name].dtype
        np.testing.assert_array_equal(left.inputs[name], right.inputs[name])


def test_a_repeated_request_is_made_from_its_plan_as_the_full_decoder_makes_it(tables: ModelTables) -> None:
    memo = InferMemo()
    first = values_request(A, B, id="same", parameters={"custom": service_pb2.InferParameter(int64_param=7)})
    first.outputs.add(name="OUTPUT1")
    key = memo.request_key(first, first.SerializeToString())
    assert key is not None and memo.request(key, first, 3) is None
    memo.learn_request(key, first, decode_request(first, tables, 3, None))
    second = values_request(A * 5, B - 1, id="same", parameters={"custom": service_pb2.InferParameter(int64_param=7)})
    second.outputs.add(name="OUTPUT1")
    repeat = memo.request(memo.request_key(second, second.SerializeToString()), second, 3)  # type: ignore[arg-type]
    assert repeat is not None and memo.requests_planned == 1
    _same_request(repeat, decode_request(second, tables, 3, None))


def test_requests_that_differ_beyond_their_raw_contents_and_id_are_not_repeats(tables: ModelTables) -> None:
    memo = InferMemo()
    first = values_request(A, B, id="a")
    key = memo.request_key(first, first.SerializeToString())
    assert key is not None
    memo.learn_request(key, first, decode_request(first, tables, 3, None))
    two_rows = values_request(np.vstack([A, A]), np.vstack([B, B]), id="a")
    two_rows.inputs[0].shape[:] = [2, 4]
    two_rows.inputs[1].shape[:] = [2, 2]
    other_output = values_request(A, B, id="a")
    other_output.outputs.add(name="OUTPUT0")
    for message in (two_rows, other_output):
        assert memo.request(memo.request_key(message, message.SerializeToString()), message, 3) is None  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(st.text(max_size=12), min_size=2, max_size=5),
    version=st.sampled_from(["", "3"]),
    values=st.integers(-1000, 1000),
)
def test_requests_and_answers_that_differ_only_in_their_id_repeat_with_their_own_id(
    tables: ModelTables, ids: list[str], version: str, values: int,
) -> None:
    """Property test: requests that differ only in their id (any text, empty included,
    with or without a version named) take the memo's plan and its remembered answer after
    the first, and both are exactly the full decoder's request and the full encoder's bytes."""
    memo = InferMemo()
    for index, id_ in enumerate(ids):
        message = values_request(A + values + index, B * index, id=id_, model_version=version)
        data = message.SerializeToString()
        key = memo.request_key(message, data)
        assert key is not None
        full = decode_request(message, tables, 3, None)
        planned = memo.request(key, message, 3)
        if planned is None:
            memo.learn_request(key, message, full)
        else:
            _same_request(planned, full)
        outputs = {"OUTPUT0": A * index + values, "OUTPUT1": B + index}
        encoded = encode_response(outputs, full, tables, 3, None, None)
        remembered = memo.answer(full, outputs, 3)
        if remembered is None:
            memo.learn_answer(full, outputs, 3, encoded, encoded.SerializeToString(), tables)
        else:
            assert remembered == encoded.SerializeToString()
    assert memo.requests_planned == memo.answers_remembered == len(ids) - 1


def test_an_id_that_does_not_lead_the_request_stays_in_its_key(tables: ModelTables) -> None:
    """protobuf reads fields in any order: an id written after the inputs is kept in the
    key (so a request with another id there is no repeat) and still answered as its own."""
    memo = InferMemo()

    def late_id(id_: str) -> tuple[Any, bytes]:
        message = values_request(A, B)
        raw = service_pb2.ModelInferRequest(raw_input_contents=message.raw_input_contents)
        message.ClearField("raw_input_contents")
        # concatenated messages merge: the name and inputs, then the id, then the raw contents
        data = b"".join(part.SerializeToString() for part in (message, service_pb2.ModelInferRequest(id=id_), raw))
        parsed = service_pb2.ModelInferRequest.FromString(data)
        assert parsed.id == id_ and len(parsed.raw_input_contents) == 2
        return parsed, data

    first, data = late_id("one")
    key = memo.request_key(first, data)
    assert key is not None and b"one" in key[0]
    memo.learn_request(key, first, decode_request(first, tables, 3, None))
    second, data = late_id("two")
    assert memo.request(memo.request_key(second, data), second, 3) is None  # type: ignore[arg-type]
    again, data = late_id("one")
    repeat = memo.request(memo.request_key(again, data), again, 3)  # type: ignore[arg-type]
    assert repeat is not None and repeat.id == "one"


def test_typed_contents_and_shared_memory_are_never_planned(tables: ModelTables) -> None:
    memo = InferMemo()
    typed = typed_request()
    assert memo.request_key(typed, typed.SerializeToString()) is None  # no raw contents
    with_region = values_request(A, B)
    with_region.outputs.add(name="OUTPUT0").parameters["shared_memory_region"].string_param = "region"
    key = memo.request_key(with_region, with_region.SerializeToString())
    assert key is not None
    memo.learn_request(key, with_region, decode_request(with_region, tables, 3, lambda *_: memoryview(bytes(16))))
    assert memo.request(key, with_region, 3) is None


def test_raw_contents_that_do_not_come_last_give_no_key() -> None:
    # protobuf merges the fields of concatenated messages: the same request, raw contents first
    message = values_request(A, B, id="r")
    raw_only = service_pb2.ModelInferRequest(raw_input_contents=message.raw_input_contents)
    rest = service_pb2.ModelInferRequest()
    rest.CopyFrom(message)
    rest.ClearField("raw_input_contents")
    data = raw_only.SerializeToString() + rest.SerializeToString()
    assert service_pb2.ModelInferRequest.FromString(data) == message
    assert InferMemo.request_key(message, data) is None


def test_a_repeated_answer_is_the_full_encoders_bytes(tables: ModelTables) -> None:
    memo = InferMemo()
    request = decode_request(values_request(A, B, id="r"), tables, 3, None)
    assert memo.answer(request, {"OUTPUT0": A, "OUTPUT1": B}, 3) is None
    response = encode_response({"OUTPUT0": A, "OUTPUT1": B}, request, tables, 3, None, None)
    memo.learn_answer(request, {"OUTPUT0": A, "OUTPUT1": B}, 3, response, response.SerializeToString(), tables)
    outputs = {"OUTPUT0": A * 3, "OUTPUT1": B + 2}
    assert memo.answer(request, outputs, 3) == encode_response(outputs, request, tables, 3, None, None).SerializeToString()
    assert memo.answers_remembered == 1
    assert memo.answer(request, {"OUTPUT0": A, "OUTPUT1": B.astype(np.float64)}, 3) is None  # another dtype
    assert memo.answer(request, {"OUTPUT0": np.vstack([A, A]), "OUTPUT1": B}, 3) is None  # another shape


def test_answers_the_encoder_converts_or_classifies_are_not_remembered(tables: ModelTables) -> None:
    memo = InferMemo()
    request = decode_request(values_request(A, B), tables, 3, None)
    converted = {"OUTPUT0": A.astype(np.int64), "OUTPUT1": B}  # INT32 in the config
    response = encode_response(converted, request, tables, 3, None, None)
    memo.learn_answer(request, converted, 3, response, response.SerializeToString(), tables)
    assert memo.answer(request, converted, 3) is None
    message = values_request(A, B)
    message.outputs.add(name="OUTPUT1").parameters["classification"].int64_param = 1
    classified = decode_request(message, tables, 3, None)
    response = encode_response({"OUTPUT0": A, "OUTPUT1": B}, classified, tables, 3, None, None)
    memo.learn_answer(classified, {"OUTPUT0": A, "OUTPUT1": B}, 3, response, response.SerializeToString(), tables)
    assert memo.answer(classified, {"OUTPUT0": A, "OUTPUT1": B}, 3) is None


class _Serving:
    """A served version as ModelInfer uses it; ``submit`` answers at once (add one, times two)."""

    def __init__(self, config: Any) -> None:
        self.config, self.version, self.labels, self.name = config, 3, None, "pair"

    def submit(self, request: Any, received_ns: int, answer: Any) -> None:
        answer({"OUTPUT0": request.inputs["INPUT0"] + 1, "OUTPUT1": request.inputs["INPUT1"] * 2}, None)


class _CountingRegions(SharedMemoryManager):
    def __init__(self) -> None:
        super().__init__()
        self.leases = 0

    def lease(self) -> Any:
        self.leases += 1
        return super().lease()


def test_start_answers_repeats_with_the_full_paths_bytes_and_leases_no_shared_memory(
    tables: ModelTables, tmp_path: Any,
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    serving, regions = _Serving(load_model_config(path, "pair")), _CountingRegions()
    infer = ModelInfer(_Manager(latest={"pair": serving}), regions)  # type: ignore[arg-type]
    for step in range(3):
        message = values_request(A + step, B * step, id="r")
        answers: list[Any] = []
        infer.start(message, 0, lambda response, error: answers.append((response, error)), message.SerializeToString())
        outputs = {"OUTPUT0": A + step + 1, "OUTPUT1": B * step * 2}
        full = encode_response(outputs, decode_request(message, tables, 3, None), tables, 3, None, None)
        assert answers == [(full.SerializeToString(), None)]
    memo = infer.tables(serving).memo  # type: ignore[arg-type]
    assert (memo.requests_planned, memo.answers_remembered) == (2, 2)
    assert regions.leases == 0
    named = values_request(A, B)
    named.outputs.add(name="OUTPUT0").parameters["shared_memory_region"].string_param = "nowhere"
    with pytest.raises(ModelNotFoundError, match="Unable to find shared memory region: 'nowhere'"):
        infer.start(named, 0, lambda response, error: None, named.SerializeToString())
    assert regions.leases == 1
