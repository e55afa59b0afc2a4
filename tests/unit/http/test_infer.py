"""The HTTP infer codec both ways, as the infer endpoint runs it (``infer``: ``infer_request``
parses, ``infer_response`` encodes): infer bodies exactly as stock tritonclient builds and
reads them. Requests are built with tritonclient's own request builder and responses decoded
with its own InferResult, so a round trip here is what a real client sees on the wire.
"""

from __future__ import annotations

import numpy as np
import pytest
from nereid.datatypes import DATATYPES
from nereid.errors import InternalError, InvalidInputError, ModelNotFoundError, UnsupportedError
from nereid.inference import RequestedOutput
from tritonclient.http import InferRequestedOutput  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from tests.unit.http.infer_bodies import (
    IDENTITY,
    NOTE,
    client_body,
    client_input,
    client_result,
    config,
    dtype,
    encode,
    fp32_input,
    parse,
    parse_json,
    raises,
    sample,
)


# -- the worked example (protocol.md §3.7) ------------------------------------------------

EXAMPLE_JSON = (
    b'{"id":"42","inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"INT32","parameters":{"binary_data_size":16}},'
    b'{"name":"INPUT1","shape":[1,2],"datatype":"BYTES","parameters":{"binary_data_size":11}}],'
    b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
)
EXAMPLE_BLOBS = bytes.fromhex("01000000 02000000 03000000 ffffffff") + bytes.fromhex(
    "02000000 6162 01000000 63"
)
EXAMPLE_CONFIG = config(
    inputs=(("INPUT0", "INT32", (4,)), ("INPUT1", "BYTES", (2,))), outputs=(("OUTPUT0", "FP32", (2,)),)
)
EXAMPLE_RESPONSE_JSON = (
    b'{"id":"42","model_name":"m","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32",'
    b'"shape":[1,2],"parameters":{"binary_data_size":8}}]}'
)


def test_worked_example_request_bytes_match_tritonclient_and_parse() -> None:
    body, header = client_body(
        [
            client_input("INPUT0", np.array([[1, 2, 3, -1]], dtype=np.int32), "INT32"),
            client_input("INPUT1", np.array([[b"ab", b"c"]], dtype=object), "BYTES"),
        ],
        [InferRequestedOutput("OUTPUT0", binary_data=True)],
        request_id="42",
    )
    assert len(EXAMPLE_JSON) == 263
    assert header == "263"
    assert body == EXAMPLE_JSON + EXAMPLE_BLOBS
    assert len(body) == 290

    request = parse(body, header, EXAMPLE_CONFIG)

    assert request.id == "42"
    assert request.rows == 1
    assert request.inputs["INPUT0"].dtype == np.int32
    assert request.inputs["INPUT0"].tolist() == [[1, 2, 3, -1]]
    assert request.inputs["INPUT1"].dtype == object
    assert request.inputs["INPUT1"].tolist() == [[b"ab", b"c"]]
    assert request.outputs == (RequestedOutput("OUTPUT0", binary_data=True),)


def test_worked_example_response_bytes_and_headers() -> None:
    request = parse(EXAMPLE_JSON + EXAMPLE_BLOBS, "263", EXAMPLE_CONFIG)

    body, headers = encode({"OUTPUT0": np.array([[1.5, -2.0]], dtype=np.float32)}, request, EXAMPLE_CONFIG)

    assert len(EXAMPLE_RESPONSE_JSON) == 147
    assert body == EXAMPLE_RESPONSE_JSON + bytes.fromhex("0000c03f 000000c0")
    assert len(body) == 155
    assert headers == {b"content-type": b"application/octet-stream", b"inference-header-content-length": b"147"}
    assert client_result(body, headers).as_numpy("OUTPUT0").tolist() == [[1.5, -2.0]]


# -- every datatype, binary and JSON, both directions ----------------------------------------


ROUND_TRIPS = [
    pytest.param(dt.wire_name, binary_in, binary_out, id=f"{dt.wire_name}-{mode_in}-in-{mode_out}-out")
    for dt in DATATYPES
    for binary_in, mode_in in ((True, "binary"), (False, "json"))
    for binary_out, mode_out in ((True, "binary"), (False, "json"))
    if dt.json_allowed or (binary_in and binary_out)  # FP16/BF16: binary only (JSON refusals tested below)
]


@pytest.mark.parametrize(("wire", "binary_in", "binary_out"), ROUND_TRIPS)
def test_every_datatype_round_trips_through_tritonclient(wire: str, binary_in: bool, binary_out: bool) -> None:
    cfg = config(inputs=(("X", wire, (3,)),), outputs=(("Y", wire, (3,)),), max_batch_size=4)
    data = sample(wire, (2, 3))
    body, header = client_body(
        [client_input("X", data, wire, binary=binary_in)], [InferRequestedOutput("Y", binary_data=binary_out)]
    )

    request = parse(body, header, cfg)
    got = request.inputs["X"]
    assert got.dtype == dtype(wire).numpy
    assert got.shape == (2, 3)
    assert request.rows == 2
    if wire == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got.astype(np.float64), data.astype(np.float64))

    response, headers = encode({"Y": got}, request, cfg)
    back = client_result(response, headers).as_numpy("Y")
    assert back.shape == (2, 3)
    if wire == "BYTES":
        expected = data.tolist() if binary_out else [[b.decode() for b in row] for row in data.tolist()]
        assert back.tolist() == expected
    else:
        np.testing.assert_array_equal(back.astype(np.float64), data.astype(np.float64))


@pytest.mark.parametrize("wire", ["FP16", "BF16"])
def test_half_types_sent_as_json_are_refused_with_tritons_message(wire: str) -> None:
    cfg = config(inputs=(("X", wire, (2,)),), max_batch_size=0)
    doc = {"inputs": [{"name": "X", "shape": [2], "datatype": wire, "data": [1.0, 2.0]}]}
    with raises(
        InvalidInputError,
        f"receiving {wire} data via JSON is not supported. Please use the binary data format for input X",
    ):
        parse_json(doc, cfg)


@pytest.mark.parametrize("wire", ["FP16", "BF16"])
def test_half_type_output_requested_as_json_is_a_400(wire: str) -> None:
    cfg = config(outputs=(("Y", wire, (2,)),))
    request = parse_json({"inputs": [fp32_input((1, 16), binary=False)], "outputs": [{"name": "Y"}]}, cfg)
    with raises(
        InvalidInputError,
        f"sending {wire} data via JSON is not supported. Please use the binary data format for output 'Y' of model 'm'",
    ):
        encode({"Y": np.zeros((1, 2), dtype=dtype(wire).numpy)}, request, cfg)


def test_bf16_travels_as_the_high_half_of_float32() -> None:
    cfg = config(inputs=(("X", "BF16", (2,)),), outputs=(("Y", "BF16", (2,)),), max_batch_size=0)
    body = (
        b'{"inputs":[{"name":"X","shape":[2],"datatype":"BF16","parameters":{"binary_data_size":4}}],'
        b'"parameters":{"binary_data_output":true}}'
    )
    request = parse(body + bytes.fromhex("c03f 00c0"), str(len(body)), cfg)

    assert request.inputs["X"].astype(np.float32).tolist() == [1.5, -2.0]
    response, headers = encode({"Y": request.inputs["X"]}, request, cfg)
    assert response.endswith(bytes.fromhex("c03f 00c0"))
    assert headers[b"content-type"] == b"application/octet-stream"


def test_numeric_binary_inputs_are_read_only_views_on_the_body() -> None:
    body, header = client_body([client_input("INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16), "FP32")])
    request = parse(body, header)
    array = request.inputs["INPUT0"]

    assert np.shares_memory(array, np.frombuffer(body, dtype=np.uint8))
    assert not array.flags.writeable


def test_bool_bytes_other_than_0_and_1_read_as_true() -> None:
    cfg = config(inputs=(("X", "BOOL", (4,)),), outputs=(("Y", "BOOL", (4,)),), max_batch_size=0)
    header = b'{"inputs":[{"name":"X","shape":[4],"datatype":"BOOL","parameters":{"binary_data_size":4}}]}'
    request = parse(header + bytes([0, 1, 2, 255]), str(len(header)), cfg)

    assert request.inputs["X"].dtype == np.bool_
    assert request.inputs["X"].tolist() == [False, True, True, True]
    body, _ = encode({"Y": request.inputs["X"]}, request, cfg)
    assert body.endswith(b'"data":[false,true,true,true]}]}')


def test_nested_json_data_is_flattened_depth_first() -> None:
    cfg = config(inputs=(("X", "INT32", (2, 2)),), max_batch_size=0)
    doc = {"inputs": [{"name": "X", "shape": [2, 2], "datatype": "INT32", "data": [[1, [2]], [[[3]], 4]]}]}
    assert parse_json(doc, cfg).inputs["X"].tolist() == [[1, 2], [3, 4]]


def test_nested_json_bytes_data_becomes_utf8_bytes() -> None:
    cfg = config(inputs=(("X", "BYTES", (2,)),), max_batch_size=0)
    doc = {"inputs": [{"name": "X", "shape": [2], "datatype": "BYTES", "data": [["é"], [["b"]]]}]}
    assert parse_json(doc, cfg).inputs["X"].tolist() == ["é".encode(), b"b"]


def test_json_floats_accept_ints_and_ints_wrap_to_width_like_c_casts() -> None:
    cfg = config(inputs=(("X", "FP32", (2,)), ("Y", "INT8", (2,)), ("Z", "UINT8", (2,))), max_batch_size=0)
    doc = {
        "inputs": [
            {"name": "X", "shape": [2], "datatype": "FP32", "data": [1, 2.5]},
            {"name": "Y", "shape": [2], "datatype": "INT8", "data": [-129, 300]},
            {"name": "Z", "shape": [2], "datatype": "UINT8", "data": [256, 257]},
        ]
    }
    request = parse_json(doc, cfg)
    assert request.inputs["X"].tolist() == [1.0, 2.5]
    assert request.inputs["Y"].tolist() == [127, 44]
    assert request.inputs["Z"].tolist() == [0, 1]


def test_json_nan_and_infinity_tokens_are_accepted_as_tritonclient_sends_them() -> None:
    cfg = config(inputs=(("X", "FP64", (3,)),), outputs=(("Y", "FP64", (3,)),), max_batch_size=0)
    data = np.array([np.nan, np.inf, -np.inf])
    body, header = client_body(
        [client_input("X", data, "FP64", binary=False)], [InferRequestedOutput("Y", False)]
    )
    assert b"NaN" in body

    request = parse(body, header, cfg)
    assert np.isnan(request.inputs["X"][0]) and request.inputs["X"][1:].tolist() == [np.inf, -np.inf]

    response, headers = encode({"Y": request.inputs["X"]}, request, cfg)
    assert b'"data":[NaN,Infinity,-Infinity]' in response
    back = client_result(response, headers).as_numpy("Y")
    assert np.isnan(back[0]) and back[1:].tolist() == [np.inf, -np.inf]


def test_json_fp32_outputs_are_widened_to_double() -> None:
    request = parse_json({"inputs": [fp32_input((1, 16), binary=False)], "outputs": [{"name": "OUTPUT0"}]})
    body, headers = encode({"OUTPUT0": np.full((1, 16), 0.1, dtype=np.float32)}, request)

    assert body.startswith(
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32"'
    )
    assert b'"shape":[1,16],"data":[0.10000000149011612,' in body
    assert headers == {b"content-type": b"application/json"}


def test_bytes_json_output_with_invalid_utf8_is_copied_raw_like_triton() -> None:
    cfg = config(outputs=(("Y", "BYTES", (2,)),))
    request = parse_json({"inputs": [fp32_input((1, 16), binary=False)], "outputs": [{"name": "Y"}]}, cfg)
    body, headers = encode({"Y": np.array([[b'a"\n\\', b"\xff\xfe"]], dtype=object)}, request, cfg)

    assert body.endswith(b'"data":["a\\"\\n\\\\","\xff\xfe"]}]}')
    with pytest.raises(InferenceServerException, match="binary_data=True"):
        client_result(body, headers)


def test_bytes_outputs_accept_str_elements() -> None:
    cfg = config(outputs=(("Y", "BYTES", (2,)),))
    request = parse_json(
        {"inputs": [fp32_input()], "parameters": {"binary_data_output": True}}, cfg, blobs=bytes(64)
    )
    body, headers = encode({"Y": np.array([["é", b"x"]], dtype=object)}, request, cfg)
    assert client_result(body, headers).as_numpy("Y").tolist() == [["é".encode(), b"x"]]

# -- shared memory -------------------------------------------------------------------------


def test_shared_memory_inputs_are_views_of_the_resolved_region() -> None:
    region = bytearray(np.arange(20, dtype=np.float32).tobytes())
    calls: list[tuple[str, int, int]] = []

    def resolve(name: str, offset: int, size: int) -> memoryview:
        calls.append((name, offset, size))
        return memoryview(region)[offset : offset + size]

    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {
                    "shared_memory_region": "r",
                    "shared_memory_byte_size": 64,
                    "shared_memory_offset": 16,
                },
            }
        ]
    }
    request = parse_json(doc, resolve_shm=resolve)
    assert calls == [("r", 16, 64)]
    assert request.inputs["INPUT0"].tolist() == [list(range(4, 20))]


def test_unknown_shared_memory_region_is_a_404() -> None:
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
    with raises(ModelNotFoundError, "Unable to find shared memory region: 'r'"):
        parse_json(doc)

    def unknown(name: str, offset: int, size: int) -> memoryview:
        raise KeyError(name)

    with raises(ModelNotFoundError, "Unable to find shared memory region: 'r'"):
        parse_json(doc, resolve_shm=unknown)


def test_shared_memory_outputs_are_recorded_and_written_through_the_callback() -> None:
    region = bytearray(80)

    def resolve(name: str, offset: int, size: int) -> memoryview:
        return memoryview(region)[offset : offset + size]

    def write(name: str, offset: int, data: memoryview) -> None:
        region[offset : offset + len(data)] = data

    doc = {
        "inputs": [fp32_input(binary=False)],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {
                    "shared_memory_region": "o",
                    "shared_memory_byte_size": 64,
                    "shared_memory_offset": 8,
                    "binary_data": False,
                },
            }
        ],
    }
    request = parse_json(doc, resolve_shm=resolve)
    assert request.outputs == (RequestedOutput("OUTPUT0", shm_region="o", shm_byte_size=64, shm_offset=8),)

    output = {"OUTPUT0": np.full((1, 16), 2.0, np.float32)}
    with raises(
        UnsupportedError,
        "output 'OUTPUT0' of model 'm' was requested in shared memory region 'o', which this server cannot write yet",
    ):
        encode(output, request)

    body, headers = encode(output, request, write_shm=write)
    assert body.endswith(b'"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1,16]}]}')
    assert headers == {b"content-type": b"application/json"}
    assert np.frombuffer(bytes(region[8:72]), np.float32).tolist() == [2.0] * 16

    small = parse_json(
        {
            **doc,
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 60}}
            ],
        },
        resolve_shm=resolve,
    )
    with raises(
        InternalError,
        "shared memory size specified with the request for output 'OUTPUT0' (60 bytes) should be at least 64 bytes to hold the results",
    ):
        encode(output, small, write_shm=write)

def test_unicode_request_ids_are_echoed_exactly() -> None:
    request = parse_json({"id": "ünï-42", "inputs": [fp32_input(binary=False)]})
    assert request.id == "ünï-42"
    assert encode({"OUTPUT0": np.zeros((1, 16), np.float32)}, request)[0].startswith('{"id":"ünï-42",'.encode())


def test_configs_are_told_apart_even_when_equal_in_name() -> None:
    small = config(inputs=(("INPUT0", "FP32", (4,)),))
    doc = {"inputs": [fp32_input((1, 4), binary=False)]}
    assert parse_json(doc, small).inputs["INPUT0"].shape == (1, 4)
    with raises(
        InvalidInputError,
        "[request id: <id_unknown>] unexpected shape for input 'INPUT0' for model 'm'. Expected [-1,16], got [1,4]. "
        + NOTE,
    ):
        parse_json(doc, IDENTITY)
