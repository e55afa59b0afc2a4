"""grpc/infer_messages.py: a ModelInferRequest decoded against a model's config (raw and
typed contents, Triton's parameters), outputs encoded into a ModelInferResponse, errors
that name the model, input, expected and got."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from nereid.errors import InvalidInputError, ModelExecutionError
from nereid.grpc.infer_messages import decode_request, encode_response
from nereid.inference import SequenceFlags
from nereid.tensors.tables import ModelTables
from tests.unit.grpc.pair_requests import A, B, raw_request, tables, typed_request  # noqa: F401 (tables: a fixture)


def decode(message: Any, tables: ModelTables) -> Any:
    return decode_request(message, tables, 3, None)


def test_raw_input_contents_decode_to_the_arrays_they_hold(tables: ModelTables) -> None:
    request = decode(raw_request(id="r1"), tables)
    assert (request.model_name, request.model_version, request.id, request.rows) == ("pair", 3, "r1", 1)
    np.testing.assert_array_equal(request.inputs["INPUT0"], A)
    np.testing.assert_array_equal(request.inputs["INPUT1"], B)
    assert request.inputs["INPUT0"].dtype == np.int32 and request.inputs["INPUT1"].dtype == np.float32
    assert request.outputs is None and request.binary_data_output


def test_typed_contents_decode_to_the_same_arrays_as_raw_ones(tables: ModelTables) -> None:
    typed, raw = decode(typed_request(), tables), decode(raw_request(), tables)
    for name in ("INPUT0", "INPUT1"):
        np.testing.assert_array_equal(typed.inputs[name], raw.inputs[name])
        assert typed.inputs[name].dtype == raw.inputs[name].dtype


def test_raw_contents_must_be_one_per_input(tables: ModelTables) -> None:
    message = raw_request()
    del message.raw_input_contents[1]
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == (
        "[request id: <id_unknown>] expected 2 raw input contents (one per input) for model 'pair', got 1"
    )


def test_typed_contents_of_the_wrong_size_name_input_expected_and_got(tables: ModelTables) -> None:
    message = typed_request()
    del message.inputs[0].contents.int_contents[-1]
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == (
        "[request id: typed] unexpected number of elements for inference input 'INPUT0' for model 'pair': "
        "expected 4, got 3"
    )


def test_raw_and_typed_contents_together_are_refused(tables: ModelTables) -> None:
    message = raw_request()
    message.inputs[0].contents.int_contents.extend([1, 2, 3, 4])
    with pytest.raises(InvalidInputError, match="contents field must not be specified when using "
                       "raw_input_contents for 'INPUT0' for model 'pair'"):
        decode(message, tables)


def test_an_unknown_datatype_names_the_input_and_the_model(tables: ModelTables) -> None:
    message = raw_request()
    message.inputs[1].datatype = "FP128"
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message.startswith("invalid datatype for input INPUT1: 'FP128' is not one of BOOL, ")
    assert caught.value.message.endswith("(model 'pair')")


def test_an_input_given_twice_is_refused(tables: ModelTables) -> None:
    message = raw_request()
    message.inputs[1].name = "INPUT0"
    with pytest.raises(InvalidInputError, match="input 'INPUT0' already exists in request"):
        decode(message, tables)


def test_an_input_without_data_says_where_data_may_come_from(tables: ModelTables) -> None:
    message = typed_request()
    message.inputs[1].ClearField("contents")
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == (
        "[request id: typed] input 'INPUT1' for model 'pair' has no data: send it in raw_input_contents, "
        "in contents, or in a shared memory region"
    )


def test_tritons_parameters_are_read_and_the_others_passed_on(tables: ModelTables) -> None:
    message = raw_request()
    message.parameters["priority"].int64_param = 2
    message.parameters["timeout"].int64_param = 5000
    message.parameters["sequence_id"].int64_param = 7
    message.parameters["mine"].string_param = "x"
    request = decode(message, tables)
    assert (request.priority, request.timeout_us, request.parameters) == (2, 5000, {"mine": "x"})
    assert request.sequence == SequenceFlags(7)


def test_sequence_parameters_as_tritonclient_sends_them(tables: ModelTables) -> None:
    message = raw_request()
    message.parameters["sequence_id"].string_param = "session-a"
    message.parameters["sequence_start"].bool_param = True
    message.parameters["sequence_end"].bool_param = False
    assert decode(message, tables).sequence == SequenceFlags("session-a", True, False)


def test_sequence_parameters_of_the_wrong_type_are_refused_with_tritons_message(tables: ModelTables) -> None:
    message = raw_request()
    message.parameters["sequence_id"].bool_param = True
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
    message = raw_request()
    message.parameters["sequence_end"].int64_param = 1
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == "invalid value type for 'sequence_end' parameter, expected bool_param."


def test_parameters_reserved_for_triton_are_refused(tables: ModelTables) -> None:
    message = raw_request()
    message.parameters["triton_anything"].bool_param = True
    with pytest.raises(InvalidInputError, match="parameter keys starting with 'triton_' are reserved"):
        decode(message, tables)


def test_an_unknown_requested_output_is_named(tables: ModelTables) -> None:
    message = raw_request()
    message.outputs.add(name="OUTPUT9")
    with pytest.raises(InvalidInputError) as caught:
        decode(message, tables)
    assert caught.value.message == "unexpected inference output 'OUTPUT9' for model 'pair'"


def test_outputs_are_encoded_in_the_models_order_as_raw_contents(tables: ModelTables) -> None:
    request = decode(raw_request(id="r2"), tables)
    outputs = {"OUTPUT1": B * 2, "OUTPUT0": A + 1}
    response = encode_response(outputs, request, tables, 3, None, None)
    assert (response.model_name, response.model_version, response.id) == ("pair", "3", "r2")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT1", "FP32", [1, 2]), ("OUTPUT0", "INT32", [1, 4]),
    ]
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), (B * 2).ravel())
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], np.int32), (A + 1).ravel())


def test_only_the_requested_outputs_are_encoded(tables: ModelTables) -> None:
    message = raw_request()
    message.outputs.add(name="OUTPUT0")
    request = decode(message, tables)
    response = encode_response({"OUTPUT0": A, "OUTPUT1": B}, request, tables, 3, None, None)
    assert [o.name for o in response.outputs] == ["OUTPUT0"] and len(response.raw_output_contents) == 1


def test_a_requested_output_the_model_did_not_make_is_a_model_error(tables: ModelTables) -> None:
    message = raw_request()
    message.outputs.add(name="OUTPUT1")
    request = decode(message, tables)
    with pytest.raises(ModelExecutionError) as caught:
        encode_response({"OUTPUT0": A}, request, tables, 3, None, None)
    assert caught.value.message == "model 'pair' did not produce the requested output(s) 'OUTPUT1'"
