"""The HTTP infer codec (infer_request, infer_response, compression, repeats): infer bodies
exactly as stock tritonclient builds and reads them.

Requests are built with tritonclient's own request builder and responses decoded with
its own InferResult, so a round trip here is what a real client sees on the wire.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import DATATYPES, DataType, by_wire_name
from nereid.errors import (
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelExecutionError,
    ModelNotFoundError,
    NereidError,
    UnsupportedError,
)
from nereid.http import compression, infer, infer_request, infer_response
from nereid.http.infer_memo import HttpModelTables
from nereid.inference import InferRequest, InferResult, RequestedOutput
from nereid.tensors.checks import InputProblem
from tritonclient.http import InferInput, InferRequestedOutput  # type: ignore[import-untyped]
from tritonclient.http import InferResult as ClientResult
from tritonclient.http._utils import _get_inference_request  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
NUMERIC_WIRE = [dt.wire_name for dt in DATATYPES if not dt.is_bytes]
JSON_WIRE = [dt.wire_name for dt in DATATYPES if dt.json_allowed]


def dtype(wire: str) -> DataType:
    found = by_wire_name(wire)
    assert found is not None
    return found


def config(
    inputs: Sequence[tuple[str, str, tuple[int, ...]]] = (("INPUT0", "FP32", (16,)),),
    outputs: Sequence[tuple[str, str, tuple[int, ...]]] = (("OUTPUT0", "FP32", (16,)),),
    max_batch_size: int = 8,
    optional: Sequence[str] = (),
    label_outputs: Sequence[str] = (),
) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        input=tuple(ModelInput(n, dtype(w), d, optional=n in optional) for n, w, d in inputs),
        output=tuple(
            ModelOutput(n, dtype(w), d, label_filename="labels.txt" if n in label_outputs else "")
            for n, w, d in outputs
        ),
    )


IDENTITY = config()


def client_input(name: str, array: np.ndarray, wire: str, binary: bool = True) -> InferInput:
    tensor = InferInput(name, list(array.shape), wire)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def client_body(
    inputs: list[InferInput],
    outputs: list[InferRequestedOutput] | None = None,
    request_id: str = "",
    priority: int = 0,
    timeout: int | None = None,
    parameters: dict[str, Any] | None = None,
    sequence_id: int | str = 0,
) -> tuple[bytes, str | None]:
    """The body and Inference-Header-Content-Length tritonclient sends (None: header absent)."""
    body, json_size = _get_inference_request(
        inputs=inputs,
        request_id=request_id,
        outputs=outputs,
        sequence_id=sequence_id,
        sequence_start=False,
        sequence_end=False,
        priority=priority,
        timeout=timeout,
        custom_parameters=parameters,
    )
    if isinstance(body, str):
        body = body.encode()
    return body, None if json_size is None else str(json_size)


def parse(
    body: bytes, header: str | None = None, cfg: ModelConfig | HttpModelTables = IDENTITY, **kwargs: Any
) -> InferRequest:
    """The full parser for a plain config; for a HttpModelTables, the endpoint's way
    (``infer.read_request``: its repeats first, then the full parser, which they learn from)."""
    if isinstance(cfg, HttpModelTables):
        return infer.read_request(
            body, header, cfg, "m", 1, kwargs.get("max_json_size", 64 << 20), kwargs.get("resolve_shm")
        )
    return infer_request.parse_infer_request(body, header, config=cfg, model_name="m", model_version=1, **kwargs)


def parse_json(doc: dict[str, Any], cfg: ModelConfig = IDENTITY, blobs: bytes = b"", **kw: Any) -> InferRequest:
    header = orjson.dumps(doc)
    return parse(header + blobs, str(len(header)) if blobs else None, cfg, **kw)


def fp32_input(shape: Sequence[int] = (1, 16), binary: bool = True) -> dict[str, Any]:
    count = int(np.prod(shape))
    if binary:
        return {
            "name": "INPUT0",
            "shape": list(shape),
            "datatype": "FP32",
            "parameters": {"binary_data_size": 4 * count},
        }
    return {"name": "INPUT0", "shape": list(shape), "datatype": "FP32", "data": [0.0] * count}


def encode(
    outputs: dict[str, np.ndarray],
    request: InferRequest,
    cfg: ModelConfig = IDENTITY,
    **kwargs: Any,
) -> tuple[bytes, dict[bytes, bytes]]:
    result = InferResult("m", 1, outputs, request.id)
    body, headers = infer_response.encode_infer_response(result, request, cfg, **kwargs)
    as_dict = dict(headers)
    assert len(as_dict) == len(headers), "a header was sent twice"
    return body, as_dict


def client_result(body: bytes, headers: dict[bytes, bytes]) -> ClientResult:
    length = headers.get(b"inference-header-content-length")
    encoding = headers.get(b"content-encoding")
    return ClientResult.from_response_body(
        body,
        verbose=False,
        header_length=None if length is None else int(length),
        content_encoding=None if encoding is None else encoding.decode(),
    )


def sample(wire: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if wire == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if wire == "BYTES":
        return np.array([f"s{i}-é".encode() * (i % 3) for i in range(count)], dtype=object).reshape(shape)
    if wire == "BF16":
        return rng.normal(size=shape).astype(ml_dtypes.bfloat16)
    np_dtype = dtype(wire).numpy
    if np_dtype.kind == "f":
        return rng.normal(size=shape).astype(np_dtype)
    info = np.iinfo(np_dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=np_dtype)


@contextlib.contextmanager
def raises(cls: type[NereidError], message: str) -> Iterator[None]:
    """pytest.raises for an exact class (not a subclass) and an exact message."""
    with pytest.raises(cls) as info:
        yield
    exact = type(info.value) is cls or (cls is InvalidInputError and type(info.value) is InputProblem)
    assert exact, f"{type(info.value).__name__}: {info.value}"  # InputProblem: the checking core's 400s
    assert info.value.message == message


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


# -- compression ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)], ids=["gzip", "deflate"]
)
def test_compressed_request_bodies_are_inflated(encoding: str, compress: Callable[[bytes], bytes]) -> None:
    body, header = client_body([client_input("INPUT0", np.ones((1, 16), np.float32), "FP32")])
    plain = compression.decode_body(compress(body), encoding, max_size=1 << 20)
    assert plain == body
    assert parse(plain, header).inputs["INPUT0"].sum() == 16


@pytest.mark.parametrize("encoding", [None, "", "identity"])
def test_identity_bodies_are_returned_as_is(encoding: str | None) -> None:
    body = b"\x00 anything"
    assert compression.decode_body(body, encoding, max_size=1) is body


@pytest.mark.parametrize("encoding", ["br", "GZIP", "gzip, deflate", "x-gzip"])
def test_unsupported_content_encoding_is_a_501(encoding: str) -> None:
    with raises(UnsupportedError, "Unsupported compression type"):
        compression.decode_body(gzip.compress(b"{}"), encoding, max_size=100)


def test_zip_bomb_stops_at_the_size_limit() -> None:
    bomb = gzip.compress(bytes(50_000_000))
    with raises(
        InvalidInputError,
        "request body of more than 1000 bytes exceeds the maximum allowed size (1000 bytes, --max-request-size)",
    ):
        compression.decode_body(bomb, "gzip", max_size=1000)
    assert compression.decode_body(gzip.compress(bytes(1000)), "gzip", max_size=1000) == bytes(1000)


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"not compressed at all", "Error -3 while decompressing data: incorrect header check"),
        (gzip.compress(b"x" * 100)[:-12], "the compressed data is truncated"),
        (gzip.compress(b"x") + b"junk", "4 unexpected bytes after the end of the compressed data"),
    ],
    ids=["garbage", "truncated", "trailing"],
)
def test_corrupt_compressed_bodies_are_400s_naming_the_encoding(data: bytes, detail: str) -> None:
    with raises(
        InvalidInputError, f"failed to decompress the request body with Content-Encoding 'deflate': {detail}"
    ):
        compression.decode_body(data, "deflate", max_size=1 << 20)


def test_empty_compressed_body_is_a_400() -> None:
    with raises(
        InvalidInputError, "request body with Content-Encoding 'gzip' is empty: nothing to be decompressed"
    ):
        compression.decode_body(b"", "gzip", max_size=10)


@pytest.mark.parametrize(
    ("value", "chosen"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate, br", "gzip"),
        ("deflate, gzip", "deflate"),
        ("br", None),
        ("identity", None),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("deflate;q=0.5,gzip;q=0.5", "deflate"),
        ("gzip;q=0, identity", None),
        ("identity;q=0.9, gzip", "gzip"),
        ("gzip;q=abc, deflate;q=0.1", "deflate"),
        ("gzip ;q=1", None),
        ("GZIP", None),
        ("*", None),
        ("  gzip", "gzip"),
        ("gzip;q=1e999, deflate", "deflate"),
    ],
)
def test_accept_encoding_follows_tritons_rules(value: str | None, chosen: str | None) -> None:
    assert compression.parse_accept_encoding(value) == chosen


@pytest.mark.parametrize(
    ("accept", "encoding", "decompress"),
    [("gzip, deflate, br", b"gzip", gzip.decompress), ("deflate", b"deflate", zlib.decompress)],
    ids=["gzip", "deflate"],
)
def test_responses_are_compressed_when_the_client_accepts_it(
    accept: str, encoding: bytes, decompress: Callable[[bytes], bytes]
) -> None:
    request = parse_json(
        {"id": "7", "inputs": [fp32_input(binary=False)], "parameters": {"binary_data_output": True}}
    )
    plain, plain_headers = encode({"OUTPUT0": np.ones((1, 16), np.float32)}, request)
    body, headers = encode({"OUTPUT0": np.ones((1, 16), np.float32)}, request, accept_encoding=accept)

    assert decompress(body) == plain
    assert headers == {**plain_headers, b"content-encoding": encoding}
    assert client_result(body, headers).as_numpy("OUTPUT0").tolist() == [[1.0] * 16]


# -- raw binary requests (Inference-Header-Content-Length: 0) ------------------------------


def test_raw_binary_request_deduces_the_variable_dim_and_a_batch_of_one() -> None:
    cfg = config(inputs=(("X", "FP32", (2, -1)),))
    request = parse(np.arange(6, dtype=np.float32).tobytes(), "0", cfg)
    assert request.inputs["X"].shape == (1, 2, 3)
    assert request.rows == 1
    assert request.outputs is None and request.binary_data_output is True


def test_raw_binary_bytes_input_is_one_element() -> None:
    cfg = config(inputs=(("X", "BYTES", (1,)),), max_batch_size=0)
    assert parse(b"\x00raw", "0", cfg).inputs["X"].tolist() == [b"\x00raw"]


@pytest.mark.parametrize(
    ("cfg", "body", "message"),
    [
        (
            config(inputs=(("X", "FP32", (1,)), ("Y", "FP32", (1,)), ("Z", "FP32", (1,)))),
            b"1234",
            (
                "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 3 "
                "inputs in 'm' model configuration"
            ),
        ),
        (
            config(inputs=(("X", "FP32", (-1, -1)),)),
            b"1234",
            (
                "[request id: <id_unknown>] The shape of the raw input 'X' can not be deduced because there are "
                "more than one variable-sized dimension"
            ),
        ),
        (
            config(inputs=(("X", "BYTES", (2,)),)),
            b"1234",
            "[request id: <id_unknown>] For BYTE datatype raw input 'X', the model must have input shape [1]",
        ),
        (
            config(inputs=(("X", "FP32", (2,)),)),
            b"123",
            "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'm'. Expected 8, got 3",
        ),
    ],
    ids=["many-inputs", "two-variable-dims", "bytes-shape", "size"],
)
def test_raw_binary_request_errors(cfg: ModelConfig, body: bytes, message: str) -> None:
    with raises(InvalidInputError, message):
        parse(body, "0", cfg)


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


# -- errors: one row per situation, exact class and message --------------------------------

M_BATCH = config(inputs=(("X", "FP32", (-1, 16)),), outputs=(), max_batch_size=8)
M_TWO = config(
    inputs=(("A", "FP32", (2,)), ("B", "FP32", (2,))), outputs=(("Y", "FP32", (2,)),), max_batch_size=0
)
M_OPTIONAL = config(inputs=(("A", "FP32", (2,)), ("B", "FP32", (2,))), max_batch_size=0, optional=("B",))
M_BYTES = config(inputs=(("S", "BYTES", (2,)),), max_batch_size=0)
M_INT = config(inputs=(("I", "INT32", (2,)),), max_batch_size=0)


def j(**fields: Any) -> dict[str, Any]:
    return fields


def tensor(name: Any = "INPUT0", shape: Any = (1, 16), datatype: str = "FP32", **rest: Any) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(shape) if isinstance(shape, tuple) else shape,
        "datatype": datatype,
        **rest,
    }


def binary(size: int) -> dict[str, Any]:
    return {"parameters": {"binary_data_size": size}}


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


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), encoding=st.sampled_from(["gzip", "deflate", "br", "identity"]))
def test_garbage_compressed_bodies_only_raise_nereid_errors(data: bytes, encoding: str) -> None:
    try:
        compression.decode_body(data, encoding, max_size=1000)
    except NereidError:
        pass


def test_an_empty_json_tensor_with_a_dim_beyond_int64_is_refused_cleanly() -> None:
    cfg = config(inputs=(("X", "FP32", (-1, -1)),), max_batch_size=0)
    doc = {"inputs": [tensor("X", (0, 2**64 - 1), data=[])]}
    with raises(
        InvalidInputError,
        "[request id: <id_unknown>] All input dimensions should be specified for input 'X' for model 'm', got [0,-1]",
    ):
        parse_json(doc, cfg)


WILD_CONFIGS = [
    config(inputs=(("X", wire, dims),), max_batch_size=mbs)
    for wire in ("FP32", "BYTES", "BOOL", "UINT64", "FP16")
    for dims, mbs in (((-1,), 4), ((2, -1), 0), ((-1, -1), 0))
]
dims_values = st.sampled_from([0, 1, 2, 3, 4, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=3)
data_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5), max_leaves=12)


@st.composite
def wild_requests(draw: st.DrawFn) -> tuple[bytes, str | None]:
    entries = []
    blobs = b""
    for _ in range(draw(st.integers(0, 2))):
        entry: dict[str, Any] = {
            "name": draw(st.sampled_from(["X", "Y"])),
            "datatype": draw(st.sampled_from(["FP32", "BYTES", "BOOL", "UINT64", "FP16", "INT8"])),
            "shape": draw(st.lists(dims_values, max_size=3)),
        }
        if draw(st.booleans()):
            entry["data"] = draw(st.lists(data_values, max_size=6))
        else:
            blob = draw(st.binary(max_size=24))
            entry["parameters"] = {"binary_data_size": len(blob) + draw(st.sampled_from([0, 0, 0, 1, -1]))}
            blobs += blob
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        doc["outputs"] = [
            {
                "name": draw(st.sampled_from(["OUTPUT0", "Q"])),
                "parameters": {"classification": draw(st.integers(0, 3))},
            }
        ]
    head = json.dumps(doc).encode()
    return head + blobs, str(len(head)) if blobs else None


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


# -- repeated headers (parse plans) --------------------------------------------------------
# A model's HttpModelTables remembers what it decided for a JSON header it has parsed twice; from
# the third request on, only the arrays are made. These tests send each header at least three
# times through one HttpModelTables, and compare with a plain ModelConfig (parsed afresh each time).


def fresh_identity() -> HttpModelTables:
    """A codec for the identity config with nothing remembered yet."""
    return HttpModelTables.for_config(config())


def test_a_repeated_header_reads_each_new_body() -> None:
    cfg = fresh_identity()
    first, header = client_body([client_input("INPUT0", np.full((1, 16), 1.0, np.float32), "FP32")])
    second, header2 = client_body([client_input("INPUT0", np.full((1, 16), 2.0, np.float32), "FP32")])
    assert header is not None and header == header2
    assert first[: int(header)] == second[: int(header)]

    requests = [parse(body, header, cfg) for body in (first, first, second, first)]

    assert (cfg.memo.counters.plans, cfg.memo.counters.requests) == (1, 2)  # 3rd and 4th from the plan
    assert [r.inputs["INPUT0"][0, 0] for r in requests] == [1.0, 1.0, 2.0, 1.0]
    assert np.shares_memory(requests[2].inputs["INPUT0"], np.frombuffer(second, np.uint8))
    assert not requests[2].inputs["INPUT0"].flags.writeable
    assert all(r.outputs is None and r.binary_data_output and r.rows == 1 and r.id == "" for r in requests)


def test_a_planned_header_is_parsed_the_short_way_into_the_same_request() -> None:
    cfg = fresh_identity()
    first, header = client_body([client_input("INPUT0", np.full((1, 16), 1.0, np.float32), "FP32")])
    second, _ = client_body([client_input("INPUT0", np.full((1, 16), 2.0, np.float32), "FP32")])
    assert header is not None
    assert cfg.memo.parse(first, header, "m", 1, 64 << 20) is None  # nothing planned yet
    parse(first, header, cfg)
    assert cfg.memo.parse(first, header, "m", 1, 64 << 20) is None  # seen once: not planned
    parse(first, header, cfg)

    planned = cfg.memo.parse(second, header, "m", 1, 64 << 20)

    assert planned is not None
    assert _summary(planned) == _summary(parse(second, header, fresh_identity()))
    assert np.shares_memory(planned.inputs["INPUT0"], np.frombuffer(second, np.uint8))
    assert not planned.inputs["INPUT0"].flags.writeable
    assert (planned.model_name, planned.model_version) == ("m", 1)


@pytest.mark.parametrize(
    "header_of, limit",
    [
        (lambda h: None, 64 << 20),  # no Inference-Header-Content-Length
        (lambda h: " " + h, 64 << 20),  # stoi would take it: the full parser decides
        (lambda h: "+" + h, 64 << 20),
        (lambda h: "0", 64 << 20),  # a raw binary request
        (lambda h: str(int(h) + 1), 64 << 20),  # another split of the same body
        (lambda h: "99999999999", 64 << 20),
        (lambda h: h, 16),  # over --http-max-input-size: the full parser reports it
    ],
)
def test_anything_but_a_planned_header_is_left_to_the_full_parser(
    header_of: Callable[[str], str | None], limit: int
) -> None:
    cfg = fresh_identity()
    body, header = client_body([client_input("INPUT0", np.full((1, 16), 1.0, np.float32), "FP32")])
    assert header is not None
    for _ in range(2):
        parse(body, header, cfg)
    assert cfg.memo.parse(body, header, "m", 1, 64 << 20) is not None

    assert cfg.memo.parse(body, header_of(header), "m", 1, limit) is None


def test_a_planned_header_with_inputs_to_convert_converts_them_from_each_body() -> None:
    spec = config(inputs=(("B", "BOOL", (4,)),), max_batch_size=0)
    cfg = HttpModelTables.for_config(spec)
    body, header = client_body([client_input("B", np.array([True, False, True, True]), "BOOL")])
    for _ in range(2):
        parse(body, header, cfg)
    assert cfg.memo.counters.plans == 1  # planned, but BOOL bytes are normalised: not a plain view

    planned = cfg.memo.parse(body, header, "m", 1, 64 << 20)
    assert planned is not None and _summary(planned) == _summary(parse(body, header, spec))


def test_a_repeated_header_still_checks_bytes_framing() -> None:
    cfg = HttpModelTables.for_config(config(inputs=(("S", "BYTES", (2,)),), max_batch_size=0))
    head = orjson.dumps({"id": "x", "inputs": [tensor("S", (2,), "BYTES", **binary(10))]})
    good = head + b"\x01\x00\x00\x00a\x01\x00\x00\x00b"
    bad = head + b"\x05\x00\x00\x00a\x01\x00\x00\x00b"
    for _ in range(3):
        assert parse(good, str(len(head)), cfg).inputs["S"].tolist() == [b"a", b"b"]
    with raises(
        InvalidInputError,
        "[request id: x] incomplete string length indicator for inference input 'S' for model 'm', expecting 4 "
        "bytes but only 1 bytes available. Please make sure the string length indicator is in one buffer.",
    ):
        parse(bad, str(len(head)), cfg)


def test_a_repeated_header_normalises_bools_of_each_body() -> None:
    cfg = HttpModelTables.for_config(config(inputs=(("X", "BOOL", (2,)),), max_batch_size=0))
    head = orjson.dumps({"inputs": [tensor("X", (2,), "BOOL", **binary(2))]})
    for _ in range(2):
        assert parse(head + b"\x00\x07", str(len(head)), cfg).inputs["X"].tolist() == [False, True]
    assert cfg.memo.counters.plans == 1
    assert parse(head + b"\x03\x00", str(len(head)), cfg).inputs["X"].tolist() == [True, False]
    assert cfg.memo.counters.requests == 1


def test_a_repeated_header_gives_each_request_its_own_parameters() -> None:
    cfg = fresh_identity()
    doc = {"inputs": [fp32_input()], "parameters": {"k": 1}}
    for _ in range(3):
        request = parse_json(doc, cfg, blobs=bytes(64))
        assert dict(request.parameters) == {"k": 1}
        request.parameters["k"] = 2  # type: ignore[index]  # a model may change its own copy


def test_parsing_keeps_no_reference_to_the_body() -> None:
    cfg = fresh_identity()
    body, header = client_body([client_input("INPUT0", np.ones((1, 16), np.float32), "FP32")])
    before = sys.getrefcount(body)
    for _ in range(3):
        request = parse(body, header, cfg)
        del request
    gc.collect()
    assert sys.getrefcount(body) == before


def _outcome(body: bytes, header: str | None, cfg: ModelConfig | HttpModelTables) -> Any:
    """A comparable summary of parsing: the error, or every field of the request."""
    try:
        request = parse(body, header, cfg)
    except NereidError as exc:
        return (type(exc), exc.message)
    return _summary(request)


def _summary(request: InferRequest) -> Any:
    """Every field of a parsed request, comparable."""
    arrays = {
        name: (a.dtype.str, a.shape, a.tolist() if a.dtype == object else a.tobytes())
        for name, a in request.inputs.items()
    }
    return (
        list(arrays.items()),
        request.id,
        request.rows,
        request.outputs,
        dict(request.parameters),
        request.priority,
        request.timeout_us,
        request.binary_data_output,
    )


def _remembering(cfg: ModelConfig) -> HttpModelTables:
    """A codec for ``cfg`` that remembers the headers it parses (a ModelConfig alone is
    parsed afresh every time)."""
    return HttpModelTables.for_config(cfg)


@st.composite
def client_requests(draw: st.DrawFn) -> tuple[ModelConfig, bytes, str | None]:
    """A config and a binary request tritonclient would send for it (sometimes a little off)."""
    batching = draw(st.booleans())
    names = draw(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=3, unique=True))
    wires = [draw(st.sampled_from(["FP32", "BYTES", "BOOL", "INT8", "BF16"])) for _ in names]
    shapes = [tuple(draw(st.sampled_from([-1, 1, 2])) for _ in range(draw(st.integers(1, 2)))) for _ in names]
    cfg = config(
        inputs=tuple(zip(names, wires, shapes)),
        outputs=(("Y", "FP32", (1,)),),
        max_batch_size=4 if batching else 0,
    )
    batch = (draw(st.integers(1, 4)),) if batching else ()
    inputs = []
    for name, wire, config_dims in zip(names, wires, shapes):
        shape = batch + tuple(d if d != -1 else draw(st.integers(0, 3)) for d in config_dims)
        if draw(st.integers(0, 9)) == 0:
            shape = shape + (1,)  # off: one dim too many
        inputs.append(client_input(name, sample(wire, shape, draw(st.integers(0, 99))), wire))
    outputs = None
    if draw(st.booleans()):
        outputs = [
            InferRequestedOutput("Y", binary_data=draw(st.booleans()), class_count=draw(st.integers(0, 2)))
        ]
    body, header = client_body(
        draw(st.permutations(inputs)), outputs, request_id=draw(st.sampled_from(["", "7"]))
    )
    return cfg, body, header


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=client_requests(), flip=st.integers(0, 255))
def test_a_remembered_client_header_parses_a_new_body_exactly_like_a_fresh_parse(
    request: tuple[ModelConfig, bytes, str | None], flip: int
) -> None:
    cfg, body, header = request
    split = len(body) if header is None else int(header)
    other = body[:split] + bytes(byte ^ flip for byte in body[split:])
    warm = _remembering(cfg)
    for _ in range(2):
        _outcome(body, header, warm)
    assert _outcome(body, header, warm) == _outcome(body, header, cfg)
    assert _outcome(other, header, warm) == _outcome(other, header, cfg)
    # The short way to a planned request, where it answers, gives the same request.
    try:
        planned = warm.memo.parse(other, header, "m", 1, 64 << 20)
    except NereidError as exc:  # a plan re-checks BYTES framing: the same error as a fresh parse
        assert (type(exc), exc.message) == _outcome(other, header, cfg)
    else:
        if planned is not None:
            assert _summary(planned) == _outcome(other, header, cfg)


@settings(max_examples=200, deadline=None)
@given(request=wild_requests(), cfg_index=st.integers(0, len(WILD_CONFIGS) - 1), flip=st.integers(0, 255))
def test_a_remembered_header_parses_a_new_body_exactly_like_a_fresh_parse(
    request: tuple[bytes, str | None], cfg_index: int, flip: int
) -> None:
    body, header = request
    split = len(body) if header is None else int(header)
    other = body[:split] + bytes(byte ^ flip for byte in body[split:])  # same header, new blobs
    cfg = WILD_CONFIGS[cfg_index]
    warm = _remembering(cfg)
    for _ in range(2):
        _outcome(body, header, warm)
    assert _outcome(other, header, warm) == _outcome(other, header, cfg)


# -- repeated answers (reply memo) ----------------------------------------------------------
# The codec reuses the JSON header of an all-binary answer whose output names, dtypes and
# shapes, request id, output selection and model version are those of an earlier answer.

ANSWER_CONFIG = config(outputs=(("A", "FP32", (-1,)), ("B", "INT8", (-1,)), ("C", "BF16", (2,))), max_batch_size=4)


def _answer(outputs: dict[str, np.ndarray], request: InferRequest, codec_: Any, version: int = 1) -> Any:
    """A comparable summary of encoding in full (learning into ``codec_``'s repeats, as the
    endpoint does): the error, or the body and headers."""
    try:
        encoded = infer.encode_answer(codec_, InferResult("m", version, outputs, ""), request)
        body, headers = infer_response.finish(encoded, None)
    except NereidError as exc:
        return (type(exc), exc.message)
    return body, headers


def test_a_repeated_answer_carries_each_new_value_and_shape() -> None:
    memo = HttpModelTables.for_config(ANSWER_CONFIG)
    request = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True)
    answers = [
        {"A": np.full((1, 3), value, np.float32), "B": np.full((1, n), value, np.int8)}
        for value, n in [(1, 2), (2, 2), (3, 2), (4, 5), (5, 2)]
    ]
    known = []
    for outputs in answers:
        known.append(memo.memo.answer(request, outputs, 1))
        body, headers = _answer(outputs, request, memo)
        assert (body, headers) == _answer(outputs, request, HttpModelTables.for_config(ANSWER_CONFIG))
        decoded = client_result(body, dict(headers))
        np.testing.assert_array_equal(decoded.as_numpy("A"), outputs["A"])
        np.testing.assert_array_equal(decoded.as_numpy("B"), outputs["B"])
        if known[-1] is not None:  # the short way gives the same bytes
            assert b"".join(known[-1][1]) == body
            assert list(known[-1][0]) == headers + [(b"content-length", b"%d" % len(body))]
    assert memo.memo.counters.answers == 3  # the shortcut was taken for each repeat
    # remembered from the second answer of a kind on: not from the first of each
    assert [k is not None for k in known] == [False, True, True, False, True]
    assert known[1][0] is known[2][0]  # the same headers object: the engine may remember its encoding


def test_a_remembered_header_is_not_used_for_another_id_version_or_selection() -> None:
    memo = HttpModelTables.for_config(ANSWER_CONFIG)
    outputs = {"A": np.ones((1, 2), np.float32), "B": np.ones((1, 2), np.int8)}
    plain = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True)
    with_id = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True, id="r7")
    only_b = InferRequest(
        model_name="m", inputs={}, rows=1, outputs=(RequestedOutput("B", binary_data=True),)
    )
    only_b_again = InferRequest(
        model_name="m", inputs={}, rows=1, outputs=(RequestedOutput("B", binary_data=True),)
    )
    as_json = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=False)
    for _ in range(2):
        for request in (plain, with_id, only_b, only_b_again, as_json):
            for version in (1, 2):
                fresh = HttpModelTables.for_config(ANSWER_CONFIG)
                assert _answer(outputs, request, memo, version) == _answer(outputs, request, fresh, version)
    body, headers = _answer(outputs, with_id, memo)
    assert json.loads(body[: int(dict(headers)[b"inference-header-content-length"])])["id"] == "r7"


def test_converted_or_json_or_classified_outputs_are_not_remembered() -> None:
    memo = HttpModelTables.for_config(ANSWER_CONFIG)
    binary = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True)
    classified = InferRequest(
        model_name="m", inputs={}, rows=1, outputs=(RequestedOutput("A", binary_data=True, classification=1),)
    )
    as_json = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=False)
    for _ in range(3):
        _answer({"A": np.ones((1, 2), np.float64)}, binary, memo)  # converted to FP32
        _answer({"A": np.ones((1, 2), np.float32)}, classified, memo)
        _answer({"A": [[1.0, 2.0]]}, binary, memo)  # not an array
        _answer({"A": np.ones((1, 2), np.float32)}, as_json, memo)
    assert memo.memo.counters.replies == 0


@st.composite
def answer_cases(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], InferRequest]:
    names = draw(st.lists(st.sampled_from(["A", "B", "C"]), min_size=1, max_size=3, unique=True))
    wires = {"A": "FP32", "B": "INT8", "C": "BF16"}
    outputs = {}
    for name in names:
        wire = draw(st.sampled_from([wires[name], "FP64"])) if name != "C" else "BF16"
        shape = (draw(st.integers(1, 2)), 2 if name == "C" else draw(st.integers(0, 3)))
        outputs[name] = sample(wire, shape, draw(st.integers(0, 9)))
    requested = None
    if draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        requested = tuple(RequestedOutput(n, binary_data=draw(st.booleans())) for n in chosen)
    request = InferRequest(
        model_name="m", inputs={}, rows=1, outputs=requested, binary_data_output=draw(st.booleans()),
        id=draw(st.sampled_from(["", "x"])),
    )
    return outputs, request


@settings(max_examples=200, deadline=None)
@given(cases=st.lists(answer_cases(), min_size=1, max_size=6), repeats=st.integers(1, 3))
def test_remembered_answers_encode_exactly_like_fresh_ones(
    cases: list[tuple[dict[str, np.ndarray], InferRequest]], repeats: int
) -> None:
    memo = HttpModelTables.for_config(ANSWER_CONFIG)
    for repeat in range(repeats + 1):
        for outputs, request in cases:
            if repeat == repeats:  # the same dtypes and shapes, other values
                outputs = {name: value[..., ::-1].copy() + value for name, value in outputs.items()}
            fresh = HttpModelTables.for_config(ANSWER_CONFIG)
            known = memo.memo.answer(request, outputs, 1)
            expected = _answer(outputs, request, fresh)
            assert _answer(outputs, request, memo) == expected
            if known is not None:  # the short way, where it answers, gives the same bytes
                body, headers = expected
                with_length = headers + [(b"content-length", b"%d" % len(body))]
                assert (b"".join(known[1]), list(known[0])) == (body, with_length)
