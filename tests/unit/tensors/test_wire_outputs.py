"""nereid.tensors.wire_outputs: a model's outputs -> Triton's wire forms (binary blobs,
BYTES framing, JSON ``data`` as Triton writes it) and the classification extension."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from nereid.datatypes import by_wire_name
from nereid.errors import InvalidInputError, ModelExecutionError
from nereid.tensors.wire_outputs import (
    BYTES,
    binary_blob,
    bytes_items,
    classify,
    copied_whole,
    json_output_data,
    output_array,
)

FP32 = by_wire_name("FP32")
FP64 = by_wire_name("FP64")
INT32 = by_wire_name("INT32")
BOOL = by_wire_name("BOOL")
FP16 = by_wire_name("FP16")


def joined(pieces: list[object]) -> bytes:
    return b"".join(pieces)  # type: ignore[arg-type]


# -- output_array ------------------------------------------------------------------------


def test_an_output_is_converted_to_its_config_datatype() -> None:
    array, dt = output_array("Y", [1, 2], FP32, "m")
    assert dt is FP32 and array.dtype == np.float32 and array.tolist() == [1.0, 2.0]


def test_an_output_absent_from_the_config_keeps_its_own_type() -> None:
    assert output_array("Y", np.zeros(2, np.int32), None, "m")[1] is INT32
    assert output_array("Y", np.array(["a"]), None, "m")[1] is BYTES


def test_an_output_whose_dtype_has_no_protocol_type_names_it() -> None:
    with pytest.raises(ModelExecutionError, match="output 'Y' of model 'm' has numpy dtype complex64, which has no protocol datatype"):
        output_array("Y", np.zeros(1, np.complex64), None, "m")


def test_an_output_that_cannot_be_converted_names_its_config_type() -> None:
    with pytest.raises(ModelExecutionError, match="cannot be converted to its config datatype FP32"):
        output_array("Y", np.array(["x"], dtype=object), FP32, "m")


# -- binary blobs --------------------------------------------------------------------------


def test_a_small_numeric_output_is_one_copy_of_its_bytes() -> None:
    array = np.arange(4, dtype="<f4")
    pieces, size = binary_blob(array, FP32, "Y", "m")
    assert (joined(pieces), size) == (array.tobytes(), 16)
    assert copied_whole(FP32, 16)


def test_a_large_contiguous_output_is_a_view_not_a_copy() -> None:
    array = np.arange(32 * 1024, dtype="<f4")  # 128 KiB
    pieces, size = binary_blob(array, FP32, "Y", "m")
    assert size == array.nbytes and not copied_whole(FP32, size)
    assert isinstance(pieces[0], memoryview) and joined(pieces) == array.tobytes()


def test_a_non_contiguous_large_output_comes_out_in_c_order() -> None:
    array = np.arange(2 * 32 * 1024, dtype="<f4").reshape(2, -1).T  # Fortran order
    pieces, size = binary_blob(array, FP32, "Y", "m")
    assert joined(pieces) == np.ascontiguousarray(array).tobytes() and size == array.nbytes


def test_an_empty_output_has_no_bytes() -> None:
    assert binary_blob(np.zeros((0, 3), np.float32), FP32, "Y", "m") == ([], 0)


def test_bytes_outputs_are_length_prefixed_and_str_is_utf8() -> None:
    array = np.array([b"ab", "é"], dtype=object)
    assert bytes_items(array) == [b"ab", "é".encode()]
    pieces, size = binary_blob(array, BYTES, "Y", "m")
    expected = struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "é".encode()
    assert (joined(pieces), size) == (expected, len(expected))


# -- JSON data -------------------------------------------------------------------------------


def test_json_floats_are_the_values_widened_to_double() -> None:
    value, raw = json_output_data(np.array([[0.1]], np.float32), FP32)
    assert raw is None and orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY) == b"[0.10000000149011612]"


def test_non_finite_floats_are_written_as_triton_s_tokens() -> None:
    value, raw = json_output_data(np.array([np.nan, np.inf, -np.inf, 1.5]), FP64)
    assert value is None and raw == b"[NaN,Infinity,-Infinity,1.5]"


def test_json_bools_are_normalised() -> None:
    value, raw = json_output_data(np.frombuffer(bytes([0, 2]), dtype=np.bool_), BOOL)
    assert raw is None and value.tolist() == [False, True]


def test_json_bytes_are_strings_when_valid_utf8_and_raw_text_otherwise() -> None:
    assert json_output_data(np.array([b"a\n"], dtype=object), BYTES) == (["a\n"], None)
    value, raw = json_output_data(np.array([b'\xff"\x01'], dtype=object), BYTES)
    assert value is None and raw == b'["\xff\\"\\u0001"]'


# -- classification --------------------------------------------------------------------------


def test_classification_gives_top_k_per_row_with_labels_and_ties_by_index() -> None:
    scores = np.array([[0.1, 0.7, 0.7, 0.2], [4.0, 3.0, 2.0, 1.0]], np.float32)
    out, shape = classify(scores, FP32, 2, True, ["a", "b"])
    assert shape == [2, 2]
    assert out == [b"0.700000:1:b", b"0.700000:2", b"4.000000:0:a", b"3.000000:1:b"]


def test_integer_classification_prints_integers_and_a_non_batching_output_is_one_row() -> None:
    out, shape = classify(np.array([3, 9, 1], np.int32), INT32, 5, False, None)
    assert (out, shape) == ([b"9:1", b"3:0", b"1:2"], [3])


def test_classification_of_an_unsupported_type_names_it() -> None:
    with pytest.raises(InvalidInputError, match="unsupported type 'FP16'"):
        classify(np.zeros(2, np.float16), FP16, 1, False, None)
