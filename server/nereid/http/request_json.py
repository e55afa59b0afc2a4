"""Reading an infer request's JSON header as Triton does (TritonJson over rapidjson):
the ``Inference-Header-Content-Length`` value, the JSON document (NaN/Infinity accepted),
the request ``parameters``, and TritonJson's type-error texts (protocol.md §4.2)."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from nereid.errors import InvalidInputError, MalformedRequestError
from nereid.inference import ParameterValue, SequenceFlags

__all__ = [
    "I64_LIMIT", "NOT_ARRAY", "NOT_BOOL", "NOT_STRING", "NOT_UINT", "NO_MEMBER", "U64_LIMIT",
    "is_uint", "load_json", "member_str", "parse_header_length", "request_parameters",
]

U64_LIMIT = 1 << 64
I64_LIMIT = 1 << 63
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

# TritonJson's error texts (§4.2); wrapped as "Unable to parse '<key>': <text>".
NO_MEMBER = "attempt to access non-existing object member '{}'"
NOT_ARRAY = "attempt to access JSON non-array as array"
NOT_STRING = "attempt to access JSON non-string as string"
NOT_BOOL = "attempt to access JSON non-boolean as boolean"
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"


_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?)0*([0-9]+)")


def parse_header_length(value: str, total: int) -> int:
    """Triton's GetInferenceHeaderLength: C++ ``std::stoi`` (leading blanks, sign, digit
    prefix) into int32, then ``0 <= H <= total``."""
    if value.isascii() and value.isdigit() and len(value) <= 10:
        length = int(value)
    else:
        match = _STOI.match(value)
        if match is None:
            raise InvalidInputError(f"Unable to parse Inference-Header-Content-Length, got: {value}")
        digits = match.group(2)
        length = int(digits) if len(digits) <= 11 else _I32_MAX + 1
        if match.group(1) == "-":
            length = -length
    if not _I32_MIN <= length <= _I32_MAX:
        raise InvalidInputError(
            "Unable to parse Inference-Header-Content-Length, value is out of range "
            f"[ {_I32_MIN}, {_I32_MAX} ], got: {value}"
        )
    if length < 0 or length > total:
        raise InvalidInputError(f"inference header size should be in range (0, {total}), got: {value}")
    return length


def load_json(body: bytes, length: int) -> Any:
    """Parse ``body[:length]`` without copying it. orjson first; bodies with NaN/Infinity
    tokens (which Triton's rapidjson accepts and orjson does not) go to the stdlib parser."""
    source: bytes | memoryview = body if length == len(body) else memoryview(body)[:length]
    try:
        return orjson.loads(source)
    except orjson.JSONDecodeError as exc:
        if body.find(b"NaN", 0, length) != -1 or body.find(b"Infinity", 0, length) != -1:
            fallback = _load_json_with_constants(body, length)
            if fallback is not _FAILED:
                return fallback
        raise MalformedRequestError(
            f"failed to parse the request JSON buffer: {_rapidjson_reason(exc)}"
        ) from None


_FAILED = object()


def _big_int(text: str) -> int | float:
    value = int(text)
    # rapidjson parses integers outside the 64-bit ranges as doubles.
    return value if -I64_LIMIT <= value < U64_LIMIT else float(text)


def _load_json_with_constants(body: bytes, length: int) -> Any:
    try:
        value = json.loads(body[:length].decode("utf-8"), parse_int=_big_int)
        orjson.dumps(value)  # rejects lone surrogates, as rapidjson's parser does
    except (ValueError, TypeError, RecursionError, orjson.JSONEncodeError):
        return _FAILED
    return value


def _rapidjson_reason(exc: orjson.JSONDecodeError) -> str:
    """rapidjson's wording for the errors clients can actually trigger; orjson's otherwise."""
    message = exc.msg
    if message.startswith(("Input is a zero-length", "input data is empty")):
        return f"The document is empty. at {exc.pos}"
    if message.startswith("unexpected content after document"):
        return f"The document root must not be followed by other values. at {exc.pos}"
    return f"{message} at {exc.pos}"


def is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < U64_LIMIT


def request_parameters(
    params: dict[str, Any], custom: dict[str, ParameterValue]
) -> tuple[int, int | None, bool, SequenceFlags | None]:
    """Triton's ParseJsonTritonParams: interpreted keys -> (priority, timeout, binary flag,
    sequence parameters); custom keys (str/int/bool/float) copied into ``custom``."""
    priority = 0
    timeout_us: int | None = None
    binary_data_output = False
    sequence: dict[str, Any] = {}
    for key, value in params.items():
        if key == "binary_data_output":
            if type(value) is not bool:
                raise MalformedRequestError("Unable to parse 'binary_data_output': " + NOT_BOOL)
            binary_data_output = value
        elif key == "priority":
            if not is_uint(value):
                raise MalformedRequestError("Unable to parse 'priority': " + NOT_UINT)
            priority = value
        elif key == "timeout":
            if not is_uint(value):
                raise MalformedRequestError("Unable to parse 'timeout': " + NOT_UINT)
            timeout_us = value
        elif key == "sequence_id":
            # a uint64, or a string (Triton's string correlation ids)
            if not is_uint(value) and type(value) is not str:
                raise MalformedRequestError("Unable to parse 'sequence_id': " + NOT_STRING)
            sequence["id"] = value
        elif key == "sequence_start" or key == "sequence_end":
            if type(value) is not bool:
                raise MalformedRequestError(f"Unable to parse '{key}': " + NOT_BOOL)
            sequence[key[len("sequence_"):]] = value
        elif key.startswith("triton_"):
            raise InvalidInputError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        else:
            if type(value) not in (str, int, bool, float):
                raise InvalidInputError(
                    f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                )
            if key != "headers":  # reserved by the parameters extension: never forwarded
                custom[key] = value
    return priority, timeout_us, binary_data_output, SequenceFlags(**sequence) if sequence else None


def member_str(obj: dict[str, Any], key: str) -> str:
    """``obj[key]`` as a string, else TritonJson's MemberAsString error (500)."""
    value = obj.get(key)
    if type(value) is not str:
        detail = NO_MEMBER.format(key) if key not in obj else NOT_STRING
        raise MalformedRequestError(f"Unable to parse '{key}': {detail}")
    return value
