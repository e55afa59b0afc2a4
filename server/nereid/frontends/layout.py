"""Tensors in an arena block: written side by side by one process, read back as numpy
views (no copy) by the other, described by a small layout tuple.

A layout is ``((name, offset, dtype, shape), ...)``, offsets from the block's start,
each 64-byte aligned; the dtype is its text (``"<f4"``) where that names it back, else
the dtype itself (bfloat16's text, ``"<V2"``, would not). Knows nothing about requests or
HTTP.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["Layout", "layout_size", "read_arrays", "write_arrays"]

Layout = tuple[tuple[str, int, "str | np.dtype[Any]", tuple[int, ...]], ...]

_ALIGN = 64

#: how each dtype seen travels: its text, or itself when the text does not name it back
_SPELLING: dict[np.dtype[Any], str | np.dtype[Any]] = {}


def _spelling(dtype: np.dtype[Any]) -> str | np.dtype[Any]:
    spelling = _SPELLING.get(dtype)
    if spelling is None:
        spelling = _SPELLING[dtype] = dtype.str if np.dtype(dtype.str) == dtype else dtype
    return spelling


def layout_size(arrays: Mapping[str, np.ndarray]) -> int | None:
    """The bytes ``write_arrays`` needs for ``arrays``; None when one cannot be laid out
    (an object array: BYTES tensors travel another way)."""
    total = 0
    for array in arrays.values():
        if array.dtype.hasobject:
            return None
        total += (array.nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
    return total


def write_arrays(block: memoryview, arrays: Mapping[str, np.ndarray]) -> Layout:
    """Copy ``arrays`` into ``block`` (at least ``layout_size`` bytes) and describe them."""
    layout = []
    at = 0
    for name, array in arrays.items():
        size = array.nbytes
        if size:
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            block[at:at + size] = array.reshape(-1).view(np.uint8).data
        layout.append((name, at, _spelling(array.dtype), array.shape))
        at += (size + _ALIGN - 1) & ~(_ALIGN - 1)
    return tuple(layout)


def read_arrays(buffer: memoryview, offset: int, layout: Layout) -> dict[str, np.ndarray]:
    """Views of the arrays ``layout`` describes in the block at ``offset`` of ``buffer``."""
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset + at) for name, at, dtype, shape in layout}
