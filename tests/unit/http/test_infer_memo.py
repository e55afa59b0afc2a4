"""http/infer_memo.py: the InferMemo (a request planned from a JSON header seen twice, an
answer rebuilt from a remembered header, each equal to what the full path makes) and
HttpTablesCache (one HttpModelTables per served model version: the same one for every
request to it, a new one for a reloaded version, and none that outlives its model)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import orjson
import pytest

from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import by_wire_name
from nereid.errors import InvalidInputError
from nereid.http import infer_response
from nereid.http.infer import encode_answer, read_request
from nereid.http.infer_memo import HttpModelTables, HttpTablesCache
from nereid.http.infer_request import parse_infer_request
from nereid.inference import InferRequest, InferResult


class Served:
    """What the codec lookup reads of a ServingModel: its config (and its identity)."""

    def __init__(self) -> None:
        self.config = ModelConfig(name="m", max_batch_size=0)


def endpoints() -> Any:
    """What the tests below call ``ep._codec``: the endpoints' HttpTablesCache lookup."""
    cache = HttpTablesCache()

    class _Endpoints:
        _codec = staticmethod(cache.get)

    return _Endpoints()


def test_each_served_version_keeps_its_own_codec() -> None:
    ep = endpoints()
    first, second = Served(), Served()
    codec_first = ep._codec(first)  # type: ignore[arg-type]
    assert ep._codec(first) is codec_first  # type: ignore[arg-type]
    codec_second = ep._codec(second)  # type: ignore[arg-type]
    assert codec_second is not codec_first
    assert ep._codec(first) is codec_first  # type: ignore[arg-type]  # after another one was asked for
    assert ep._codec(second) is codec_second  # type: ignore[arg-type]


def test_a_codec_does_not_keep_its_model_alive() -> None:
    ep = endpoints()
    served: Any = Served()
    ep._codec(served)
    ep._codec(served)  # now also the last one asked for
    gone = weakref.ref(served)
    del served
    gc.collect()
    assert gone() is None
    replacement: Any = Served()  # may reuse the freed address: still a codec of its own
    assert ep._codec(replacement).config is replacement.config



# -- InferMemo: requests ---------------------------------------------------------------------

FP32 = by_wire_name("FP32")
assert FP32 is not None
CONFIG = ModelConfig(
    name="m", max_batch_size=8, input=(ModelInput("INPUT0", FP32, (4,)),), output=(ModelOutput("OUTPUT0", FP32, (4,)),)
)
LIMIT = 64 << 20


def binary_body(values: list[float], **header: Any) -> tuple[bytes, str]:
    """An infer body with INPUT0 as a binary blob, and its Inference-Header-Content-Length."""
    blob = np.asarray([values], np.float32).tobytes()
    doc = {**header, "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": len(blob)}}]}
    text = orjson.dumps(doc)
    return text + blob, str(len(text))


def read(tables: HttpModelTables, body: bytes, header_length: str | None) -> InferRequest:
    return read_request(body, header_length, tables, "m", 1, LIMIT)


def same_request(got: InferRequest, expected: InferRequest) -> None:
    assert (got.model_name, got.model_version, got.id, got.rows, got.priority, got.timeout_us) == (
        expected.model_name, expected.model_version, expected.id, expected.rows, expected.priority, expected.timeout_us)
    assert (got.parameters, got.binary_data_output, got.outputs) == (
        expected.parameters, expected.binary_data_output, expected.outputs)
    assert list(got.inputs) == list(expected.inputs)
    for name, array in expected.inputs.items():
        np.testing.assert_array_equal(got.inputs[name], array)
        assert got.inputs[name].dtype == array.dtype


def test_a_header_is_planned_the_second_time_it_is_read_in_full() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    body, length = binary_body([1, 2, 3, 4])
    read(tables, body, length)
    assert tables.memo.parse(body, length, "m", 1, LIMIT) is None  # seen once: a per-request id costs no plan
    read(tables, body, length)
    assert tables.memo.counters.plans == 1
    assert tables.memo.parse(body, length, "m", 1, LIMIT) is not None
    assert tables.memo.counters.requests == 1


@pytest.mark.parametrize("header", [
    pytest.param({}, id="bare"),
    pytest.param({"id": "r7", "parameters": {"priority": 2, "timeout": 5, "custom": "v"}}, id="id and parameters"),
    pytest.param({"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}, id="outputs listed"),
])
def test_a_planned_request_is_the_full_parsers_request_of_the_new_body(header: dict[str, Any]) -> None:
    tables = HttpModelTables.for_config(CONFIG)
    first, length = binary_body([1, 2, 3, 4], **header)
    read(tables, first, length)
    read(tables, first, length)
    second, _ = binary_body([5, 6, 7, 8], **header)
    planned = tables.memo.parse(second, length, "m", 1, LIMIT)
    assert planned is not None
    same_request(planned, parse_infer_request(second, length, config=CONFIG, model_name="m", model_version=1))
    assert np.shares_memory(planned.inputs["INPUT0"], np.frombuffer(second, np.uint8))  # a view, no copy


def test_json_inputs_are_never_planned() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    for _ in range(3):
        read(tables, body, None)
    assert tables.memo.counters.plans == 0


@pytest.mark.parametrize("spelling", [
    pytest.param(lambda length: "+" + length, id="sign"),
    pytest.param(lambda length: " " + length, id="space"),
    pytest.param(lambda length: "0", id="raw"),
    pytest.param(lambda length: None, id="absent"),
])
def test_a_header_length_the_memo_does_not_read_plainly_goes_to_the_full_parser(spelling: Any) -> None:
    tables = HttpModelTables.for_config(CONFIG)
    body, length = binary_body([1, 2, 3, 4])
    read(tables, body, length)
    read(tables, body, length)
    assert tables.memo.parse(body, length, "m", 1, LIMIT) is not None
    assert tables.memo.parse(body, spelling(length), "m", 1, LIMIT) is None


def test_a_planned_header_with_a_body_of_another_length_is_left_to_the_full_parser() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    body, length = binary_body([1, 2, 3, 4])
    read(tables, body, length)
    read(tables, body, length)
    assert tables.memo.parse(body + b"xx", length, "m", 1, LIMIT) is None
    with pytest.raises(InvalidInputError, match="unexpected additional input data"):
        read(tables, body + b"xx", length)


# -- InferMemo: answers ----------------------------------------------------------------------


def full_answer(tables: HttpModelTables, request: InferRequest, outputs: dict[str, Any]) -> tuple[bytes, Any]:
    encoded = encode_answer(tables, InferResult("m", 1, outputs, request.id), request)
    return infer_response.finish(encoded, None)


def test_an_answer_is_rebuilt_from_its_remembered_header_byte_for_byte() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    request = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True)
    first = {"OUTPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)}
    assert tables.memo.answer(request, first, 1) is None  # nothing remembered yet
    full_answer(tables, request, first)
    second = {"OUTPUT0": np.full((1, 4), 9, np.float32)}
    known = tables.memo.answer(request, second, 1)
    assert known is not None
    headers, parts = known
    body, content_headers = full_answer(HttpModelTables.for_config(CONFIG), request, second)
    assert b"".join(parts) == body
    assert list(headers) == [*content_headers, (b"content-length", b"%d" % len(body))]
    again = tables.memo.answer(request, second, 1)
    assert again is not None and again[0] is headers  # one headers object: the engine keeps its encoding


def test_an_answer_of_another_shape_version_or_id_is_not_rebuilt() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    request = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=True)
    full_answer(tables, request, {"OUTPUT0": np.zeros((1, 4), np.float32)})
    assert tables.memo.answer(request, {"OUTPUT0": np.zeros((2, 4), np.float32)}, 1) is None
    assert tables.memo.answer(request, {"OUTPUT0": np.zeros((1, 4), np.float32)}, 2) is None
    other = InferRequest(model_name="m", inputs={}, rows=1, id="x", binary_data_output=True)
    assert tables.memo.answer(other, {"OUTPUT0": np.zeros((1, 4), np.float32)}, 1) is None
    assert tables.memo.answer(request, {"OUTPUT0": [0.0] * 4}, 1) is None  # not a numpy array


def test_a_json_answer_is_never_remembered() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    request = InferRequest(model_name="m", inputs={}, rows=1, binary_data_output=False)
    outputs = {"OUTPUT0": np.zeros((1, 4), np.float32)}
    full_answer(tables, request, outputs)
    assert tables.memo.answer(request, outputs, 1) is None and tables.memo.counters.replies == 0
