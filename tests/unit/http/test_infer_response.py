"""``infer_response``: InferResult -> Triton's HTTP response: output selection, order and
encoding, ids and parameters, classification; decoded with tritonclient's own InferResult.
"""

from __future__ import annotations

import json

import numpy as np
from nereid.errors import InvalidInputError, ModelExecutionError, ModelNotFoundError
from nereid.http import infer_response
from nereid.inference import InferResult, RequestedOutput
from tritonclient.http import InferRequestedOutput  # type: ignore[import-untyped]

from tests.unit.http.infer_bodies import (
    IDENTITY,
    client_body,
    client_input,
    client_result,
    config,
    encode,
    fp32_input,
    parse,
    parse_json,
    raises,
)


# -- outputs, ids, parameters ------------------------------------------------------------

TWO_OUTPUTS = config(outputs=(("A", "INT32", (1,)), ("B", "INT32", (1,)), ("C", "INT32", (1,))))
PRODUCED = {
    "C": np.array([[3]], dtype=np.int32),
    "A": np.array([[1]], dtype=np.int32),
    "B": np.array([[2]], dtype=np.int32),
}


def test_listed_outputs_are_returned_in_the_models_order_with_their_own_encoding() -> None:
    body, header = client_body(
        [client_input("INPUT0", np.zeros((1, 16), np.float32), "FP32")],
        [InferRequestedOutput("B", binary_data=False), InferRequestedOutput("C", binary_data=True)],
    )
    request = parse(body, header, TWO_OUTPUTS)
    response, headers = encode(PRODUCED, request, TWO_OUTPUTS)

    doc = json.loads(response[: int(headers[b"inference-header-content-length"])])
    assert [out["name"] for out in doc["outputs"]] == ["C", "B"]
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert doc["outputs"][1]["data"] == [2]
    result = client_result(response, headers)
    assert result.as_numpy("C").tolist() == [[3]] and result.as_numpy("B").tolist() == [[2]]
    assert result.as_numpy("A") is None


def test_unlisted_outputs_follow_binary_data_output() -> None:
    body, header = client_body([client_input("INPUT0", np.zeros((1, 16), np.float32), "FP32")])
    request = parse(body, header, TWO_OUTPUTS)
    assert request.outputs is None and request.binary_data_output is True

    response, headers = encode(PRODUCED, request, TWO_OUTPUTS)
    assert headers[b"content-type"] == b"application/octet-stream"
    assert client_result(response, headers).as_numpy("A").tolist() == [[1]]

    as_json = parse_json({"inputs": [fp32_input(binary=False)]}, TWO_OUTPUTS)
    response, headers = encode(PRODUCED, as_json, TWO_OUTPUTS)
    assert headers == {b"content-type": b"application/json"}
    assert b'"name":"A","datatype":"INT32","shape":[1,1],"data":[1]' in response


def test_request_id_is_echoed_and_an_empty_id_is_omitted() -> None:
    with_id = parse_json({"id": "abc", "inputs": [fp32_input(binary=False)]})
    assert encode({"OUTPUT0": np.zeros((1, 16), np.float32)}, with_id)[0].startswith(
        b'{"id":"abc","model_name"'
    )
    empty = parse_json({"id": "", "inputs": [fp32_input(binary=False)]})
    assert encode({"OUTPUT0": np.zeros((1, 16), np.float32)}, empty)[0].startswith(b'{"model_name":"m"')


def test_response_parameters_come_between_version_and_outputs() -> None:
    request = parse_json({"inputs": [fp32_input(binary=False)]})
    result = InferResult("m", 3, {"OUTPUT0": np.zeros((1, 16), np.float32)}, parameters={"k": "v"})
    body, _ = infer_response.encode_infer_response(result, request, IDENTITY)
    assert body.startswith(b'{"model_name":"m","model_version":"3","parameters":{"k":"v"},"outputs":[')


def test_zero_size_binary_outputs_are_listed_without_a_blob_or_header() -> None:
    cfg = config(outputs=(("OUTPUT0", "FP32", (-1,)),))
    request = parse_json(
        {"inputs": [fp32_input(binary=False)], "parameters": {"binary_data_output": True}}, cfg
    )
    body, headers = encode({"OUTPUT0": np.zeros((1, 0), np.float32)}, request, cfg)
    assert headers == {b"content-type": b"application/json"}
    assert body.endswith(b'"shape":[1,0],"parameters":{"binary_data_size":0}}]}')
    assert client_result(body, headers).as_numpy("OUTPUT0").shape == (1, 0)


def test_request_parameters_are_interpreted_or_passed_through() -> None:
    body, header = client_body(
        [client_input("INPUT0", np.zeros((1, 16), np.float32), "FP32")],
        priority=2,
        timeout=1500,
        parameters={"s": "x", "i": 7, "b": True, "f": 0.5},
        sequence_id=5,
    )
    request = parse(body, header)
    assert request.priority == 2
    assert request.timeout_us == 1500
    assert request.binary_data_output is True
    assert dict(request.parameters) == {"s": "x", "i": 7, "b": True, "f": 0.5}


def test_the_headers_parameter_is_reserved_and_never_forwarded() -> None:
    request = parse_json({"inputs": [fp32_input(binary=False)], "parameters": {"headers": "x"}})
    assert dict(request.parameters) == {}


def test_output_that_the_model_did_not_produce_is_a_500() -> None:
    request = parse_json(
        {"inputs": [fp32_input(binary=False)], "outputs": [{"name": "A"}, {"name": "B"}]}, TWO_OUTPUTS
    )
    with raises(ModelExecutionError, "model 'm' did not produce the requested output(s) 'B'"):
        encode({"A": np.zeros((1, 1), np.int32)}, request, TWO_OUTPUTS)


def test_outputs_are_converted_to_the_config_datatype() -> None:
    request = parse_json({"inputs": [fp32_input(binary=False)], "parameters": {"binary_data_output": True}})
    body, headers = encode({"OUTPUT0": np.ones((1, 16), dtype=np.float64)}, request)
    assert client_result(body, headers).as_numpy("OUTPUT0").dtype == np.float32

# -- classification ----------------------------------------------------------------------


def test_classification_returns_top_k_value_index_strings_per_batch_row() -> None:
    cfg = config(outputs=(("OUTPUT0", "FP32", (4,)),))
    body, header = client_body(
        [client_input("INPUT0", np.zeros((2, 16), np.float32), "FP32")],
        [InferRequestedOutput("OUTPUT0", binary_data=False, class_count=2)],
    )
    request = parse(body, header, cfg)
    scores = np.array([[0.5, 3.3, 1.0, 3.3], [4.0, -1.0, 0.0, 2.0]], dtype=np.float32)

    response, headers = encode({"OUTPUT0": scores}, request, cfg)
    assert (
        b'"datatype":"BYTES","shape":[2,2],"data":["3.300000:1","3.300000:3","4.000000:0","2.000000:3"]'
        in response
    )
    assert client_result(response, headers).as_numpy("OUTPUT0").tolist() == [
        ["3.300000:1", "3.300000:3"],
        ["4.000000:0", "2.000000:3"],
    ]


def test_classification_with_labels_integers_and_binary_output() -> None:
    cfg = config(
        inputs=(("INPUT0", "FP32", (16,)),),
        outputs=(("OUTPUT0", "INT32", (3,)),),
        max_batch_size=0,
        label_outputs=("OUTPUT0",),
    )
    body, header = client_body(
        [client_input("INPUT0", np.zeros((16,), np.float32), "FP32")],
        [InferRequestedOutput("OUTPUT0", binary_data=True, class_count=5)],
    )
    request = parse(body, header, cfg)
    assert request.outputs == (RequestedOutput("OUTPUT0", binary_data=True, classification=5),)

    response, headers = encode(
        {"OUTPUT0": np.array([7, 9, 8], dtype=np.int32)}, request, cfg, labels={"OUTPUT0": ["cat", "dog"]}
    )
    assert b'"datatype":"BYTES","shape":[3],"parameters":{"binary_data_size":' in response
    assert client_result(response, headers).as_numpy("OUTPUT0").tolist() == [b"9:1:dog", b"8:2", b"7:0:cat"]


def test_classification_of_an_unsupported_type_is_a_400() -> None:
    cfg = config(outputs=(("OUTPUT0", "FP16", (3,)),))
    request = parse_json(
        {
            "inputs": [fp32_input(binary=False)],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}],
        },
        cfg,
    )
    with raises(InvalidInputError, "class result not available for output due to unsupported type 'FP16'"):
        encode({"OUTPUT0": np.zeros((1, 3), np.float16)}, request, cfg)

def test_unknown_shared_memory_region_for_an_output_is_a_404() -> None:
    doc = {
        "inputs": [fp32_input(binary=False)],
        "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "o"}}],
    }
    with raises(ModelNotFoundError, "Unable to find shared memory region: 'o'"):
        parse_json(doc)


def test_non_contiguous_outputs_are_sent_in_row_major_order() -> None:
    cfg = config(outputs=(("OUTPUT0", "INT32", (2,)),))
    request = parse_json(
        {"inputs": [fp32_input(binary=False)], "parameters": {"binary_data_output": True}}, cfg
    )
    values = np.arange(4, dtype=np.int32).reshape(2, 2).T[:1]  # [[0, 2]], not contiguous
    body, headers = encode({"OUTPUT0": values}, request, cfg)
    assert client_result(body, headers).as_numpy("OUTPUT0").tolist() == [[0, 2]]


def test_outputs_missing_from_the_config_keep_their_own_datatype() -> None:
    request = parse_json({"inputs": [fp32_input(binary=False)]})
    body, _ = encode({"EXTRA": np.array([1, 2], dtype=np.uint16)}, request)
    assert body.endswith(b'"outputs":[{"name":"EXTRA","datatype":"UINT16","shape":[2],"data":[1,2]}]}')


def test_outputs_without_a_protocol_datatype_are_a_500() -> None:
    request = parse_json({"inputs": [fp32_input(binary=False)]})
    with raises(
        ModelExecutionError,
        "output 'EXTRA' of model 'm' has numpy dtype complex64, which has no protocol datatype",
    ):
        encode({"EXTRA": np.zeros(2, dtype=np.complex64)}, request)
