"""nereid.tensors.wire_inputs: Triton's wire forms of an input (JSON ``data``, BYTES
framing, binary views) -> the numpy arrays a model receives, and Triton's errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from nereid.datatypes import by_wire_name
from nereid.errors import InvalidInputError, MalformedRequestError
from nereid.tensors.wire_inputs import (
    BINARY,
    JSON,
    MAX_JSON_DEPTH,
    WireInput,
    body_views,
    json_bytes_data,
    json_input,
    json_numeric_data,
    parse_bytes_elements,
    to_array,
    view_spec,
)

FP32 = by_wire_name("FP32")
INT8 = by_wire_name("INT8")
INT64 = by_wire_name("INT64")
UINT64 = by_wire_name("UINT64")
BOOL = by_wire_name("BOOL")
FP16 = by_wire_name("FP16")
BYTES = by_wire_name("BYTES")


def framed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def nested(depth: int) -> list[object]:
    value: list[object] = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


# -- JSON numeric data ----------------------------------------------------------------


def test_flat_json_numbers_become_an_array_of_the_input_type() -> None:
    array = json_numeric_data(FP32, [1, 2.5, -3], 3)
    assert array.dtype == np.float32
    assert array.tolist() == [1.0, 2.5, -3.0]


def test_nested_json_data_is_read_depth_first() -> None:
    assert json_numeric_data(INT64, [[1, 2], [3, [4]]], 4).tolist() == [1, 2, 3, 4]


def test_integers_are_cast_to_the_input_width_as_c_does() -> None:
    assert json_numeric_data(INT8, [300, -129], 2).tolist() == [44, 127]


def test_a_count_that_does_not_match_the_shape_is_a_malformed_request() -> None:
    with pytest.raises(MalformedRequestError, match="shape does not match true shape"):
        json_numeric_data(INT64, [1, 2], 3)
    with pytest.raises(MalformedRequestError, match="Shape does not match true shape of 'data' field"):
        json_numeric_data(INT64, [1, [2, 3]], 2)


@pytest.mark.parametrize(
    "dt, data, error",
    [
        (INT64, [1, "2"], "attempt to access JSON non-signed-integer as signed-integer"),
        (UINT64, [1, -1], "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (INT64, [1, 2**63], "attempt to access JSON non-signed-integer as signed-integer"),
        (BOOL, [True, 1], "attempt to access JSON non-boolean as boolean"),
        (FP32, [1.0, None], "attempt to access JSON non-number as double"),
    ],
    ids=["string-for-int", "negative-uint", "int-beyond-int64", "int-for-bool", "null-for-float"],
)
def test_a_value_of_the_wrong_json_type_names_triton_s_type_error(dt, data, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MalformedRequestError, match=error):
        json_numeric_data(dt, data, 2)


def test_json_data_nested_too_deep_is_refused_as_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match=r"nesting depth exceeds maximum allowed limit \(100\)"):
        json_numeric_data(INT64, nested(MAX_JSON_DEPTH), 1)
    assert json_numeric_data(INT64, nested(MAX_JSON_DEPTH - 1), 1).tolist() == [1]


# -- JSON BYTES data -------------------------------------------------------------------


def test_json_strings_become_utf8_bytes_at_any_nesting() -> None:
    assert json_bytes_data(["a", ["é", ["b"]]]) == [b"a", "é".encode(), b"b"]


def test_a_json_bytes_element_that_is_not_a_string_is_malformed() -> None:
    with pytest.raises(MalformedRequestError, match="non-string as string"):
        json_bytes_data(["a", 1])


# -- BYTES framing ---------------------------------------------------------------------


def parse(buffer: bytes, count: int, start: int = 0) -> list[bytes]:
    return parse_bytes_elements(buffer, start, len(buffer) - start, count,
                                input_name="TEXT", model_name="m", prefix="[request id: 7] ")


def test_length_prefixed_elements_are_split_in_order() -> None:
    assert parse(framed(b"ab", b"", b"xyz"), 3) == [b"ab", b"", b"xyz"]


def test_elements_are_read_from_the_given_start() -> None:
    assert parse(b"junk" + framed(b"ok"), 1, start=4) == [b"ok"]


def test_a_cut_length_prefix_is_refused_with_the_bytes_left() -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse(framed(b"ab") + b"\x01\x00", 2)
    assert caught.value.message == (
        "[request id: 7] incomplete string length indicator for inference input 'TEXT' for model 'm', "
        "expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator is in one buffer."
    )


def test_more_elements_than_the_shape_holds_are_refused_at_the_first_extra_one() -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse(framed(b"a", b"b", b"c"), 2)
    assert caught.value.message == (
        "[request id: 7] unexpected number of string elements 3 for inference input 'TEXT' for model 'm', expecting 2"
    )


def test_fewer_elements_than_the_shape_holds_are_refused() -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse(framed(b"a"), 2)
    assert caught.value.message == "[request id: 7] expected 2 string elements for inference input 'TEXT' for model 'm', got 1"


def test_an_element_longer_than_the_buffer_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="string element 1 of inference input 'TEXT' for model 'm' declares 9 bytes but only 2 bytes remain"):
        parse(struct.pack("<I", 9) + b"ab", 1)


# -- one input carried as JSON -----------------------------------------------------------


def test_a_json_input_is_converted_at_once_with_its_byte_size() -> None:
    item = json_input({"data": [1, 2, 3, 4]}, "X", FP32, (2, 2), "m", 1 << 20)
    assert (item.source, item.size) == (JSON, 16)
    assert to_array(item, "m", "").tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_a_shape_with_a_zero_dim_reads_no_data() -> None:
    item = json_input({}, "X", FP32, (0, 3), "m", 1 << 20)
    assert to_array(item, "m", "").shape == (0, 3)


def test_a_negative_dim_is_an_invalid_shape() -> None:
    with pytest.raises(InvalidInputError, match=r"shape \[2,-1\] contains one or more invalid dimensions"):
        json_input({"data": [1]}, "X", FP32, (2, -1), "m", 1 << 20)


def test_a_shape_whose_element_count_overflows_int64_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="causes total element count to exceed maximum size of 9223372036854775807"):
        json_input({"data": [1]}, "X", FP32, (2**62, 4), "m", 1 << 20)


def test_json_data_larger_than_the_limit_names_the_flag() -> None:
    with pytest.raises(InvalidInputError, match=r"byte_size \(40 bytes\) that exceeds the maximum allowed value of 39 bytes"):
        json_input({"data": list(range(10))}, "X", FP32, (10,), "m", 39)


def test_fp16_has_no_json_form() -> None:
    with pytest.raises(InvalidInputError, match="receiving FP16 data via JSON is not supported"):
        json_input({"data": [1.0]}, "X", FP16, (1,), "m", 1 << 20)


def test_json_data_that_is_not_a_list_is_malformed() -> None:
    with pytest.raises(MalformedRequestError, match="non-array as array"):
        json_input({"data": 1}, "X", FP32, (1,), "m", 1 << 20)


def test_json_bytes_count_against_the_shape_when_converted() -> None:
    item = json_input({"data": ["a", "b", "c"]}, "T", BYTES, (2,), "m", 1 << 20)
    assert item.size == 3 + 4 * 3
    with pytest.raises(InvalidInputError, match="unexpected number of string elements 3 for inference input 'T' for model 'm', expecting 2"):
        to_array(item, "m", "")


# -- binary inputs -------------------------------------------------------------------------


def test_a_binary_numeric_input_is_a_read_only_view_of_the_body() -> None:
    body = b"head" + np.arange(6, dtype="<i8").tobytes()
    item = WireInput("X", INT64, (2, 3), BINARY, body, 4, 48)
    array = to_array(item, "m", "")
    assert array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not array.flags.writeable
    assert view_spec(item) == ("X", (2, 3), np.dtype("<i8"), 4)
    assert body_views([view_spec(item)], body)["X"].tolist() == array.tolist()  # type: ignore[list-item]


def test_binary_bools_are_normalised_to_zero_and_one() -> None:
    item = WireInput("B", BOOL, (3,), BINARY, bytes([0, 7, 255]), 0, 3)
    assert to_array(item, "m", "").tolist() == [False, True, True]
    assert view_spec(item) is None  # normalised, not a plain view


def test_binary_bytes_are_split_into_an_object_array_of_the_shape() -> None:
    body = framed(b"a", b"bc", b"", b"d")
    item = WireInput("T", BYTES, (2, 2), BINARY, body, 0, len(body))
    array = to_array(item, "m", "")
    assert array.dtype == object
    assert array.tolist() == [[b"a", b"bc"], [b"", b"d"]]


def test_a_cached_plan_applies_to_a_new_body() -> None:
    item = WireInput("X", INT64, (1,), BINARY, np.array([1], "<i8").tobytes(), 0, 8)
    assert to_array(item, "m", "", body=np.array([9], "<i8").tobytes()).tolist() == [9]
