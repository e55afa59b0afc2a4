"""``InferMemo``: the memo in front of the infer path. A remembered request header parses a
new body exactly like a fresh parse, and a remembered answer header encodes exactly like a
fresh encode.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from nereid.config.schema import ModelConfig
from nereid.errors import InvalidInputError, NereidError
from nereid.http import infer, infer_response
from nereid.http.infer_memo import HttpModelTables
from nereid.inference import InferRequest, InferResult, RequestedOutput
from tritonclient.http import InferRequestedOutput  # type: ignore[import-untyped]

from tests.unit.http.infer_bodies import (
    WILD_CONFIGS,
    binary,
    client_body,
    client_input,
    client_result,
    config,
    fp32_input,
    parse,
    parse_json,
    raises,
    sample,
    tensor,
    wild_requests,
)


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
