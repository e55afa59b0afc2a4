"""Tensors laid out in an arena block come back unchanged, as views on the block."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.datatypes import bfloat16_dtype
from nereid.frontends.layout import layout_size, read_arrays, write_arrays


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
