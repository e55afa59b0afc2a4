"""Tensors laid out in an arena block come back unchanged, as views on the block."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.datatypes import bfloat16_dtype
from nereid.frontends.layout import (
    layout_size, read_arrays, read_blocks, row_signature, rows_size, write_arrays, write_rows,
)


@pytest.mark.parametrize("arrays", [
    pytest.param({"x": np.arange(16, dtype=np.float32).reshape(1, 16)}, id="fp32"),
    pytest.param({"a": np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2], "b": np.ones((1, 3), np.float16)},
                 id="strided-and-fp16"),
    pytest.param({"empty": np.zeros((2, 0), np.int32), "flags": np.array([[True, False]])}, id="empty-and-bool"),
    pytest.param({"bf16": np.ones((1, 4), dtype=bfloat16_dtype())}, id="bfloat16"),
])
def test_arrays_come_back_unchanged_as_views_on_the_block(arrays: dict[str, np.ndarray]) -> None:
    region = memoryview(bytearray(4096))
    size = layout_size(arrays)
    assert size is not None and size % 64 == 0
    layout = write_arrays(region[128:128 + size], arrays)
    back = read_arrays(region, 128, layout)
    assert list(back) == list(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype
    first = next(iter(back.values()))
    if first.size:
        region[128] ^= 0xFF  # a view, not a copy
        assert not np.array_equal(first, arrays[next(iter(arrays))])


def test_object_arrays_cannot_be_laid_out() -> None:
    assert layout_size({"text": np.array([b"a", b"bc"], dtype=object)}) is None


def test_rows_of_several_parts_are_joined_and_read_back_in_order() -> None:
    parts = [
        {"y": np.arange(2 * 3, dtype=np.float32).reshape(2, 3), "n": np.array([[1], [2]], np.int64)},
        {"y": np.full((1, 3), 7, np.float32)[:, ::1], "n": np.array([[3]], np.int64)},
        {"y": np.arange(9, dtype=np.float32).reshape(3, 3)[:, ::-1], "n": np.array([[4], [5], [6]], np.int64)},
    ]
    joinable = [row_signature(part) for part in parts]
    assert all(item is not None and item[0] == joinable[0][0] for item in joinable)  # type: ignore[index]
    rows = sum(item[1] for item in joinable)  # type: ignore[index]
    assert rows == 6
    signature = joinable[0][0]  # type: ignore[index]
    size = rows_size(signature, rows)
    region = memoryview(bytearray(size + 64))
    layout = write_rows(region[64:64 + size], signature, rows, parts)
    joined = read_arrays(region, 64, layout)
    start = 0
    for part in parts:
        count = len(part["y"])
        for name, array in part.items():
            np.testing.assert_array_equal(joined[name][start:start + count], array)
        start += count


@pytest.mark.parametrize("arrays", [
    pytest.param({"scalar": np.float32(1.0) * np.ones(())}, id="scalar"),
    pytest.param({"text": np.array([b"a"], dtype=object)}, id="bytes"),
    pytest.param({"a": np.ones((2, 1)), "b": np.ones((3, 1))}, id="different-rows"),
])
def test_arrays_that_cannot_be_joined_by_rows_have_no_signature(arrays: dict[str, np.ndarray]) -> None:
    assert row_signature(arrays) is None


def test_evenly_spaced_blocks_come_back_as_views_of_one_strided_array_each() -> None:
    parts = [{"a": np.arange(6, dtype=np.int64).reshape(2, 3) + 10 * index, "b": np.full((1, 5), index, np.float16)}
             for index in range(4)]
    size = layout_size(parts[0])
    assert size is not None
    step = size + 64  # a gap between blocks: the step is what counts
    region = memoryview(bytearray(128 + 4 * step))
    layouts = {write_arrays(region[128 + index * step:128 + index * step + size], part)
               for index, part in enumerate(parts)}
    assert len(layouts) == 1
    back = read_blocks(region, 128, step, 4, layouts.pop())
    for part, arrays in zip(parts, back):
        assert list(arrays) == ["a", "b"]
        for name, array in part.items():
            np.testing.assert_array_equal(arrays[name], array)
            assert arrays[name].flags.c_contiguous
    region[128 + 3 * step] ^= 0xFF  # views, not copies
    assert back[3]["a"][0, 0] != 30


def test_one_array_per_block_reads_back_the_same() -> None:
    region = memoryview(bytearray(64 * 3))
    for index in range(3):
        write_arrays(region[64 * index:64 * index + 64], {"x": np.full((1, 4), index, np.float32)})
    back = read_blocks(region, 0, 64, 3, (("x", 0, "<f4", (1, 4)),))
    assert [float(arrays["x"][0, 0]) for arrays in back] == [0.0, 1.0, 2.0]
