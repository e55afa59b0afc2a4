"""KServe v2 JSON and Triton's binary-tensor extension -> InferRequest.

Owns the request bytes of an infer call (protocol.md §2-§3): body decompression, the JSON
header and its blobs, every check of a request against its model config, and the per-model
``ModelCodec`` (lookup tables, memos). Pure functions: no Starlette, no sockets, no
queues; the response side is ``infer_response.py``; element-level tensor rules live in
``_tensors.py``.

Messages follow Triton's texts (§4.2) so clients and scripts see what they would see
from tritonserver; checks run in Triton's order (HTTP parsing first, then the core's
validation of names, counts, batch size, datatype, shape and byte size).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from numpy.typing import NDArray

from nereid.config.schema import ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import DATATYPES, DataType, by_wire_name
from nereid.errors import (
    InvalidInputError,
    MalformedRequestError,
    ModelNotFoundError,
    NereidError,
    UnsupportedError,
)
from nereid.http import _tensors
from nereid.inference import InferRequest, ParameterValue, RequestedOutput

__all__ = ["ModelCodec", "ShmResolver", "decode_body", "error_body", "parse_infer_request", "parse_planned"]

#: ``resolve_shm(region, offset, byte_size)`` -> a view of that part of a registered
#: region. It raises KeyError (-> 404) for an unknown region, a NereidError for bad bounds.
ShmResolver = Callable[[str, int, int], memoryview]

_U64_LIMIT = 1 << 64
_I64_LIMIT = 1 << 63
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


# TritonJson's error texts (§4.2); wrapped as "Unable to parse '<key>': <text>".
_NO_MEMBER = "attempt to access non-existing object member '{}'"
_NOT_ARRAY = "attempt to access JSON non-array as array"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"

_SHAPE_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


# -- body encoding -----------------------------------------------------------------------


def decode_body(body: bytes, content_encoding: str | None, *, max_size: int) -> bytes:
    """The request body after ``Content-Encoding`` (§3.8).

    ``identity``, empty or None: returned as is. ``gzip`` / ``deflate`` (exact, case
    sensitive, as Triton): inflated with zlib/gzip auto-detection, streaming, never past
    ``max_size`` bytes (a zip bomb costs at most ``max_size + 1`` bytes). Anything else:
    UnsupportedError "Unsupported compression type" (the HTTP layer adds Triton's
    ``Accept-Encoding: gzip, deflate`` header).
    """
    if not content_encoding or content_encoding == "identity":
        return body
    if content_encoding != "gzip" and content_encoding != "deflate":
        raise UnsupportedError("Unsupported compression type")
    if not body:
        raise InvalidInputError(
            f"request body with Content-Encoding '{content_encoding}' is empty: nothing to be decompressed"
        )
    inflater = zlib.decompressobj(47)  # 32 + 15: accept both zlib and gzip framing
    try:
        out = inflater.decompress(body, max_size + 1)
    except zlib.error as exc:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': {exc}"
        ) from None
    if len(out) > max_size:
        raise InvalidInputError(
            f"request body of more than {max_size} bytes exceeds the maximum allowed size "
            f"({max_size} bytes, --max-request-size)"
        )
    if not inflater.eof:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': "
            "the compressed data is truncated"
        )
    if inflater.unused_data:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': "
            f"{len(inflater.unused_data)} unexpected bytes after the end of the compressed data"
        )
    return out


def error_body(message: str) -> bytes:
    """Triton's compact error body, ``{"error":"<message>"}``."""
    try:
        return orjson.dumps({"error": message})
    except TypeError:  # lone surrogates (only from stdlib-parsed names): make it valid UTF-8
        return orjson.dumps({"error": message.encode("utf-8", "replace").decode("utf-8")})


# -- per-config lookup tables ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ModelCodec:
    """What the codec needs from one ModelConfig, precomputed once, plus its memo of
    recently seen request headers. The HTTP layer keeps one per served model version
    (``ModelCodec.for_config``) and passes it as ``config``; a plain ModelConfig works too
    (a fresh ModelCodec per call, without the memo's benefit)."""

    config: ModelConfig
    inputs: Mapping[str, ModelInput]
    outputs: Mapping[str, ModelOutput]
    output_types: Mapping[str, DataType]
    required_inputs: int
    required_names: tuple[str, ...]
    batching: bool
    #: shared RequestedOutput records (see _requested); mutable, like ``plans``.
    requested: dict[tuple[str, bool, int], RequestedOutput]
    #: parse results of recent JSON headers (see _Plan), keyed by (header, body length, limit).
    plans: dict[tuple[bytes, int, int], _Plan]
    #: keys parsed once, not yet planned.
    seen: set[tuple[bytes, int, int]]
    #: response JSON headers of recent all-binary answers: infer_response.py's memo.
    replies: dict[tuple[Any, ...], Any]

    @classmethod
    def for_config(cls, config: ModelConfig) -> ModelCodec:
        return cls(
            config=config,
            inputs={tensor.name: tensor for tensor in config.input},
            outputs={tensor.name: tensor for tensor in config.output},
            output_types={tensor.name: tensor.data_type for tensor in config.output},
            required_inputs=sum(1 for tensor in config.input if not tensor.optional),
            required_names=tuple(tensor.name for tensor in config.input if not tensor.optional),
            batching=config.max_batch_size > 0,
            requested={},
            plans={},
            seen=set(),
            replies={},
        )

    @classmethod
    def of(cls, config: ModelConfig | ModelCodec) -> ModelCodec:
        """``config`` itself when it is a ModelCodec, else a fresh one (no memo)."""
        return config if isinstance(config, ModelCodec) else cls.for_config(config)


@dataclasses.dataclass(slots=True)  # not frozen: a frozen init costs more than the fields
class _Plan:
    """Everything a successful parse decided from one JSON header and the body's length.

    Clients repeat the same header for every request (perf_analyzer's sync mode sends an
    empty id, tritonclient none): a repeat only needs its arrays made from the new body.
    Only requests whose inputs are all binary blobs and whose outputs use no shared
    memory get a plan, so nothing in it depends on the body beyond its length, except
    BYTES framing, which is re-checked every time.
    """

    request_id: str
    prefix: str
    parameters: dict[str, ParameterValue]
    priority: int
    timeout_us: int | None
    binary_data_output: bool
    outputs: tuple[RequestedOutput, ...] | None
    rows: int
    #: the inputs in Triton's check order (by name); buffer unset.
    checks: tuple[_tensors.WireInput, ...]
    #: names in request order, when it differs from ``checks``.
    order: tuple[str, ...] | None
    #: every input's _tensors.view_spec in request order, when each is a plain view of the
    #: body (numeric, not BOOL): nothing to check or convert.
    views: tuple[_tensors.ViewSpec, ...] | None




def _check_representable(shape: tuple[int, ...], dt: DataType, name: str, model_name: str) -> None:
    """Refuse a shape no array can have: the non-zero dims times the element size must fit
    in int64 even when another dim is 0 (numpy checks that, and so would any buffer)."""
    size = max(dt.itemsize, 1)
    for dim in shape:
        if dim > 1:
            if size > (_I64_LIMIT - 1) // dim:
                raise InvalidInputError(
                    f"invalid shape for input '{name}': shape {list(shape)} causes total element count to exceed "
                    f"maximum size of {_I64_LIMIT - 1} (model '{model_name}')",
                    model=model_name,
                    input=name,
                )
            size *= dim


# -- request parsing ---------------------------------------------------------------------


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    *,
    config: ModelConfig | ModelCodec,
    model_name: str,
    model_version: int | None,
    max_json_size: int = 64 << 20,
    resolve_shm: ShmResolver | None = None,
) -> InferRequest:
    """An infer body (already decompressed) -> a validated InferRequest.

    ``header_length`` is the raw ``Inference-Header-Content-Length`` header (None when
    absent; "0" means a raw binary request, §3.4). ``max_json_size`` is tritonserver's
    ``--http-max-input-size``: the limit on the JSON header, on each JSON-decoded input
    and on a raw input. Numeric binary inputs are read-only numpy views on ``body``.

    Raises only NereidError subclasses: InvalidInputError (400), MalformedRequestError
    (500, JSON/type errors as in Triton), ModelNotFoundError (404, unknown shm region).
    """
    try:
        return _parse(body, header_length, config, model_name, model_version, max_json_size, resolve_shm)
    except NereidError:
        raise
    except Exception as exc:  # last resort: every real check above raises a NereidError
        raise MalformedRequestError(
            f"failed to parse the inference request for model '{model_name}': "
            f"unexpected {type(exc).__name__}: {exc}"
        ) from exc


def parse_planned(
    body: bytes, header_length: str | None, spec: ModelCodec, model_name: str, model_version: int | None,
    max_json_size: int,
) -> InferRequest | None:
    """``parse_infer_request`` for a body whose JSON header repeats a planned one (see
    _Plan) and whose inputs are plain views of it: the same InferRequest, reached in
    fewer steps (this is most requests of a steady client). None for anything else,
    which ``parse_infer_request`` then parses (and reports, if it is bad)."""
    if header_length is None or not (header_length.isdigit() and header_length.isascii() and len(header_length) <= 10):
        return None
    json_length = int(header_length)
    total = len(body)
    if not 0 < json_length <= min(total, max_json_size, _PLAN_MAX_HEADER):
        return None
    plan = spec.plans.get((body[:json_length], total, max_json_size))
    if plan is None or plan.views is None:
        return None
    return _apply_plan(plan, body, model_name, model_version)  # views only: nothing to check or raise


def _parse(
    body: bytes,
    header_length: str | None,
    config: ModelConfig | ModelCodec,
    model_name: str,
    model_version: int | None,
    max_json_size: int,
    resolve_shm: ShmResolver | None,
) -> InferRequest:
    spec = ModelCodec.of(config)
    config = spec.config
    total = len(body)
    json_length = total if header_length is None else _parse_header_length(header_length, total)
    if json_length == 0:
        return _parse_raw(body, spec, model_name, model_version, max_json_size)
    if json_length > max_json_size:
        raise InvalidInputError(
            f"request JSON size of {json_length} bytes exceeds the maximum allowed input size of "
            f"{max_json_size} bytes. Use --http-max-input-size to increase the limit."
        )
    plan_key = None
    if json_length <= _PLAN_MAX_HEADER:
        plan_key = (body[:json_length], total, max_json_size)
        plan = spec.plans.get(plan_key)
        if plan is not None:
            return _apply_plan(plan, body, model_name, model_version)
    root = _load_json(body, json_length)
    if not isinstance(root, dict):
        root = {}  # TritonJson: a non-object has no members, so 'inputs' is "non-existing"

    request_id = root.get("id", "")
    if type(request_id) is not str:
        raise MalformedRequestError("Unable to parse 'id': " + _NOT_STRING)
    prefix = f"[request id: {request_id or '<id_unknown>'}] "

    params = root.get("parameters")
    priority = 0
    timeout_us: int | None = None
    binary_data_output = False
    custom: dict[str, ParameterValue] = {}
    if params is not None:
        if type(params) is not dict:
            raise MalformedRequestError("failed to get request params.: attempt to get members for non-object")
        if params:
            priority, timeout_us, binary_data_output = _request_parameters(params, custom)

    inputs_json = root.get("inputs")
    if type(inputs_json) is not list:
        detail = _NO_MEMBER.format("inputs") if inputs_json is None and "inputs" not in root else _NOT_ARRAY
        raise MalformedRequestError("Unable to parse 'inputs': " + detail)

    parsed: dict[str, _tensors.WireInput] = {}
    offset = json_length
    for entry in inputs_json:
        item = _parse_input(entry, body, offset, parsed, model_name, max_json_size, prefix, resolve_shm)
        parsed[item.name] = item
        if item.source == _tensors.BINARY:
            offset += item.size
    if offset != total:
        raise InvalidInputError(f"unexpected additional input data for model '{model_name}'", model=model_name)

    outputs: tuple[RequestedOutput, ...] | None = None
    if "outputs" in root:
        outputs = _parse_outputs(root["outputs"], spec, prefix, model_name, resolve_shm)
        for out in outputs:
            if out.name not in spec.outputs:
                # Triton checks the requested names in sorted order: report the first.
                name = min(o.name for o in outputs if o.name not in spec.outputs)
                raise InvalidInputError(
                    f"unexpected inference output '{name}' for model '{model_name}'", model=model_name
                )

    arrays, rows = _validate_inputs(parsed, spec, model_name, prefix)
    if plan_key is not None:
        # Plan a header the second time it is seen: a header seen once (a per-request id,
        # as perf_analyzer's async mode sends) only costs a set entry.
        seen = spec.seen
        if plan_key not in seen:
            if len(seen) >= _PLAN_CACHE_SIZE:
                seen.clear()  # unique headers must not pile up
            seen.add(plan_key)
        elif _plannable(parsed, outputs):
            _remember(
                spec,
                plan_key,
                parsed,
                request_id,
                prefix,
                custom,
                priority,
                timeout_us,
                binary_data_output,
                outputs,
                rows,
            )
    return InferRequest(
        model_name=model_name,
        inputs=arrays,
        rows=rows,
        id=request_id,
        model_version=model_version,
        outputs=outputs,
        parameters=custom,
        priority=priority,
        timeout_us=timeout_us,
        binary_data_output=binary_data_output,
    )


#: headers longer than this (JSON data, usually) are parsed every time, not planned.
_PLAN_MAX_HEADER = 4096
_PLAN_CACHE_SIZE = 256


def _plannable(parsed: Mapping[str, _tensors.WireInput], outputs: tuple[RequestedOutput, ...] | None) -> bool:
    for item in parsed.values():
        if item.source != _tensors.BINARY:
            return False
    return outputs is None or all(out.shm_region is None for out in outputs)


def _remember(
    spec: ModelCodec,
    key: tuple[bytes, int, int],
    parsed: Mapping[str, _tensors.WireInput],
    request_id: str,
    prefix: str,
    custom: dict[str, ParameterValue],
    priority: int,
    timeout_us: int | None,
    binary_data_output: bool,
    outputs: tuple[RequestedOutput, ...] | None,
    rows: int,
) -> None:
    """Store the plan of a successful parse (see _Plan)."""
    # The plan must not keep this body alive: its inputs carry no buffer.
    checks = tuple(
        _tensors.WireInput(
            item.name, item.dt, item.shape, item.source, None, item.offset, item.size, item.negative
        )
        for item in (parsed[name] for name in sorted(parsed))
    )
    order = tuple(parsed) if len(parsed) > 1 else None
    views: tuple[_tensors.ViewSpec, ...] | None = None
    specs = [_tensors.view_spec(item) for item in parsed.values()]
    if all(spec is not None for spec in specs):
        views = tuple(spec for spec in specs if spec is not None)
    plan = _Plan(
        request_id, prefix, dict(custom), priority, timeout_us, binary_data_output, outputs, rows, checks, order,
        views,
    )
    if len(spec.plans) >= _PLAN_CACHE_SIZE:
        spec.plans.clear()
    spec.plans[key] = plan


def _apply_plan(plan: _Plan, body: bytes, model_name: str, model_version: int | None) -> InferRequest:
    """A repeat of a planned header: only the arrays are new (views of this body)."""
    if plan.views is not None:
        arrays = _tensors.body_views(plan.views, body)
    else:
        arrays = {item.name: _tensors.to_array(item, model_name, plan.prefix, body) for item in plan.checks}
        if plan.order is not None:
            arrays = {name: arrays[name] for name in plan.order}
    # InferRequest's fields in order (positional: this runs once per request)
    return InferRequest(
        model_name, arrays, plan.rows, plan.request_id, model_version, plan.outputs,
        dict(plan.parameters) if plan.parameters else {}, plan.priority, plan.timeout_us, plan.binary_data_output,
    )


_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?)0*([0-9]+)")


def _parse_header_length(value: str, total: int) -> int:
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


def _load_json(body: bytes, length: int) -> Any:
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
    return value if -_I64_LIMIT <= value < _U64_LIMIT else float(text)


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


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64_LIMIT


def _request_parameters(
    params: dict[str, Any], custom: dict[str, ParameterValue]
) -> tuple[int, int | None, bool]:
    """Triton's ParseJsonTritonParams: interpreted keys -> (priority, timeout, binary flag);
    custom keys (str/int/bool/float) copied into ``custom``."""
    priority = 0
    timeout_us: int | None = None
    binary_data_output = False
    for key, value in params.items():
        if key == "binary_data_output":
            if type(value) is not bool:
                raise MalformedRequestError("Unable to parse 'binary_data_output': " + _NOT_BOOL)
            binary_data_output = value
        elif key == "priority":
            if not _is_uint(value):
                raise MalformedRequestError("Unable to parse 'priority': " + _NOT_UINT)
            priority = value
        elif key == "timeout":
            if not _is_uint(value):
                raise MalformedRequestError("Unable to parse 'timeout': " + _NOT_UINT)
            timeout_us = value
        elif key == "sequence_id":
            # Accepted and ignored: nereid has no sequence batcher (Triton's dynamic
            # batcher ignores it too).
            if not _is_uint(value) and type(value) is not str:
                raise MalformedRequestError("Unable to parse 'sequence_id': " + _NOT_STRING)
        elif key == "sequence_start" or key == "sequence_end":
            if type(value) is not bool:
                raise MalformedRequestError(f"Unable to parse '{key}': " + _NOT_BOOL)
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
    return priority, timeout_us, binary_data_output


def _member_str(obj: dict[str, Any], key: str) -> str:
    """``obj[key]`` as a string, else TritonJson's MemberAsString error (500)."""
    value = obj.get(key)
    if type(value) is not str:
        detail = _NO_MEMBER.format(key) if key not in obj else _NOT_STRING
        raise MalformedRequestError(f"Unable to parse '{key}': {detail}")
    return value


def _parse_input(
    entry: Any,
    body: bytes,
    offset: int,
    parsed: Mapping[str, _tensors.WireInput],
    model_name: str,
    max_json_size: int,
    prefix: str,
    resolve_shm: ShmResolver | None,
) -> _tensors.WireInput:
    """One element of ``inputs`` (Triton's ParseJsonTritonIO loop body)."""
    if type(entry) is not dict:
        raise InvalidInputError(_content_type_error(False, False, False))
    params = entry.get("parameters")
    if type(params) is not dict:
        params = None
    has_data = "data" in entry
    has_binary = params is not None and "binary_data_size" in params
    has_shm = params is not None and "shared_memory_region" in params
    if has_data + has_binary + has_shm != 1:
        raise InvalidInputError(_content_type_error(has_data, has_binary, has_shm))
    name = entry.get("name")
    if not isinstance(name, str):
        name = _member_str(entry, "name")
    wire = entry.get("datatype")
    if not isinstance(wire, str):
        wire = _member_str(entry, "datatype")
    shape_json = entry.get("shape")
    if type(shape_json) is not list:
        detail = _NO_MEMBER.format("shape") if "shape" not in entry else _NOT_ARRAY
        raise MalformedRequestError("Unable to parse 'shape': " + detail)
    wide = False
    for dim in shape_json:
        if type(dim) is not int or dim < 0:
            raise MalformedRequestError("Unable to parse 'shape': " + _NOT_UINT)
        if dim >= _I64_LIMIT:
            if dim >= _U64_LIMIT:
                raise MalformedRequestError("Unable to parse 'shape': " + _NOT_UINT)
            wide = True
    # Triton keeps dims as int64: uints of 2**63 and more read back negative.
    shape = tuple(d if d < _I64_LIMIT else d - _U64_LIMIT for d in shape_json) if wide else tuple(shape_json)
    if name in parsed:
        raise InvalidInputError(
            f"{prefix}input '{name}' already exists in request", model=model_name, input=name
        )
    dt = by_wire_name(wire)
    if dt is not None and not wide and 0 in shape:
        # An empty tensor skips every size check below, yet numpy must still represent it.
        _check_representable(shape, dt, name, model_name)
    if dt is None:
        raise InvalidInputError(
            f"invalid datatype for input {name}: '{wire}' is not one of "
            f"{', '.join(t.wire_name for t in DATATYPES)} (model '{model_name}')",
            model=model_name,
            input=name,
        )

    if has_binary:
        assert params is not None
        size = params["binary_data_size"]
        if type(size) is not int or not 0 <= size < _U64_LIMIT:
            raise MalformedRequestError("Unable to parse 'binary_data_size': " + _NOT_UINT)
        available = len(body) - offset
        if size > available:
            raise InvalidInputError(
                f"unexpected size for input '{name}', expecting {size - available} additional bytes "
                f"for model '{model_name}'",
                model=model_name,
                input=name,
            )
        return _tensors.WireInput(name, dt, shape, _tensors.BINARY, body, offset, size, wide)

    if has_shm:
        assert params is not None
        region = params["shared_memory_region"]
        if type(region) is not str:
            raise MalformedRequestError("Unable to parse 'shared_memory_region': " + _NOT_STRING)
        shm_offset, shm_size = _shm_numbers(params)
        view = _resolve(resolve_shm, region, shm_offset, shm_size)
        return _tensors.WireInput(name, dt, shape, _tensors.SHM, view, 0, view.nbytes, wide)

    return _tensors.json_input(entry, name, dt, shape, model_name, max_json_size, wide)


def _content_type_error(has_data: bool, has_binary: bool, has_shm: bool) -> str:
    text = (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But"
    )
    if not (has_data or has_binary or has_shm):
        return text + " no field is set"
    text += " set"
    for flag, field in (
        (has_data, "data"),
        (has_binary, "binary_data_size"),
        (has_shm, "shared_memory_region"),
    ):
        if flag:
            text += f" '{field}'"
    return text


def _shm_numbers(params: dict[str, Any]) -> tuple[int, int]:
    shm_offset = params.get("shared_memory_offset", 0)
    if not _is_uint(shm_offset):
        raise MalformedRequestError("Unable to parse 'shared_memory_offset': " + _NOT_UINT)
    shm_size = params.get("shared_memory_byte_size", 0)
    if not _is_uint(shm_size):
        raise MalformedRequestError("Unable to parse 'shared_memory_byte_size': " + _NOT_UINT)
    return shm_offset, shm_size


def _resolve(resolve_shm: ShmResolver | None, region: str, offset: int, size: int) -> memoryview:
    if resolve_shm is not None:
        try:
            return memoryview(resolve_shm(region, offset, size))
        except KeyError:
            pass
    raise ModelNotFoundError(f"Unable to find shared memory region: '{region}'")


def _parse_outputs(
    outputs_json: Any, spec: ModelCodec, prefix: str, model_name: str, resolve_shm: ShmResolver | None
) -> tuple[RequestedOutput, ...]:
    """The request's ``outputs`` list (Triton's output loop and ValidateOutputParameter)."""
    if type(outputs_json) is not list:
        raise MalformedRequestError("Unable to parse 'outputs': " + _NOT_ARRAY)
    cache = spec.requested
    result: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in outputs_json:
        params = entry.get("parameters") if type(entry) is dict else None
        if type(params) is not dict:
            params = None
        if params is not None and "shared_memory_region" in params:
            if "classification" in params:
                raise InvalidInputError("Output can't set both 'shared_memory_region' and 'classification'")
            if "binary_data" in params:
                if type(params["binary_data"]) is not bool:
                    raise MalformedRequestError("Unable to set 'binary_data': " + _NOT_BOOL)
                if params["binary_data"]:
                    raise InvalidInputError("Output can't set both 'shared_memory_region' and 'binary_data'")
        if type(entry) is not dict:
            raise MalformedRequestError("Unable to parse 'name': " + _NO_MEMBER.format("name"))
        name = entry.get("name")
        if not isinstance(name, str):
            name = _member_str(entry, "name")
        if name in seen:
            raise InvalidInputError(f"{prefix}output '{name}' already exists in request", model=model_name)
        seen.add(name)
        if params is None:
            result.append(_requested(cache, spec, name, False, 0))
            continue
        classes = params.get("classification", 0)
        if type(classes) is not int or not 0 <= classes < _U64_LIMIT:
            raise MalformedRequestError("Unable to set 'classification': " + _NOT_UINT)
        if "shared_memory_region" in params:
            region = params["shared_memory_region"]
            if type(region) is not str:
                raise MalformedRequestError("Unable to parse 'shared_memory_region': " + _NOT_STRING)
            shm_offset, shm_size = _shm_numbers(params)
            _resolve(resolve_shm, region, shm_offset, shm_size)  # 404 / bounds now, as Triton
            result.append(
                RequestedOutput(name, shm_region=region, shm_byte_size=shm_size, shm_offset=shm_offset)
            )
            continue
        binary = params.get("binary_data", False)
        if type(binary) is not bool:
            raise MalformedRequestError("Unable to parse 'binary_data': " + _NOT_BOOL)
        result.append(_requested(cache, spec, name, binary, classes))
    return tuple(result)


def _requested(
    cache: dict[tuple[str, bool, int], RequestedOutput], spec: ModelCodec, name: str, binary: bool, classes: int
) -> RequestedOutput:
    # RequestedOutput is frozen, so one record per (name, binary, classes) can be shared
    # by every request: building a frozen dataclass costs more than the rest of an entry.
    # Only the model's own output names are kept (a client cannot fill the table).
    key = (name, binary, classes)
    found = cache.get(key)
    if found is None:
        found = RequestedOutput(name, binary_data=binary, classification=classes)
        if name in spec.outputs and len(cache) < _REQUESTED_CACHE_SIZE:
            cache[key] = found
    return found


_REQUESTED_CACHE_SIZE = 64


def _validate_inputs(
    parsed: dict[str, _tensors.WireInput], spec: ModelCodec, model_name: str, prefix: str
) -> tuple[dict[str, NDArray[Any]], int]:
    """Triton core's InferenceRequest::Normalize for the inputs, in its order (inputs
    visited by name), then the arrays. Returns (name -> array in request order, rows)."""
    config = spec.config
    count = len(parsed)
    if count > len(config.input) or count < spec.required_inputs:
        raise InvalidInputError(_input_count_error(parsed, spec, model_name, prefix), model=model_name)
    names: Iterable[str] = sorted(parsed) if count > 1 else parsed
    batch = -1
    for name in names:
        tensor = spec.inputs.get(name)
        if tensor is None:
            raise InvalidInputError(
                f"unexpected inference input '{name}' for model '{model_name}'", model=model_name, input=name
            )
        if not spec.batching or tensor.is_shape_tensor:
            continue
        shape = parsed[name].shape
        if not shape:
            raise InvalidInputError(
                f"{prefix}input '{name}' has no shape but model requires batch dimension for '{model_name}'",
                model=model_name,
                input=name,
            )
        if batch == -1:
            batch = shape[0]
        elif shape[0] != batch:
            raise InvalidInputError(
                f"{prefix}input '{name}' batch size does not match other inputs for '{model_name}'",
                model=model_name,
                input=name,
            )
    if count < len(config.input) and any(name not in parsed for name in spec.required_names):
        # Triton only compares counts, so a required input replaced by an optional one
        # would reach the model; nereid refuses it with the same message.
        raise InvalidInputError(_input_count_error(parsed, spec, model_name, prefix), model=model_name)
    if spec.batching and batch != -1:
        if batch > config.max_batch_size or batch < 0:
            raise InvalidInputError(
                f"{prefix}inference request batch-size must be <= {config.max_batch_size} for '{model_name}'",
                model=model_name,
            )
        if batch == 0:
            # Triton passes a zero batch on to the backend; a batcher cannot run it.
            raise InvalidInputError(
                f"{prefix}inference request batch-size must be between 1 and {config.max_batch_size} "
                f"for '{model_name}', got 0",
                model=model_name,
            )
    checked: dict[str, NDArray[Any]] = {}
    for name in names:
        item = parsed[name]
        _check_input(item, spec.inputs[name], spec, model_name, prefix)
        checked[name] = _tensors.to_array(item, model_name, prefix)
    arrays = checked if count == 1 else {name: checked[name] for name in parsed}
    return arrays, batch if batch > 0 else 1


def _input_count_error(
    parsed: dict[str, _tensors.WireInput], spec: ModelCodec, model_name: str, prefix: str
) -> str:
    config = spec.config
    missing = [f"'{t.name}'" for t in config.input if not t.optional and t.name not in parsed]
    # Triton's string building drops the '[' when nothing is missing ("... input(s) ]").
    missing_text = "[" + ",".join(missing) + "]" if missing else "]"
    got_text = "[" + ",".join(f"'{name}'" for name in sorted(parsed)) + "]"
    if len(config.input) == spec.required_inputs:
        head = f"expected {len(config.input)} inputs"
    else:
        head = f"expected number of inputs between {spec.required_inputs} and {len(config.input)}"
    return (
        f"{prefix}{head} but got {len(parsed)} inputs for model '{model_name}'. Got input(s) {got_text}, "
        f"but missing required input(s) {missing_text}. Please provide all required input(s)."
    )


def _check_input(
    item: _tensors.WireInput, tensor: ModelInput, spec: ModelCodec, model_name: str, prefix: str
) -> None:
    """Datatype, shape and byte size of one input against its config (400s)."""
    name = item.name
    if item.dt is not tensor.data_type:
        raise InvalidInputError(
            f"{prefix}inference input '{name}' data-type is '{item.dt.wire_name}', but model '{model_name}' "
            f"expects '{tensor.data_type.wire_name}'",
            model=model_name,
            input=name,
        )
    shape = item.shape
    dims = shape[1:] if spec.batching and not tensor.is_shape_tensor else shape
    config_dims = tensor.dims
    if dims != config_dims or item.negative:
        matches = len(dims) == len(config_dims)
        if matches:
            for got, want in zip(dims, config_dims):
                if got < 0:
                    raise InvalidInputError(
                        f"{prefix}All input dimensions should be specified for input '{name}' for model "
                        f"'{model_name}', got {_tensors.dims_text(shape)}",
                        model=model_name,
                        input=name,
                    )
                if want != -1 and want != got:
                    matches = False
                    break
        if not matches:
            expected = ((-1,) if spec.batching else ()) + tuple(config_dims)
            note = _SHAPE_NOTE if spec.batching else ""
            raise InvalidInputError(
                f"{prefix}unexpected shape for input '{name}' for model '{model_name}'. Expected {_tensors.dims_text(expected)}, "
                f"got {_tensors.dims_text(shape)}. {note}",
                model=model_name,
                input=name,
            )
    if item.dt.is_bytes:
        return  # the element framing is checked while splitting (_to_array)
    expected_size = math.prod(shape) * item.dt.itemsize
    if expected_size != item.size:
        raise InvalidInputError(
            f"{prefix}input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected_size}, got {item.size}",
            model=model_name,
            input=name,
        )


def _parse_raw(
    body: bytes, spec: ModelCodec, model_name: str, model_version: int | None, max_json_size: int
) -> InferRequest:
    """A raw binary request (§3.4): the whole body is the model's single input."""
    size = len(body)
    if size > max_json_size:
        raise InvalidInputError(
            f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {max_json_size} "
            "bytes. Use --http-max-input-size to increase the limit."
        )
    prefix = "[request id: <id_unknown>] "
    config = spec.config
    if len(config.input) != 1:
        raise InvalidInputError(
            f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got {len(config.input)} "
            f"inputs in '{model_name}' model configuration",
            model=model_name,
        )
    tensor = config.input[0]
    shape = [1] if spec.batching else []
    variable_axis = -1
    fixed_count = 1
    for dim in tensor.dims:
        if dim == -1:
            if variable_axis != -1:
                raise InvalidInputError(
                    f"{prefix}The shape of the raw input '{tensor.name}' can not be deduced because there are more "
                    "than one variable-sized dimension",
                    model=model_name,
                    input=tensor.name,
                )
            variable_axis = len(shape)
        else:
            fixed_count *= dim
        shape.append(dim)
    dt = tensor.data_type
    if dt.is_bytes:
        if variable_axis != -1 or fixed_count != 1:
            raise InvalidInputError(
                f"{prefix}For BYTE datatype raw input '{tensor.name}', the model must have input shape [1]",
                model=model_name,
                input=tensor.name,
            )
        inputs: dict[str, NDArray[Any]] = {tensor.name: _tensors.bytes_object_array([body], shape)}
    else:
        if variable_axis != -1:
            shape[variable_axis] = size // fixed_count // dt.itemsize if fixed_count else 0
        item = _tensors.WireInput(tensor.name, dt, tuple(shape), _tensors.BINARY, body, 0, size)
        _check_input(item, tensor, spec, model_name, prefix)
        inputs = {tensor.name: _tensors.to_array(item, model_name, prefix)}
    return InferRequest(
        model_name=model_name, inputs=inputs, rows=1, model_version=model_version, binary_data_output=True
    )
