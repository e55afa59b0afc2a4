"""Tensor bytes and JSON values <-> numpy arrays, for the infer codec (codec.py).

Owns the element-level rules of Triton's wire format (JSON ``data`` typing and nesting,
BYTES length-prefix framing, JSON rendering of outputs, classification strings). Knows
nothing about request structure, model configs' batching rules or HTTP headers.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray

from nereid.datatypes import DATATYPES, DataType
from nereid.errors import InvalidInputError, MalformedRequestError, ModelExecutionError

__all__: list[str] = []  # private to nereid.http (codec.py is the only user)

_U32 = struct.Struct("<I")
_U64_LIMIT = 1 << 64
_I64_LIMIT = 1 << 63
#: Triton's HTTP_MAX_JSON_NESTING_DEPTH: a value at this depth (the data array is depth 0) fails.
MAX_JSON_DEPTH = 100
#: Triton's kMaxClassificationElements.
_MAX_CLASS_ELEMENTS = 1_000_000

_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_NUMBER = "attempt to access JSON non-number as double"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_ARRAY = "attempt to access JSON non-array as array"
_DEPTH_TEXT = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"

# Per element kind: (numpy dtype the JSON values are first collected in, allowed Python
# types of a JSON element, Triton's type error). Collecting in 64-bit first and casting
# afterwards reproduces Triton's C casts (ints truncate to width, doubles round to float).
_BOOL, _UINT, _INT, _FLOAT = 0, 1, 2, 3
_KIND_OF_KIND_CHAR = {"b": _BOOL, "u": _UINT, "i": _INT, "f": _FLOAT}
_COLLECT_DTYPE = {
    _BOOL: np.dtype(np.bool_),
    _UINT: np.dtype(np.uint64),
    _INT: np.dtype(np.int64),
    _FLOAT: np.dtype(np.float64),
}
_ALLOWED_TYPES: dict[int, frozenset[type]] = {
    _BOOL: frozenset((bool,)),
    _UINT: frozenset((int,)),
    _INT: frozenset((int,)),
    _FLOAT: frozenset((int, float)),
}
_TYPE_ERROR = {_BOOL: _NOT_BOOL, _UINT: _NOT_UINT, _INT: _NOT_INT, _FLOAT: _NOT_NUMBER}


# -- JSON input data --------------------------------------------------------------------


def json_numeric_data(dt: DataType, data: list[Any], count: int) -> NDArray[Any]:
    """Flat numpy array of ``count`` elements from an input's JSON ``data`` (any nesting).

    Mirrors Triton's ReadDataFromJson: depth-first, only the total count matters; type
    errors and count mismatches are 500s, nesting too deep is 400. ``dt`` is numeric and
    JSON-capable (FP16/BF16 are refused by the caller).
    """
    kind = _KIND_OF_KIND_CHAR[dt.numpy.kind]
    allowed = _ALLOWED_TYPES[kind]
    # Fast path: a flat list of exactly the right Python types, converted by numpy in one
    # call. Anything unusual (nesting, wrong types, out-of-range ints) takes the exact walk.
    if len(data) == count and set(map(type, data)) <= allowed:
        try:
            collected = np.array(data, dtype=_COLLECT_DTYPE[kind])
        except (OverflowError, ValueError, TypeError):
            pass
        else:
            return _cast(collected, dt)
    values = _walk_json_data(data, kind, count)
    try:
        collected = np.array(values, dtype=_COLLECT_DTYPE[kind])
    except OverflowError:  # an int too large for a double (stdlib-parsed bodies only)
        collected = np.array([_to_float(v) for v in values], dtype=np.float64)
    return _cast(collected, dt)


def _cast(collected: NDArray[Any], dt: DataType) -> NDArray[Any]:
    if collected.dtype == dt.numpy:
        return collected
    with np.errstate(over="ignore", invalid="ignore"):  # FP64 -> FP32 may overflow to inf, as in C
        return collected.astype(dt.numpy)


def _to_float(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _walk_json_data(data: list[Any], kind: int, count: int) -> list[Any]:
    """Triton's ReadDataFromJsonHelper, in order, raising its first error."""
    out: list[Any] = []
    allowed = _ALLOWED_TYPES[kind]

    def visit(value: Any, depth: int) -> None:
        if depth >= MAX_JSON_DEPTH:
            raise InvalidInputError("Unable to parse 'data': " + _DEPTH_TEXT)
        if type(value) is list:
            for element in value:
                visit(element, depth + 1)
            return
        if len(out) >= count:
            raise MalformedRequestError(
                "Unable to parse 'data': Shape does not match true shape of 'data' field"
            )
        if type(value) not in allowed or not _in_range(value, kind):
            raise MalformedRequestError("Unable to parse 'data': " + _TYPE_ERROR[kind])
        out.append(value)

    visit(data, 0)
    if len(out) != count:
        raise MalformedRequestError("Failed to parse 'data' field: shape does not match true shape")
    return out


def _in_range(value: Any, kind: int) -> bool:
    # rapidjson: IsUint64 / IsInt64 are false for integers outside those ranges (they
    # are parsed as doubles), so Triton reports them as type errors.
    if kind == _UINT:
        return bool(0 <= value < _U64_LIMIT)
    if kind == _INT:
        return bool(-_I64_LIMIT <= value < _I64_LIMIT)
    return True


def json_bytes_data(data: list[Any]) -> list[bytes]:
    """The elements of a BYTES input's JSON ``data`` (strings, any nesting) as UTF-8 bytes.

    Mirrors Triton's JsonBytesArrayByteSize: nesting too deep is 400, a non-string is 500.
    The element count is checked later, with the binary framing rules.
    """
    if set(map(type, data)) == {str}:
        return [s.encode("utf-8", "surrogatepass") for s in data]
    out: list[bytes] = []

    def visit(value: Any, depth: int) -> None:
        if depth >= MAX_JSON_DEPTH:
            raise InvalidInputError(_DEPTH_TEXT)
        if type(value) is list:
            for element in value:
                visit(element, depth + 1)
        elif type(value) is str:
            out.append(value.encode("utf-8", "surrogatepass"))
        else:
            raise MalformedRequestError("Unable to parse JSON bytes array: " + _NOT_STRING)

    visit(data, 0)
    return out


# -- BYTES framing -----------------------------------------------------------------------


def parse_bytes_elements(
    buffer: bytes, start: int, size: int, count: int, *, input_name: str, model_name: str, prefix: str
) -> list[bytes]:
    """Split ``buffer[start:start+size]`` into ``count`` <uint32 LE length><bytes> elements.

    Raises Triton's ValidateBytesInputs errors (400, each prefixed with ``prefix``, the
    ``[request id: ...] `` tag). The loop is bounded by the buffer, never by ``count``,
    so a hostile shape cannot make it spin.
    """
    out: list[bytes] = []
    append = out.append
    unpack = _U32.unpack_from
    pos = start
    end = start + size
    checked = 0
    while pos < end:
        if end - pos < 4:
            raise InvalidInputError(
                f"{prefix}incomplete string length indicator for inference input '{input_name}' for model "
                f"'{model_name}', expecting 4 bytes but only {end - pos} bytes available. Please make sure "
                "the string length indicator is in one buffer.",
                model=model_name,
                input=input_name,
            )
        (length,) = unpack(buffer, pos)
        checked += 1
        if checked > count:
            raise InvalidInputError(
                f"{prefix}unexpected number of string elements {checked} for inference input '{input_name}' "
                f"for model '{model_name}', expecting {count}",
                model=model_name,
                input=input_name,
            )
        pos += 4
        if length > end - pos:
            # Triton lets a last element run past the end of its buffer; we cannot hand
            # the model an element shorter than its declared length, so refuse it.
            raise InvalidInputError(
                f"{prefix}string element {checked} of inference input '{input_name}' for model "
                f"'{model_name}' declares {length} bytes but only {end - pos} bytes remain",
                model=model_name,
                input=input_name,
            )
        append(buffer[pos : pos + length])
        pos += length
    if checked != count:
        raise InvalidInputError(
            f"{prefix}expected {count} string elements for inference input '{input_name}' for model "
            f"'{model_name}', got {checked}",
            model=model_name,
            input=input_name,
        )
    return out


def bytes_object_array(elements: list[bytes], shape: Sequence[int]) -> NDArray[Any]:
    """An object array of ``bytes`` of ``shape`` (elements already counted to fit)."""
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr.reshape(shape)


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


# -- request inputs ----------------------------------------------------------------------

BINARY, JSON, SHM = 0, 1, 2


@dataclass(slots=True)
class WireInput:
    """One request input as parsed from the wire, before the core-style checks."""

    name: str
    dt: DataType
    shape: tuple[int, ...]  # int64 semantics: JSON uints >= 2**63 appear negative, as in Triton
    source: int  # BINARY | JSON | SHM
    buffer: Any = None  # body bytes (binary), shm view, or converted JSON values
    offset: int = 0
    size: int = 0
    #: some dim was sent as 2**63 or more (negative here), which no config dim can match.
    negative: bool = False


def dims_text(dims: Sequence[int]) -> str:
    """A shape as Triton prints it: ``[-1,16]``."""
    return "[" + ",".join(map(str, dims)) + "]"


def json_input(
    entry: dict[str, Any],
    name: str,
    dt: DataType,
    shape: tuple[int, ...],
    model_name: str,
    max_json_size: int,
    negative: bool = False,
) -> WireInput:
    """An input carried as JSON ``data``: converted right away (its size is bounded by the
    JSON header), checked against the shape's element count as Triton does."""
    # Triton's GetElementCount, left to right: a negative dim is invalid, a zero dim makes
    # the tensor empty, an int64 overflow is refused; [] counts as empty too. The running
    # product never exceeds int64, so a hostile shape costs no big-integer arithmetic.
    count = 0
    for dim in shape:
        if dim < 0:
            raise InvalidInputError(
                f"invalid shape for input '{name}': shape {dims_text(shape)} contains one or more invalid dimensions",
                model=model_name,
                input=name,
            )
        if dim == 0:
            count = 0
            break
        if count == 0:
            count = dim
        elif count > (_I64_LIMIT - 1) // dim:
            raise InvalidInputError(
                f"invalid shape for input '{name}': shape {dims_text(shape)} causes total element count to exceed "
                f"maximum size of {_I64_LIMIT - 1}",
                model=model_name,
                input=name,
            )
        else:
            count *= dim
    if count == 0:  # Triton reads no data for an empty tensor (nor for shape [])
        empty: Any = [] if dt.is_bytes else np.empty(0, dtype=dt.numpy)
        return WireInput(name, dt, shape, JSON, empty, 0, 0, negative)
    data = entry["data"]
    if type(data) is not list:
        raise MalformedRequestError("Unable to parse 'data': " + _NOT_ARRAY)
    if dt.is_bytes:
        elements = json_bytes_data(data)
        byte_size = sum(map(len, elements)) + 4 * len(elements)
    else:
        byte_size = count * dt.itemsize
    if byte_size > max_json_size:
        raise InvalidInputError(
            f"JSON input '{name}' has a byte_size ({byte_size} bytes) that exceeds the maximum allowed value of "
            f"{max_json_size} bytes. Use --http-max-input-size to increase the limit.",
            model=model_name,
            input=name,
        )
    if dt.is_bytes:
        return WireInput(name, dt, shape, JSON, elements, 0, byte_size)
    if not dt.json_allowed:
        raise InvalidInputError(
            f"receiving {dt.wire_name} data via JSON is not supported. Please use the binary data format for input {name}",
            model=model_name,
            input=name,
        )
    values = json_numeric_data(dt, data, count)
    return WireInput(name, dt, shape, JSON, values, 0, byte_size)


def to_array(item: WireInput, model_name: str, prefix: str, body: bytes | None = None) -> NDArray[Any]:
    """The numpy array the model receives for a checked input: a read-only view of the
    body for numeric binary data, bools normalised to 0/1, BYTES split into ``bytes``
    (framing errors raised here). ``body`` replaces ``item.buffer`` (a cached plan's
    binary input applied to a new request body)."""
    shape = item.shape
    dt = item.dt
    buffer = item.buffer if body is None else body
    if dt.is_bytes:
        count = math.prod(shape)
        if item.source == JSON:
            elements: list[bytes] = item.buffer
            if len(elements) != count:
                checked = count + 1 if len(elements) > count else len(elements)
                if len(elements) > count:
                    raise InvalidInputError(
                        f"{prefix}unexpected number of string elements {checked} for inference input "
                        f"'{item.name}' for model '{model_name}', expecting {count}",
                        model=model_name,
                        input=item.name,
                    )
                raise InvalidInputError(
                    f"{prefix}expected {count} string elements for inference input '{item.name}' for model "
                    f"'{model_name}', got {checked}",
                    model=model_name,
                    input=item.name,
                )
        else:
            source = buffer if item.source == BINARY else bytes(buffer)
            elements = parse_bytes_elements(
                source,
                item.offset,
                item.size,
                count,
                input_name=item.name,
                model_name=model_name,
                prefix=prefix,
            )
        return bytes_object_array(elements, shape)
    if item.source == JSON:
        values: NDArray[Any] = item.buffer
        return values.reshape(shape)
    if dt.wire_name == "BOOL":
        # perf_analyzer sends random bytes; numpy bools must be 0/1, so normalise.
        raw = np.frombuffer(buffer, dtype=np.uint8, count=item.size, offset=item.offset)
        return np.not_equal(raw, 0).reshape(shape)
    # np.ndarray(shape, dtype, buffer, offset): one call, a read-only view, no copy.
    return np.ndarray(shape, dt.numpy, buffer, item.offset)


#: How to make one input's array as a plain view of a body: (name, shape, numpy dtype, offset).
ViewSpec = tuple[str, tuple[int, ...], Any, int]


def view_spec(item: WireInput) -> ViewSpec | None:
    """How ``to_array`` makes ``item``'s array when that is a plain read-only view of the
    body (numeric binary data, not BOOL); None when it needs more (normalising, splitting)."""
    dt = item.dt
    if item.source != BINARY or dt.is_bytes or dt.wire_name == "BOOL":
        return None
    return item.name, item.shape, dt.numpy, item.offset


def body_views(views: Sequence[ViewSpec], body: bytes) -> dict[str, NDArray[Any]]:
    """The arrays of inputs already checked against a body of this length, each by its
    ``view_spec``, in that order: ``to_array``'s views without its per-datatype branches."""
    return {name: np.ndarray(shape, dtype, body, offset) for name, shape, dtype, offset in views}


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
