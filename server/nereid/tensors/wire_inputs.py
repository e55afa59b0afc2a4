"""Input tensors on Triton's wire: JSON ``data`` and binary blobs -> numpy arrays.

Owns the element-level rules of the request side (protocol.md §2.3, §3.2): JSON
``data`` typing and nesting, BYTES length-prefix framing, and ``WireInput``, one input as
parsed from the wire (datatype, shape, where its bytes are) before the config checks
(``nereid.tensors.checks``). Knows nothing about request structure or HTTP headers.
``RegionLeaseOnDemand`` is what an infer exchange (HTTP's or gRPC's) holds of the
server's shared-memory regions: a lease taken only when the request names a region
(it lives here, not in ``nereid.tensors.shared_memory``, which a request without shared
memory never enters).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from nereid.datatypes import DataType
from nereid.errors import InvalidInputError, MalformedRequestError
from nereid.tensors.checks import dims_text

if TYPE_CHECKING:
    from nereid.tensors.shared_memory import RegionLease, SharedMemoryManager

__all__ = [
    "BINARY", "JSON", "SHM", "MAX_JSON_DEPTH", "RegionLeaseOnDemand",
    "ViewSpec", "WireInput", "body_views", "bytes_object_array",
    "json_bytes_data", "json_input", "json_numeric_data", "parse_bytes_elements", "to_array", "view_spec",
]

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
            raise _element_count_error(checked, count, input_name, model_name, prefix)
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
        raise _element_count_error(checked, count, input_name, model_name, prefix)
    return out


def _element_count_error(checked: int, count: int, input_name: str, model_name: str, prefix: str) -> InvalidInputError:
    """Triton's error for a BYTES input with more (``checked``: the first one too many) or
    fewer string elements than its shape's ``count``."""
    if checked > count:
        text = (f"{prefix}unexpected number of string elements {checked} for inference input '{input_name}' "
                f"for model '{model_name}', expecting {count}")
    else:
        text = (f"{prefix}expected {count} string elements for inference input '{input_name}' for model "
                f"'{model_name}', got {checked}")
    return InvalidInputError(text, model=model_name, input=input_name)


def bytes_object_array(elements: list[bytes], shape: Sequence[int]) -> NDArray[Any]:
    """An object array of ``bytes`` of ``shape`` (elements already counted to fit)."""
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    return arr.reshape(shape)



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


def _element_count(shape: tuple[int, ...], name: str, model_name: str) -> int:
    """Triton's GetElementCount, left to right: a negative dim is invalid, a zero dim makes
    the tensor empty, an int64 overflow is refused; [] counts as empty too. The running
    product never exceeds int64, so a hostile shape costs no big-integer arithmetic."""
    count = 0
    for dim in shape:
        if dim < 0:
            raise InvalidInputError(
                f"invalid shape for input '{name}': shape {dims_text(shape)} contains one or more invalid dimensions",
                model=model_name,
                input=name,
            )
        if dim == 0:
            return 0
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
    return count


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
    count = _element_count(shape, name, model_name)
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
                raise _element_count_error(checked, count, item.name, model_name, prefix)
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


class RegionLeaseOnDemand:
    """One request's use of the server's shared-memory ``regions``: a lease on them is
    taken by the first ``resolve_shm``/``write_shm`` and let go by ``release``.

    A base of the infer exchanges; each sets ``regions`` and ``lease = None`` in its own
    ``__init__`` (no extra call per request)."""

    __slots__ = ("regions", "lease")

    regions: SharedMemoryManager
    lease: RegionLease | None

    def resolve_shm(self, region: str, offset: int, byte_size: int) -> memoryview:
        """The part of a registered region the request reads (``ShmResolver``), pinned."""
        if self.lease is None:
            self.lease = self.regions.lease()
        return self.lease.resolve(region, offset, byte_size)

    def write_shm(self, region: str, offset: int, data: Any) -> None:
        """Write an output to a region the request named (pinned when it was parsed)."""
        if self.lease is None:
            self.lease = self.regions.lease()
        self.lease.write(region, offset, data)

    def release(self) -> None:
        """Let go of the regions the request used (if any)."""
        if self.lease is not None:
            self.lease.release()
