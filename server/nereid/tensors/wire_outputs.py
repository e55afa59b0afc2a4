"""Output tensors on Triton's wire: numpy arrays -> binary blobs and JSON ``data``.

Owns the element-level rules of the response side (protocol.md §2.5, §3.3): an output's
array and datatype, its binary blob (BYTES length-prefixed), its JSON rendering
(NaN/Infinity and invalid UTF-8 written by hand as Triton does), and classification
strings. Knows nothing about response structure or HTTP headers.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from nereid.datatypes import DATATYPES, DataType
from nereid.errors import InvalidInputError, ModelExecutionError
from nereid.tensors.wire_inputs import bytes_object_array

__all__ = ["BYTES", "binary_blob", "bytes_items", "bytes_object_array", "classify", "copied_whole", "json_output_data", "output_array"]

_U32 = struct.Struct("<I")
#: Triton's kMaxClassificationElements.
_MAX_CLASS_ELEMENTS = 1_000_000


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8", "surrogatepass")


def bytes_items(arr: NDArray[Any]) -> list[bytes]:
    """The elements of a BYTES output as ``bytes`` (str encoded as UTF-8, like tritonclient)."""
    items: list[Any] = arr.reshape(-1).tolist()
    if set(map(type, items)) <= {bytes}:
        return items
    return [_as_bytes(item) for item in items]


def serialize_bytes(items: list[bytes], output_name: str, model_name: str) -> tuple[list[bytes], int]:
    """The length-prefixed pieces of a BYTES tensor (to be joined once) and their total size."""
    lengths = list(map(len, items))
    try:
        prefixes = list(map(_U32.pack, lengths))
    except struct.error:
        raise ModelExecutionError(
            f"output '{output_name}' of model '{model_name}' has a BYTES element of 4 GiB or more, "
            "which the protocol's uint32 length prefix cannot carry",
            model=model_name,
        ) from None
    pieces: list[bytes] = [b""] * (2 * len(items))
    pieces[0::2] = prefixes
    pieces[1::2] = items
    return pieces, sum(lengths) + 4 * len(items)


# -- response outputs --------------------------------------------------------------------

_BY_NUMPY = {dt.numpy: dt for dt in DATATYPES}
BYTES: DataType = next(dt for dt in DATATYPES if dt.is_bytes)


def output_array(
    name: str, value: Any, configured: DataType | None, model_name: str
) -> tuple[NDArray[Any], DataType]:
    """An output as a numpy array of its config datatype ``configured`` (None for an output
    absent from the config: it keeps the array's own type)."""
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if configured is None:
        found = _BY_NUMPY.get(arr.dtype) or (BYTES if arr.dtype.kind in "OSU" else None)
        if found is None:
            raise ModelExecutionError(
                f"output '{name}' of model '{model_name}' has numpy dtype {arr.dtype}, which has no protocol datatype",
                model=model_name,
            )
        dt = found
    else:
        dt = configured
    if arr.dtype is not dt.numpy and arr.dtype != dt.numpy:
        try:
            arr = arr.astype(dt.numpy)
        except (TypeError, ValueError) as exc:
            raise ModelExecutionError(
                f"output '{name}' of model '{model_name}' has numpy dtype {arr.dtype}, which cannot be converted "
                f"to its config datatype {dt.wire_name}: {exc}",
                model=model_name,
            ) from None
    return arr, dt


#: Outputs up to this many bytes are copied once with ``tobytes`` instead of viewed.
_COPY_BELOW = 64 * 1024


def copied_whole(dt: DataType, size: int) -> bool:
    """Whether ``binary_blob`` gives an output of this numeric datatype and byte size as
    one ``tobytes`` copy (what a caller that knows both may do itself)."""
    return not dt.is_bytes and dt.numpy.kind != "V" and 0 < size <= _COPY_BELOW


def binary_blob(arr: NDArray[Any], dt: DataType, name: str, model_name: str) -> tuple[list[Any], int]:
    """An output's binary form as buffers to be joined once, and its size in bytes. Large
    contiguous numeric outputs are a byte view of the array (no copy before the join)."""
    if dt.is_bytes:
        return serialize_bytes(bytes_items(arr), name, model_name)
    size = arr.nbytes
    if not size:
        return [], 0
    if dt.numpy.kind != "V":
        if size <= _COPY_BELOW:  # (copied_whole tells callers when)
            # Small outputs: one copy is cheaper than exporting the array's buffer twice
            # (arr.data, then bytes.join), which costs more than the bytes themselves.
            return [arr.tobytes()], size
        if arr.flags.c_contiguous:
            return [arr.data], size  # bytes.join reads any C-contiguous buffer
    # Non-contiguous arrays are copied once; ml_dtypes types (BF16) export no buffer
    # format, so they go out as a byte view.
    return [np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data], size


# -- JSON output data --------------------------------------------------------------------

_CONTROL = re.compile(rb'[\x00-\x1f"\\]')
_SHORT_ESCAPES = {
    0x08: b"\\b",
    0x09: b"\\t",
    0x0A: b"\\n",
    0x0C: b"\\f",
    0x0D: b"\\r",
    0x22: b'\\"',
    0x5C: b"\\\\",
}


def _escape_raw(match: re.Match[bytes]) -> bytes:
    code = match.group()[0]
    return _SHORT_ESCAPES.get(code) or b"\\u%04x" % code


def _raw_json_string(item: bytes) -> bytes:
    """A JSON string of raw bytes, as rapidjson writes it: only quote, backslash and control
    characters escaped, bytes >= 0x80 copied (so invalid UTF-8 stays invalid, as in Triton)."""
    return b'"' + _CONTROL.sub(_escape_raw, item) + b'"'


def _float_token(value: float) -> bytes:
    if math.isnan(value):
        return b"NaN"
    if value == float("inf"):
        return b"Infinity"
    if value == float("-inf"):
        return b"-Infinity"
    return orjson.dumps(value)


def json_output_data(arr: NDArray[Any], dt: DataType) -> tuple[Any, bytes | None]:
    """An output's flat JSON ``data``: ``(value, None)`` for orjson (numpy arrays are
    serialised natively), or ``(None, raw)`` with ready-made JSON text when orjson cannot
    write it as Triton does (NaN/Infinity tokens; BYTES that are not valid UTF-8).

    The caller refuses FP16/BF16 beforehand.
    """
    kind = dt.numpy.kind
    if dt.is_bytes:
        items = bytes_items(arr)
        try:
            return [item.decode("utf-8") for item in items], None
        except UnicodeDecodeError:
            # Triton copies the raw bytes into its JSON; tritonclient then fails to decode
            # the response and suggests binary_data=True. Do exactly the same.
            return None, b"[" + b",".join(_raw_json_string(item) for item in items) + b"]"
    if kind == "f":
        # JSON floats are the value widened to double (FP32 0.1 -> 0.10000000149011612).
        flat = np.ascontiguousarray(arr, dtype=np.float64).reshape(-1)
        if bool(np.isfinite(flat).all()):
            return flat, None
        return None, b"[" + b",".join(map(_float_token, flat.tolist())) + b"]"
    if kind == "b":
        return np.not_equal(np.ascontiguousarray(arr).reshape(-1).view(np.uint8), 0), None
    return np.ascontiguousarray(arr).reshape(-1), None


# -- classification ----------------------------------------------------------------------

_CLASSIFIABLE = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
)


def classify(
    arr: NDArray[Any], dt: DataType, top_k: int, batching: bool, labels: Sequence[str] | None
) -> tuple[list[bytes], list[int]]:
    """Triton's classification extension: top-``top_k`` ``"value:index[:label]"`` strings
    per batch row (sorted by descending value) and the resulting BYTES shape.

    Values print like C++ ``std::to_string``: ``%f`` for FP32/FP64, plain integers
    otherwise. Ties keep the lower index first.
    """
    if dt.wire_name not in _CLASSIFIABLE:
        raise InvalidInputError(
            f"class result not available for output due to unsupported type '{dt.wire_name}'"
        )
    if batching and arr.ndim > 0:
        batch = int(arr.shape[0])
        per_row = int(np.prod(arr.shape[1:], dtype=np.int64))
        rows = arr.reshape(batch, per_row)
    else:
        batch = 0
        per_row = int(arr.size)
        rows = arr.reshape(1, per_row)
    if per_row > _MAX_CLASS_ELEMENTS:
        raise InvalidInputError("classification output tensor too large")
    k = min(top_k, per_row)
    is_float = dt.numpy.kind == "f"
    n_labels = len(labels) if labels is not None else 0
    out: list[bytes] = []
    for row in rows:
        # Stable descending order: ascending stable sort of the reversed row, reversed.
        order = (per_row - 1) - np.argsort(row[::-1], kind="stable")[::-1][:k]
        values = row[order].tolist()
        for index, value in zip(order.tolist(), values):
            text = (f"{value:f}" if is_float else str(int(value))) + ":" + str(index)
            if index < n_labels:
                assert labels is not None
                text += ":" + labels[index]
            out.append(text.encode("utf-8", "surrogatepass"))
    shape = [batch, k] if batch > 0 else [k]
    if batching and batch == 0 and arr.ndim > 0:
        shape = [0, k]
        out = []
    return out, shape
