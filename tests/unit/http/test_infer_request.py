"""``infer_request``: an infer body (KServe v2 JSON, Triton's binary tensor extension) ->
InferRequest (raw binary bodies: test_raw_request.py), and every malformed or hostile body refused with Triton's own
error class and message (only ever a NereidError).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from nereid.config.schema import ModelConfig
from nereid.datatypes import DATATYPES
from nereid.errors import InvalidInputError, MalformedRequestError, NereidError
from nereid.http import infer_request
from nereid.inference import SequenceFlags
from tritonclient.http import InferRequestedOutput  # type: ignore[import-untyped]

from tests.unit.http.infer_bodies import (
    IDENTITY,
    M_BATCH,
    M_BYTES,
    M_INT,
    M_OPTIONAL,
    M_TWO,
    NOTE,
    WILD_CONFIGS,
    binary,
    client_body,
    client_input,
    config,
    dtype,
    fp32_input,
    parse,
    parse_json,
    raises,
    sample,
    tensor,
    wild_requests,
)


def j(**fields: Any) -> dict[str, Any]:
    return fields


F16 = [0.0] * 16


def nested(depth: int) -> Any:
    """[1] wrapped in ``depth`` more lists; as an element of ``data`` (depth 0), its 1 sits at
    depth ``depth + 2``, and Triton refuses any value at depth 100."""
    value: Any = [1]
    for _ in range(depth):
        value = [value]
    return value


EMPTY_INPUTS = orjson.dumps({"inputs": []})
# One row per situation: (id, body spec, header, config, class, exact message). A body spec
# is raw bytes, a JSON document, or (document, blobs) sent with its header length.
# fmt: off
ERROR_CASES: list[Any] = [
    # -- JSON structure (500, Triton's INTERNAL quirk)
    # An empty body without the header is a raw request (H = total = 0), as in Triton.
    ("empty-body", b"", None, IDENTITY, InvalidInputError, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. Expected 64, got 0"),
    ("whitespace-body", b" ", None, IDENTITY, MalformedRequestError, "failed to parse the request JSON buffer: The document is empty. at 0"),
    (
        "garbage",
        b"{oops",
        None,
        IDENTITY,
        MalformedRequestError,
        "failed to parse the request JSON buffer: unexpected character, expected a string key at 1",
    ),
    (
        "binary-without-header",
        orjson.dumps(j(inputs=[tensor(**binary(64))])) + bytes(64),
        None,
        IDENTITY,
        MalformedRequestError,
        "failed to parse the request JSON buffer: The document root must not be followed by other values. at "
        + str(len(orjson.dumps(j(inputs=[tensor(**binary(64))])))),
    ),
    ("root-array", b"[1]", None, IDENTITY, MalformedRequestError, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ("no-inputs", j(), None, IDENTITY, MalformedRequestError, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ("inputs-object", j(inputs={}), None, IDENTITY, MalformedRequestError, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ("id-number", j(id=3, inputs=[]), None, IDENTITY, MalformedRequestError, "Unable to parse 'id': attempt to access JSON non-string as string"),
    ("no-name", j(inputs=[{"datatype": "FP32", "shape": [1], "data": [1]}]), None, IDENTITY, MalformedRequestError, "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("name-number", j(inputs=[tensor(name=1, data=F16)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'name': attempt to access JSON non-string as string"),
    ("no-datatype", j(inputs=[{"name": "X", "shape": [1], "data": [1]}]), None, IDENTITY, MalformedRequestError, "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'"),
    ("no-shape", j(inputs=[{"name": "X", "datatype": "FP32", "data": [1]}]), None, IDENTITY, MalformedRequestError, "Unable to parse 'shape': attempt to access non-existing object member 'shape'"),
    ("shape-string", j(inputs=[tensor(shape="1,16", data=F16)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ("negative-dim", j(inputs=[tensor(shape=[-5, 16], data=F16)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("float-dim", j(inputs=[tensor(shape=[1.0, 16], data=F16)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("binary-size-negative", j(inputs=[tensor(parameters={"binary_data_size": -1})]), None, IDENTITY, MalformedRequestError, "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("data-object", j(inputs=[tensor(data={})]), None, IDENTITY, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-array as array"),
    ("params-array", j(inputs=[], parameters=[]), None, IDENTITY, MalformedRequestError, "failed to get request params.: attempt to get members for non-object"),
    ("priority-negative", j(inputs=[], parameters={"priority": -1}), None, IDENTITY, MalformedRequestError, "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("timeout-string", j(inputs=[], parameters={"timeout": "1"}), None, IDENTITY, MalformedRequestError, "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("binary-output-flag", j(inputs=[], parameters={"binary_data_output": 1}), None, IDENTITY, MalformedRequestError, "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean"),
    ("sequence-id-float", j(inputs=[], parameters={"sequence_id": 1.5}), None, IDENTITY, MalformedRequestError, "Unable to parse 'sequence_id': attempt to access JSON non-string as string"),
    ("sequence-start", j(inputs=[], parameters={"sequence_start": "yes"}), None, IDENTITY, MalformedRequestError, "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"),
    ("outputs-object", j(inputs=[tensor(data=F16)], outputs={}), None, IDENTITY, MalformedRequestError, "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ("output-no-name", j(inputs=[tensor(data=F16)], outputs=[{}]), None, IDENTITY, MalformedRequestError, "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ("classification-float", j(inputs=[tensor(data=F16)], outputs=[{"name": "OUTPUT0", "parameters": {"classification": 1.5}}]), None, IDENTITY, MalformedRequestError, "Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("binary-data-string", j(inputs=[tensor(data=F16)], outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]), None, IDENTITY, MalformedRequestError, "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean"),
    # -- JSON data (500 type/count errors, 400 depth)
    ("data-too-many", j(inputs=[tensor(data=[0.0] * 17)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ("data-too-few", j(inputs=[tensor(data=[0.0] * 15)]), None, IDENTITY, MalformedRequestError, "Failed to parse 'data' field: shape does not match true shape"),
    ("data-string-for-float", j(inputs=[tensor(data=["a"] * 16)]), None, IDENTITY, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-number as double"),
    ("data-float-for-int", j(inputs=[tensor("I", (2,), "INT32", data=[1, 1.0])]), None, M_INT, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("data-bool-for-int", j(inputs=[tensor("I", (2,), "INT32", data=[1, True])]), None, M_INT, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("data-int-for-bool", j(inputs=[tensor("I", (2,), "BOOL", data=[1, 0])]), None, M_INT, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ("data-negative-uint", j(inputs=[tensor("I", (2,), "UINT8", data=[1, -1])]), None, M_INT, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("data-int-beyond-int64", j(inputs=[tensor("I", (2,), "INT64", data=[1, 2**63])]), None, M_INT, MalformedRequestError, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ("data-too-deep", j(inputs=[tensor("I", (2,), "INT32", data=[nested(98), 2])]), None, M_INT, InvalidInputError, "Unable to parse 'data': JSON nesting depth exceeds maximum allowed limit (100)"),
    ("bytes-data-too-deep", j(inputs=[tensor("S", (2,), "BYTES", data=[nested(98), "b"])]), None, M_BYTES, InvalidInputError, "JSON nesting depth exceeds maximum allowed limit (100)"),
    ("bytes-data-number", j(inputs=[tensor("S", (2,), "BYTES", data=["a", 1])]), None, M_BYTES, MalformedRequestError, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    # -- content selection (400)
    ("no-content", j(inputs=[tensor()]), None, IDENTITY, InvalidInputError, "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set"),
    ("data-and-binary", j(inputs=[tensor(data=F16, **binary(64))]), None, IDENTITY, InvalidInputError, "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'"),
    ("input-not-object", j(inputs=[7]), None, IDENTITY, InvalidInputError, "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set"),
    ("shm-and-classification", j(inputs=[tensor(data=F16)], outputs=[{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "classification": 1}}]), None, IDENTITY, InvalidInputError, "Output can't set both 'shared_memory_region' and 'classification'"),
    ("shm-and-binary", j(inputs=[tensor(data=F16)], outputs=[{"name": "OUTPUT0", "parameters": {"shared_memory_region": "r", "binary_data": True}}]), None, IDENTITY, InvalidInputError, "Output can't set both 'shared_memory_region' and 'binary_data'"),
    # -- parameters (400)
    ("triton-prefix", j(inputs=[], parameters={"triton_x": 1}), None, IDENTITY, InvalidInputError, "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
    ("param-object", j(inputs=[], parameters={"x": {}}), None, IDENTITY, InvalidInputError, "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ("param-null", j(inputs=[], parameters={"x": None}), None, IDENTITY, InvalidInputError, "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'."),
    # -- header length (400)
    ("header-not-int", j(inputs=[]), "abc", IDENTITY, InvalidInputError, "Unable to parse Inference-Header-Content-Length, got: abc"),
    ("header-out-of-int32", j(inputs=[]), "99999999999", IDENTITY, InvalidInputError, "Unable to parse Inference-Header-Content-Length, value is out of range [ -2147483648, 2147483647 ], got: 99999999999"),
    ("header-negative", EMPTY_INPUTS, "-1", IDENTITY, InvalidInputError, f"inference header size should be in range (0, {len(EMPTY_INPUTS)}), got: -1"),
    ("header-beyond-body", EMPTY_INPUTS, str(len(EMPTY_INPUTS) + 1), IDENTITY, InvalidInputError, f"inference header size should be in range (0, {len(EMPTY_INPUTS)}), got: {len(EMPTY_INPUTS) + 1}"),
    ("json-too-large", j(inputs=[tensor(data=F16)]), None, IDENTITY, InvalidInputError, None),
    # -- blobs (400)
    ("blob-short", (j(inputs=[tensor(**binary(64))]), bytes(60)), "", IDENTITY, InvalidInputError, "unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'm'"),
    ("blob-extra", (j(inputs=[tensor(**binary(64))]), bytes(65)), "", IDENTITY, InvalidInputError, "unexpected additional input data for model 'm'"),
    ("blob-size-mismatch", (j(inputs=[tensor(**binary(60))]), bytes(60)), "", IDENTITY, InvalidInputError, "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. Expected 64, got 60"),
    # -- names, types, shapes (400)
    ("unknown-input", j(id="r1", inputs=[tensor("Z", data=F16)]), None, IDENTITY, InvalidInputError, "unexpected inference input 'Z' for model 'm'"),
    ("duplicate-input", j(id="r1", inputs=[tensor(data=F16), tensor(data=F16)]), None, IDENTITY, InvalidInputError, "[request id: r1] input 'INPUT0' already exists in request"),
    ("duplicate-output", j(inputs=[tensor(data=F16)], outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), None, IDENTITY, InvalidInputError, "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"),
    ("unknown-output", j(inputs=[tensor(data=F16)], outputs=[{"name": "Q"}]), None, IDENTITY, InvalidInputError, "unexpected inference output 'Q' for model 'm'"),
    ("unknown-datatype", j(inputs=[tensor(datatype="FP8", data=F16)]), None, IDENTITY, InvalidInputError, "invalid datatype for input INPUT0: 'FP8' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES (model 'm')"),
    ("wrong-datatype", j(id="7", inputs=[tensor(datatype="INT32", data=[0] * 16)]), None, IDENTITY, InvalidInputError, "[request id: 7] inference input 'INPUT0' data-type is 'INT32', but model 'm' expects 'FP32'"),
    ("missing-input", j(inputs=[tensor("A", (2,), data=[0, 0])]), None, M_TWO, InvalidInputError, "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['A'], but missing required input(s) ['B']. Please provide all required input(s)."),
    ("too-many-inputs", j(inputs=[tensor("B", (2,), data=[0, 0]), tensor("A", (2,), data=[0, 0]), tensor("C", (2,), data=[0, 0])]), None, M_TWO, InvalidInputError, "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'm'. Got input(s) ['A','B','C'], but missing required input(s) ]. Please provide all required input(s)."),
    ("missing-with-optional", j(inputs=[tensor("B", (2,), data=[0, 0])]), None, M_OPTIONAL, InvalidInputError, "[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 1 inputs for model 'm'. Got input(s) ['B'], but missing required input(s) ['A']. Please provide all required input(s)."),
    ("shape-no-batch-dim", j(inputs=[tensor("X", (2, 16), data=F16 * 2)]), None, M_BATCH, InvalidInputError, "[request id: <id_unknown>] unexpected shape for input 'X' for model 'm'. Expected [-1,-1,16], got [2,16]. " + NOTE),
    ("shape-wrong-dim", j(inputs=[tensor("X", (1, 2, 15), data=[0.0] * 30)]), None, M_BATCH, InvalidInputError, "[request id: <id_unknown>] unexpected shape for input 'X' for model 'm'. Expected [-1,-1,16], got [1,2,15]. " + NOTE),
    ("shape-non-batching", j(inputs=[tensor("A", (3,), data=[0.0] * 3), tensor("B", (2,), data=[0, 0])]), None, M_TWO, InvalidInputError, "[request id: <id_unknown>] unexpected shape for input 'A' for model 'm'. Expected [2], got [3]. "),
    ("batch-too-large", j(inputs=[tensor(shape=(9, 16), data=[0.0] * 144)]), None, IDENTITY, InvalidInputError, "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'm'"),
    ("batch-zero", j(inputs=[tensor(shape=(0, 16), data=[])]), None, IDENTITY, InvalidInputError, "[request id: <id_unknown>] inference request batch-size must be between 1 and 8 for 'm', got 0"),
    ("batch-mismatch", j(inputs=[tensor("A", (1, 2), data=[0, 0]), tensor("B", (2, 2), data=[0] * 4)]), None, config(inputs=(("A", "FP32", (2,)), ("B", "FP32", (2,)))), InvalidInputError, "[request id: <id_unknown>] input 'B' batch size does not match other inputs for 'm'"),
    ("no-shape-batching", j(inputs=[tensor(shape=(), data=[])]), None, IDENTITY, InvalidInputError, "[request id: <id_unknown>] input 'INPUT0' has no shape but model requires batch dimension for 'm'"),
    # -- hostile shapes (400, before any allocation)
    ("huge-binary-shape", (j(inputs=[tensor("X", (2, 2**62, 16), **binary(64))]), bytes(64)), "", M_BATCH, InvalidInputError, "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'm'. Expected 590295810358705651712, got 64"),
    ("huge-json-shape", j(inputs=[tensor("X", (8, 2**40, 2**40), data=[])]), None, M_BATCH, InvalidInputError, "invalid shape for input 'X': shape [8,1099511627776,1099511627776] causes total element count to exceed maximum size of 9223372036854775807"),
    ("json-bigger-than-limit", j(inputs=[tensor("X", (8, 2**30), data=[])]), None, M_BATCH, InvalidInputError, "JSON input 'X' has a byte_size (34359738368 bytes) that exceeds the maximum allowed value of 67108864 bytes. Use --http-max-input-size to increase the limit."),
    ("dim-beyond-int64", j(inputs=[tensor("X", (1, 2**64 - 1), data=[])]), None, M_BATCH, InvalidInputError, "invalid shape for input 'X': shape [1,-1] contains one or more invalid dimensions"),
    ("binary-dim-beyond-int64", (j(inputs=[tensor("X", (1, 2**64 - 1, 16), **binary(4))]), bytes(4)), "", M_BATCH, InvalidInputError, "[request id: <id_unknown>] All input dimensions should be specified for input 'X' for model 'm', got [1,-1,16]"),
    # -- BYTES framing (400)
    ("bytes-short-indicator", (j(inputs=[tensor("S", (2,), "BYTES", **binary(6))]), b"\x01\x00\x00\x00a\x00"), "", M_BYTES, InvalidInputError, "[request id: <id_unknown>] incomplete string length indicator for inference input 'S' for model 'm', expecting 4 bytes but only 1 bytes available. Please make sure the string length indicator is in one buffer."),
    ("bytes-too-many", (j(inputs=[tensor("S", (2,), "BYTES", **binary(12))]), bytes(12)), "", M_BYTES, InvalidInputError, "[request id: <id_unknown>] unexpected number of string elements 3 for inference input 'S' for model 'm', expecting 2"),
    ("bytes-too-few", (j(inputs=[tensor("S", (2,), "BYTES", **binary(5))]), b"\x01\x00\x00\x00a"), "", M_BYTES, InvalidInputError, "[request id: <id_unknown>] expected 2 string elements for inference input 'S' for model 'm', got 1"),
    ("bytes-overrun", (j(inputs=[tensor("S", (2,), "BYTES", **binary(9))]), b"\x00\x00\x00\x00\x09\x00\x00\x00a"), "", M_BYTES, InvalidInputError, "[request id: <id_unknown>] string element 2 of inference input 'S' for model 'm' declares 9 bytes but only 1 bytes remain"),
    ("bytes-json-too-many", j(inputs=[tensor("S", (2,), "BYTES", data=["a", "b", "c"])]), None, M_BYTES, InvalidInputError, "[request id: <id_unknown>] unexpected number of string elements 3 for inference input 'S' for model 'm', expecting 2"),
    ("bytes-json-too-few", j(inputs=[tensor("S", (2,), "BYTES", data=["a"])]), None, M_BYTES, InvalidInputError, "[request id: <id_unknown>] expected 2 string elements for inference input 'S' for model 'm', got 1"),
]
# fmt: on


def _error_body(spec: Any, header: str | None) -> tuple[bytes, str | None]:
    if isinstance(spec, bytes):
        return spec, header
    if isinstance(spec, tuple):
        doc, blobs = spec
        head = orjson.dumps(doc, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
        return head + blobs, str(len(head))
    return orjson.dumps(spec), header


@pytest.mark.parametrize(
    ("case", "spec", "header", "cfg", "cls", "message"), ERROR_CASES, ids=[row[0] for row in ERROR_CASES]
)
def test_bad_request_raises_tritons_error(
    case: str,
    spec: Any,
    header: str | None,
    cfg: ModelConfig,
    cls: type[NereidError] | None,
    message: str | None,
) -> None:
    body, header = _error_body(spec, header)
    if case == "json-too-large":
        with raises(
            InvalidInputError,
            f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of 100 bytes. "
            "Use --http-max-input-size to increase the limit.",
        ):
            parse(body, header, cfg, max_json_size=100)
        return
    assert cls is not None and message is not None
    with raises(cls, message):
        parse(body, header, cfg)


def test_json_data_nested_just_under_the_depth_limit_is_accepted() -> None:
    body = orjson.dumps({"inputs": [tensor("I", (2,), "INT32", data=[nested(97), 2])]})
    assert parse(body, None, M_INT).inputs["I"].tolist() == [1, 2]


def test_header_length_is_parsed_like_cpp_stoi() -> None:
    body = orjson.dumps({"inputs": [fp32_input(binary=False)]})
    for header in (str(len(body)), f" {len(body)}", f"+{len(body)}", f"{len(body)}abc", f"000{len(body)}"):
        assert parse(body, header).inputs["INPUT0"].shape == (1, 16)


def test_checks_run_in_tritons_order() -> None:
    # The HTTP layer's blob accounting comes before the core's name and shape checks...
    doc = {"inputs": [tensor("Z", (3,), **binary(4))]}
    with raises(InvalidInputError, "unexpected size for input 'Z', expecting 4 additional bytes for model 'm'"):
        parse_json(doc, blobs=b"")
    # ...and the input count before unknown names, which come before shapes.
    two = {"inputs": [tensor("A", (5,), data=[0] * 5), tensor("Z", (2,), data=[0, 0])]}
    with raises(InvalidInputError, "unexpected inference input 'Z' for model 'm'"):
        parse_json(two, M_TWO)


def test_unexpected_failures_become_malformed_request_errors_as_a_last_resort() -> None:
    def broken(name: str, offset: int, size: int) -> memoryview:
        raise RuntimeError("boom")

    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"shared_memory_region": "r"},
            }
        ]
    }
    with raises(
        MalformedRequestError,
        "failed to parse the inference request for model 'm': unexpected RuntimeError: boom",
    ):
        parse_json(doc, resolve_shm=broken)


# -- hostile input: only ever a NereidError -------------------------------------------------

HOSTILE_CONFIGS = [IDENTITY, M_TWO, M_BYTES, M_BATCH, config(inputs=(("X", "BOOL", (-1,)),), max_batch_size=0)]
VALID_BODY, VALID_HEADER = client_body(
    [client_input("INPUT0", np.ones((1, 16), np.float32), "FP32")],
    [InferRequestedOutput("OUTPUT0")],
    request_id="9",
)


def _parse_or_error(body: bytes, header: str | None, cfg: ModelConfig) -> None:
    """Parse; a NereidError is fine, but never the last-resort wrapper (a real check must fire)."""
    try:
        infer_request.parse_infer_request(body, header, config=cfg, model_name="m", model_version=1, max_json_size=4096)
    except NereidError as exc:
        assert not exc.message.startswith("failed to parse the inference request"), exc.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "datatype",
                    "shape",
                    "data",
                    "parameters",
                    "inputs",
                    "outputs",
                    "id",
                    "binary_data_size",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=300),
    header=st.none() | st.text(max_size=12) | st.integers(-5, 400).map(str),
    cfg=st.sampled_from(HOSTILE_CONFIGS),
)
def test_garbage_bodies_only_raise_nereid_errors(body: bytes, header: str | None, cfg: ModelConfig) -> None:
    _parse_or_error(body, header, cfg)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=json_values, cfg=st.sampled_from(HOSTILE_CONFIGS), tail=st.binary(max_size=40))
def test_arbitrary_json_documents_only_raise_nereid_errors(doc: Any, cfg: ModelConfig, tail: bytes) -> None:
    head = json.dumps(doc).encode()
    _parse_or_error(head + tail, str(len(head)) if tail else None, cfg)


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(0, len(VALID_BODY) - 1),
    value=st.integers(0, 255),
    cut=st.integers(0, len(VALID_BODY)),
    header=st.sampled_from([VALID_HEADER, None, "0", "1"]),
)
def test_mutated_client_bodies_only_raise_nereid_errors(
    position: int, value: int, cut: int, header: str | None
) -> None:
    body = bytearray(VALID_BODY)
    body[position] = value
    _parse_or_error(bytes(body[:cut]), header, IDENTITY)
    _parse_or_error(bytes(body), header, IDENTITY)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.lists(st.integers(0, 2**64 - 1), max_size=4),
    size=st.integers(0, 2**64 - 1),
    wire=st.sampled_from(["FP32", "BYTES", "BOOL", "INT8"]),
)
def test_hostile_shapes_and_sizes_only_raise_nereid_errors(shape: list[int], size: int, wire: str) -> None:
    for cfg in HOSTILE_CONFIGS:
        doc = {
            "inputs": [
                {
                    "name": cfg.input[0].name,
                    "shape": shape,
                    "datatype": wire,
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
        head = orjson.dumps(doc)
        _parse_or_error(head + bytes(16), str(len(head)), cfg)

def test_an_empty_json_tensor_with_a_dim_beyond_int64_is_refused_cleanly() -> None:
    cfg = config(inputs=(("X", "FP32", (-1, -1)),), max_batch_size=0)
    doc = {"inputs": [tensor("X", (0, 2**64 - 1), data=[])]}
    with raises(
        InvalidInputError,
        "[request id: <id_unknown>] All input dimensions should be specified for input 'X' for model 'm', got [0,-1]",
    ):
        parse_json(doc, cfg)

@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=wild_requests(), cfg=st.sampled_from(WILD_CONFIGS))
def test_structured_hostile_requests_only_raise_nereid_errors(
    request: tuple[bytes, str | None], cfg: ModelConfig
) -> None:
    body, header = request
    _parse_or_error(body, header, cfg)


@settings(max_examples=150, deadline=None)
@given(
    wire=st.sampled_from([dt.wire_name for dt in DATATYPES]),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    binary=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_tensor_a_client_sends_is_what_the_model_receives(
    wire: str, shape: list[int], binary: bool, seed: int
) -> None:
    binary = binary or wire in ("FP16", "BF16")
    cfg = config(inputs=(("X", wire, tuple(-1 for _ in shape)),), outputs=(("Y", wire, ()),), max_batch_size=0)
    data = sample(wire, tuple(shape), seed)
    body, header = client_body(
        [client_input("X", data, wire, binary=binary)], [InferRequestedOutput("Y", binary_data=True)]
    )
    got = parse(body, header, cfg).inputs["X"]
    assert got.shape == tuple(shape) and got.dtype == dtype(wire).numpy
    if wire == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got.astype(np.float64), data.astype(np.float64))


def test_json_and_binary_inputs_mix_and_blobs_follow_input_order() -> None:
    cfg = config(inputs=(("A", "INT32", (2,)), ("B", "INT8", (3,)), ("C", "BYTES", (1,))), max_batch_size=0)
    body, header = client_body(
        [
            client_input("C", np.array([b"xyz"], dtype=object), "BYTES"),
            client_input("A", np.array([5, 6], dtype=np.int32), "INT32", binary=False),
            client_input("B", np.array([-1, 0, 1], dtype=np.int8), "INT8"),
        ]
    )
    request = parse(body, header, cfg)
    assert list(request.inputs) == ["C", "A", "B"]
    assert request.inputs["C"].tolist() == [b"xyz"]
    assert request.inputs["A"].tolist() == [5, 6]
    assert request.inputs["B"].tolist() == [-1, 0, 1]


def test_json_integers_at_the_64_bit_limits() -> None:
    cfg = config(inputs=(("U", "UINT64", (1,)), ("I", "INT64", (1,))), max_batch_size=0)
    doc = {
        "inputs": [
            tensor("U", (1,), "UINT64", data=[2**64 - 1]),
            tensor("I", (1,), "INT64", data=[-(2**63)]),
        ]
    }
    request = parse_json(doc, cfg)
    assert request.inputs["U"].tolist() == [2**64 - 1]
    assert request.inputs["I"].tolist() == [-(2**63)]


def test_empty_binary_input_with_a_zero_dim() -> None:
    cfg = config(inputs=(("X", "FP32", (-1,)),))
    request = parse_json({"inputs": [tensor("X", (1, 0), **binary(0))]}, cfg)
    assert request.inputs["X"].shape == (1, 0)


def test_shared_memory_bytes_input_is_split_into_elements() -> None:
    region = bytearray(b"\x02\x00\x00\x00hi\x01\x00\x00\x00!")
    doc = {
        "inputs": [
            tensor(
                "S",
                (2,),
                "BYTES",
                parameters={"shared_memory_region": "r", "shared_memory_byte_size": len(region)},
            )
        ]
    }
    request = parse_json(doc, M_BYTES, resolve_shm=lambda name, offset, size: memoryview(region))
    assert request.inputs["S"].tolist() == [b"hi", b"!"]


@pytest.mark.parametrize("sequence_id", [7, 2**64 - 1, "session-a"], ids=["int", "uint64-max", "string"])
def test_tritonclients_sequence_parameters_reach_the_request(sequence_id: int | str) -> None:
    cfg = config(inputs=(("X", "INT32", (1,)),), outputs=(("Y", "INT32", (1,)),), max_batch_size=0)
    body, header = client_body([client_input("X", np.array([1], dtype=np.int32), "INT32", binary=True)],
                               sequence_id=sequence_id, sequence_start=True, sequence_end=True)
    request = parse(body, header, cfg)
    assert request.sequence == SequenceFlags(sequence_id, True, True)
    assert request.parameters == {}


def test_a_request_without_sequence_parameters_has_none() -> None:
    cfg = config(inputs=(("X", "INT32", (1,)),), outputs=(("Y", "INT32", (1,)),), max_batch_size=0)
    body, header = client_body([client_input("X", np.array([1], dtype=np.int32), "INT32", binary=True)])
    assert parse(body, header, cfg).sequence is None
