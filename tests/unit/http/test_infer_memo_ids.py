"""InferMemo with a client that gives each request an id of its own (perf_analyzer
``--async``, tracing clients): the plan and the answer header are kept for the header
without the id's text, and each repeat gets its own id back, exactly as the full parser
and encoder would give it; ids the memo cannot put back as they are (escapes, control
characters, a later "id" key) go the full way every time."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereid.errors import NereidError
from nereid.http import infer_response
from nereid.http.infer import encode_answer, read_request
from nereid.http.infer_memo import HttpModelTables
from nereid.http.infer_request import parse_infer_request
from nereid.inference import InferRequest, InferResult
from tests.unit.http.test_infer_memo import CONFIG, LIMIT, same_request


def body_with_id(request_id: str, values: list[float], *, spaced: bool = False, **extra: Any) -> tuple[bytes, str]:
    """An infer body that leads with ``request_id``: as perf_analyzer and orjson write it,
    or (``spaced``) as tritonclient's json.dumps does."""
    blob = np.asarray([values], np.float32).tobytes()
    doc = {"id": request_id, **extra, "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": len(blob)}}]}
    text = json.dumps(doc).encode() if spaced else orjson.dumps(doc)
    return text + blob, str(len(text))


def full(body: bytes, length: str) -> Any:
    """The full parser's request, or its error."""
    try:
        return parse_infer_request(body, length, config=CONFIG, model_name="m", model_version=1)
    except NereidError as exc:
        return (type(exc), exc.message)


def test_a_request_with_an_id_of_its_own_is_planned_by_the_rest_of_its_header() -> None:
    for spaced in (False, True):
        tables = HttpModelTables.for_config(CONFIG)
        for request_id in ("281474976710656", "281474976710657"):  # two ids, the same header otherwise
            read_request(*body_with_id(request_id, [1, 2, 3, 4], spaced=spaced), tables, "m", 1, LIMIT)
        assert tables.memo.counters.plans == 1
        body, length = body_with_id("281474976710658", [5, 6, 7, 8], spaced=spaced)
        planned = tables.memo.parse(body, length, "m", 1, LIMIT)
        assert planned is not None and planned.id == "281474976710658"
        same_request(planned, full(body, length))
        # an id of another length is another header: the full parser's
        assert tables.memo.parse(*body_with_id("2814749767106590", [5, 6, 7, 8], spaced=spaced), "m", 1, LIMIT) is None


def test_ids_the_memo_cannot_put_back_as_they_are_are_parsed_in_full() -> None:
    # (learnt with, asked with, whether the memo plans it): an escape or a control
    # character on the wire is not the id's text; UTF-8 is
    for first, second, planned_by_memo in [
        ('a"b', 'c"d', False), ("a\\b", "c\\d", False), ("a\x01", "b\x01", False),
        ("\u00e9", "\u00e8", True),
    ]:
        tables = HttpModelTables.for_config(CONFIG)
        for _ in range(2):
            read_request(*body_with_id(first, [1, 2, 3, 4]), tables, "m", 1, LIMIT)
        body, length = body_with_id(second, [5, 6, 7, 8])
        planned = tables.memo.parse(body, length, "m", 1, LIMIT)
        assert (planned is not None) == planned_by_memo, (first, second)
        if planned is not None:
            same_request(planned, full(body, length))
    # a second "id" key (the parser keeps the last one) or one in a parameter: the memo
    # cannot tell which is the request's, so it keeps to whole headers
    def twice(request_id: str) -> tuple[bytes, str]:
        body, length = body_with_id(request_id, [1, 2, 3, 4])
        json_length = int(length)
        header = body[:json_length - 1] + b',"id":"z"}'
        return header + body[json_length:], str(len(header))

    for make in (twice, lambda request_id: body_with_id(request_id, [1, 2, 3, 4], parameters={"id": "p"})):
        tables = HttpModelTables.for_config(CONFIG)
        for request_id in ("r1", "r2"):
            read_request(*make(request_id), tables, "m", 1, LIMIT)
        body, length = make("r3")
        assert tables.memo.parse(body, length, "m", 1, LIMIT) is None
        assert read_request(body, length, tables, "m", 1, LIMIT).id == full(body, length).id


def full_answer(tables: HttpModelTables, request: InferRequest, outputs: dict[str, Any]) -> tuple[bytes, Any]:
    encoded = encode_answer(tables, InferResult("m", 1, outputs, request.id), request)
    return infer_response.finish(encoded, None)


def test_an_answer_to_an_id_of_its_own_is_the_full_answer_byte_for_byte() -> None:
    tables = HttpModelTables.for_config(CONFIG)
    outputs = {"OUTPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)}
    full_answer(tables, InferRequest(model_name="m", inputs={}, rows=1, id="r1", binary_data_output=True), outputs)
    request = InferRequest(model_name="m", inputs={}, rows=1, id="r2", binary_data_output=True)
    known = tables.memo.answer(request, outputs, 1)
    assert known is not None
    headers, parts = known
    body, content_headers = full_answer(HttpModelTables.for_config(CONFIG), request, outputs)
    assert b"".join(parts) == body and b'"id":"r2"' in body
    assert list(headers) == [*content_headers, (b"content-length", b"%d" % len(body))]
    third = tables.memo.answer(InferRequest(model_name="m", inputs={}, rows=1, id="r3", binary_data_output=True),
                               outputs, 1)
    assert third is not None and third[0] is headers  # one headers object: the engine keeps its encoding
    longer = InferRequest(model_name="m", inputs={}, rows=1, id="r10", binary_data_output=True)
    assert tables.memo.answer(longer, outputs, 1) is None


#: the answer as a binary blob: the kind of answer the memo keeps
BINARY_OUTPUT = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
IDS = st.one_of(
    st.text(alphabet='0123456789', min_size=1, max_size=3),
    st.text(alphabet='ab"\\\x01\u00e9/', max_size=3),
    st.just(""),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=st.lists(IDS, min_size=1, max_size=6), spaced=st.booleans())
def test_requests_and_answers_with_any_ids_are_the_full_paths(ids: list[str], spaced: bool) -> None:
    """Whatever ids come, in whatever order: each request the memo makes is the full
    parser's, and each answer it makes is the full encoder's, byte for byte."""
    tables = HttpModelTables.for_config(CONFIG)
    outputs = {"OUTPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)}
    answered = [0]
    for index, request_id in enumerate(ids * 3):
        body, length = body_with_id(request_id, [index, 2, 3, 4], spaced=spaced, outputs=BINARY_OUTPUT)
        expected = full(body, length)
        planned = tables.memo.parse(body, length, "m", 1, LIMIT)
        if planned is not None:
            same_request(planned, expected)
        request = read_request(body, length, tables, "m", 1, LIMIT)
        same_request(request, expected)
        known = tables.memo.answer(request, outputs, 1)
        body_out, _ = full_answer(HttpModelTables.for_config(CONFIG), request, outputs)
        if known is not None:
            assert b"".join(known[1]) == body_out
            answered[0] += 1
        full_answer(tables, request, outputs)  # learns, as the endpoint does
    assert answered[0] > 0  # each id comes three times: once planned, its answer is the memo's
