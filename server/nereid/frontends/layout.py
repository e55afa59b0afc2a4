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

__all__ = [
    "Layout", "layout_size", "read_arrays", "read_blocks", "read_rows", "row_signature", "rows_size", "write_arrays",
    "write_rows",
]

Layout = tuple[tuple[str, int, "str | np.dtype[Any]", tuple[int, ...]], ...]

_ALIGN = 64
#: tensors up to this many bytes are copied through ``tobytes`` (one call) rather than
#: through a byte view of the array (three)
_SMALL = 4096

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
        if size <= _SMALL:
            # a small tensor's bytes object costs less than the views that avoid it
            block[at:at + size] = array.tobytes()
        else:
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            block[at:at + size] = array.reshape(-1).view(np.uint8).data
        layout.append((name, at, _spelling(array.dtype), array.shape))
        at += (size + _ALIGN - 1) & ~(_ALIGN - 1)
    return tuple(layout)


def read_arrays(buffer: memoryview, offset: int, layout: Layout) -> dict[str, np.ndarray]:
    """Views of the arrays ``layout`` describes in the block at ``offset`` of ``buffer``."""
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset + at) for name, at, dtype, shape in layout}


def read_blocks(buffer: memoryview, offset: int, step: int, count: int, layout: Layout) -> list[dict[str, np.ndarray]]:
    """``read_arrays`` for ``count`` blocks of one ``layout``, the first at ``offset`` and
    each ``step`` bytes after the one before: one strided array per name spans them all
    and each block's arrays are its items (indexing one costs a fifth of a new view on
    the buffer)."""
    columns = []
    for name, at, dtype, shape in layout:
        itemsize = np.dtype(dtype).itemsize
        strides = [itemsize] * len(shape)
        for axis in range(len(shape) - 1, 0, -1):
            strides[axis - 1] = strides[axis] * shape[axis]
        columns.append((name, np.ndarray((count, *shape), dtype, buffer=buffer, offset=offset + at,
                                         strides=(step, *strides))))
    if len(columns) == 1:
        name, column = columns[0]
        return [{name: array} for array in column]
    return [{name: column[index] for name, column in columns} for index in range(count)]


def read_rows(buffer: memoryview, offset: int, step: int, count: int, layout: Layout) -> dict[str, np.ndarray]:
    """The arrays of ``count`` blocks laid out as ``read_blocks`` reads them, joined along
    their first axis (each name's rows of every block one after the other), C-contiguous:
    views on the buffer when the blocks' rows lie back to back, else copies."""
    joined = {}
    for name, at, dtype, shape in layout:
        itemsize = np.dtype(dtype).itemsize
        strides = [itemsize] * len(shape)
        for axis in range(len(shape) - 1, 0, -1):
            strides[axis - 1] = strides[axis] * shape[axis]
        column = np.ndarray((count, *shape), dtype, buffer=buffer, offset=offset + at, strides=(step, *strides))
        rows = column.reshape((count * shape[0], *shape[1:]))  # a view where it can be one
        joined[name] = rows if rows.flags.c_contiguous else np.ascontiguousarray(rows)
    return joined


def row_signature(arrays: Mapping[str, np.ndarray]) -> tuple[tuple[Any, ...], int] | None:
    """What arrays must share to be laid out one after the other by ``write_rows`` (each
    one's name, dtype and shape past the first axis), and their rows (the first axis,
    the same for all); None when they cannot be (a scalar, an object array, arrays of
    different rows)."""
    if len(arrays) == 1:  # the common case, without the loop's list
        for name, array in arrays.items():
            if array.ndim == 0 or array.dtype.hasobject:
                return None
            return ((name, array.dtype, array.shape[1:]),), array.shape[0]
    signature = []
    rows = -1
    for name, array in arrays.items():
        if array.ndim == 0 or array.dtype.hasobject or (rows >= 0 and array.shape[0] != rows):
            return None
        rows = array.shape[0]
        signature.append((name, array.dtype, array.shape[1:]))
    return tuple(signature), rows


def rows_size(signature: tuple[Any, ...], rows: int) -> int:
    """The bytes ``write_rows`` needs for ``rows`` rows of arrays of ``signature``."""
    total = 0
    for _, dtype, shape in signature:
        size = rows * dtype.itemsize
        for extent in shape:
            size *= extent
        total += (size + _ALIGN - 1) & ~(_ALIGN - 1)
    return total


def write_rows(block: memoryview, signature: tuple[Any, ...], rows: int, parts: list[Mapping[str, np.ndarray]]) -> Layout:
    """Copy each array of ``parts`` (all of ``signature``, ``rows`` rows in all) into
    ``block`` (``rows_size`` bytes), the parts' rows of one name one after the other, and
    describe the joined arrays (``read_arrays`` reads them back)."""
    layout = []
    at = 0
    for name, dtype, shape in signature:
        full = (rows, *shape)
        joined = np.ndarray(full, dtype, buffer=block, offset=at)
        if len(parts) == 1:
            joined[...] = parts[0][name]
        else:
            np.concatenate([part[name] for part in parts], out=joined)
        layout.append((name, at, _spelling(dtype), full))
        at += (joined.nbytes + _ALIGN - 1) & ~(_ALIGN - 1)
    return tuple(layout)
