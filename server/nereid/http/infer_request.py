"""An infer request's body (KServe v2 JSON and Triton's binary tensor extension) ->
``InferRequest``: the full parser, with no memo (infer_memo.py sits in front of it).

Owns the request structure (protocol.md §2-§3): the JSON header's ``id``,
``parameters``, ``inputs`` (binary blobs, JSON ``data``, shared memory) and ``outputs``;
a raw binary request is raw_request.py's. The inputs are then checked against the model config by the one
checking core (``nereid.tensors.checks``) with Triton's texts. Checks run in Triton's
order, and messages are Triton's, so clients see what tritonserver would tell them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from numpy.typing import NDArray

from nereid.config.schema import ModelConfig
from nereid.datatypes import BY_WIRE_NAME, DATATYPES, DataType
from nereid.errors import InvalidInputError, MalformedRequestError, ModelNotFoundError, NereidError
from nereid.tensors import wire_inputs
from nereid.http.infer_memo import HttpModelTables
from nereid.http.raw_request import parse_raw_request
from nereid.http.request_json import (
    I64_LIMIT,
    NO_MEMBER,
    NOT_ARRAY,
    NOT_BOOL,
    NOT_STRING,
    NOT_UINT,
    U64_LIMIT,
    is_uint,
    load_json,
    member_str,
    parse_header_length,
    request_parameters,
)
from nereid.inference import InferRequest, ParameterValue, RequestedOutput, SequenceFlags
from nereid.tensors.checks import check_representable

__all__ = ["ParsedInfer", "ShmResolver", "parse_infer_body", "parse_infer_request"]

#: ``resolve_shm(region, offset, byte_size)`` -> a view of that part of a registered
#: region. It raises KeyError (-> 404) for an unknown region, a NereidError for bad bounds.
ShmResolver = Callable[[str, int, int], memoryview]


@dataclasses.dataclass(slots=True)
class ParsedInfer:
    """A full parse: the request, and what ``InferMemo.learn_request`` plans from (the JSON
    header's length, the inputs as read from the wire, in request order, and the
    request-id prefix of its messages)."""

    request: InferRequest
    json_length: int
    inputs: Mapping[str, wire_inputs.WireInput]
    prefix: str


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    *,
    config: ModelConfig | HttpModelTables,
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
    return parse_infer_body(body, header_length, HttpModelTables.of(config), model_name, model_version, max_json_size, resolve_shm).request


def parse_infer_body(
    body: bytes,
    header_length: str | None,
    spec: HttpModelTables,
    model_name: str,
    model_version: int | None,
    max_json_size: int,
    resolve_shm: ShmResolver | None = None,
) -> ParsedInfer:
    """``parse_infer_request``, keeping what a plan is made from (see ParsedInfer)."""
    try:
        total = len(body)
        json_length = total if header_length is None else parse_header_length(header_length, total)
        if json_length == 0:
            return ParsedInfer(parse_raw_request(body, spec, model_name, model_version, max_json_size), 0, {}, "")
        root = _json_root(body, json_length, max_json_size)
        request_id = root.get("id", "")
        if type(request_id) is not str:
            raise MalformedRequestError("Unable to parse 'id': " + NOT_STRING)
        prefix = f"[request id: {request_id or '<id_unknown>'}] "
        custom: dict[str, ParameterValue] = {}
        priority, timeout_us, binary_data_output, sequence = _request_parameters(root, custom)
        parsed = _parse_inputs(root, body, json_length, model_name, max_json_size, prefix, resolve_shm)
        outputs = _requested_outputs(root, spec, prefix, model_name, resolve_shm)
        arrays, rows = _checked_arrays(parsed, spec, model_name, prefix)
        request = InferRequest(
            model_name=model_name, inputs=arrays, rows=rows, id=request_id, model_version=model_version,
            outputs=outputs, parameters=custom, priority=priority, timeout_us=timeout_us,
            binary_data_output=binary_data_output, sequence=sequence,
        )
        return ParsedInfer(request, json_length, parsed, prefix)
    except NereidError:
        raise
    except Exception as exc:  # last resort: every real check raises a NereidError
        raise MalformedRequestError(
            f"failed to parse the inference request for model '{model_name}': "
            f"unexpected {type(exc).__name__}: {exc}"
        ) from exc


def _json_root(body: bytes, json_length: int, max_json_size: int) -> dict[str, Any]:
    """The JSON header's object (an empty one for any other JSON value, as TritonJson reads it)."""
    if json_length > max_json_size:
        raise InvalidInputError(
            f"request JSON size of {json_length} bytes exceeds the maximum allowed input size of "
            f"{max_json_size} bytes. Use --http-max-input-size to increase the limit."
        )
    root = load_json(body, json_length)
    return root if isinstance(root, dict) else {}  # a non-object has no members: 'inputs' is "non-existing"


def _request_parameters(
    root: dict[str, Any], custom: dict[str, ParameterValue]
) -> tuple[int, int | None, bool, SequenceFlags | None]:
    """The request's ``parameters``: (priority, timeout_us, binary_data_output, sequence);
    the others go into ``custom``."""
    params = root.get("parameters")
    if params is None:
        return 0, None, False, None
    if type(params) is not dict:
        raise MalformedRequestError("failed to get request params.: attempt to get members for non-object")
    return request_parameters(params, custom) if params else (0, None, False, None)


def _parse_inputs(
    root: dict[str, Any], body: bytes, json_length: int, model_name: str, max_json_size: int, prefix: str,
    resolve_shm: ShmResolver | None,
) -> dict[str, wire_inputs.WireInput]:
    """The ``inputs`` as read from the wire, in request order; their blobs must fill the body."""
    inputs_json = root.get("inputs")
    if type(inputs_json) is not list:
        detail = NO_MEMBER.format("inputs") if inputs_json is None and "inputs" not in root else NOT_ARRAY
        raise MalformedRequestError("Unable to parse 'inputs': " + detail)
    parsed: dict[str, wire_inputs.WireInput] = {}
    offset = json_length
    for entry in inputs_json:
        item = _parse_input(entry, body, offset, parsed, model_name, max_json_size, prefix, resolve_shm)
        parsed[item.name] = item
        if item.source == wire_inputs.BINARY:
            offset += item.size
    if offset != len(body):
        raise InvalidInputError(f"unexpected additional input data for model '{model_name}'", model=model_name)
    return parsed


def _requested_outputs(
    root: dict[str, Any], spec: HttpModelTables, prefix: str, model_name: str, resolve_shm: ShmResolver | None
) -> tuple[RequestedOutput, ...] | None:
    """The ``outputs`` the request lists (None when it lists none), each one the model's."""
    if "outputs" not in root:
        return None
    outputs = _parse_outputs(root["outputs"], spec, prefix, model_name, resolve_shm)
    unknown = [out.name for out in outputs if out.name not in spec.outputs]
    if unknown:
        # Triton checks the requested names in sorted order: report the first.
        raise InvalidInputError(
            f"unexpected inference output '{min(unknown)}' for model '{model_name}'", model=model_name
        )
    return outputs


def _checked_arrays(
    parsed: dict[str, wire_inputs.WireInput], spec: HttpModelTables, model_name: str, prefix: str
) -> tuple[dict[str, NDArray[Any]], int]:
    """The inputs checked against the config and decoded, each in Triton's order (the
    arrays in request order), and the request's rows."""
    rules = spec.rules
    names, rows = rules.check_request(parsed, model_name, prefix)
    checked: dict[str, NDArray[Any]] = {}
    for name in names:  # each checked, then decoded, in Triton's order
        item = parsed[name]
        rules.check_input(name, item, model_name, prefix)
        checked[name] = wire_inputs.to_array(item, model_name, prefix)
    return (checked if len(names) == 1 else {name: checked[name] for name in parsed}), rows


def _parse_input(
    entry: Any,
    body: bytes,
    offset: int,
    parsed: Mapping[str, wire_inputs.WireInput],
    model_name: str,
    max_json_size: int,
    prefix: str,
    resolve_shm: ShmResolver | None,
) -> wire_inputs.WireInput:
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
        name = member_str(entry, "name")
    wire = entry.get("datatype")
    if not isinstance(wire, str):
        wire = member_str(entry, "datatype")
    shape, wide = _input_shape(entry)
    if name in parsed:
        raise InvalidInputError(f"{prefix}input '{name}' already exists in request", model=model_name, input=name)
    dt = _input_datatype(wire, shape, wide, name, model_name)
    if has_binary:
        assert params is not None
        return _binary_input(params, body, offset, name, dt, shape, wide, model_name)
    if has_shm:
        assert params is not None
        region = params["shared_memory_region"]
        if type(region) is not str:
            raise MalformedRequestError("Unable to parse 'shared_memory_region': " + NOT_STRING)
        shm_offset, shm_size = _shm_numbers(params)
        view = _resolve(resolve_shm, region, shm_offset, shm_size)
        return wire_inputs.WireInput(name, dt, shape, wire_inputs.SHM, view, 0, view.nbytes, wide)
    return wire_inputs.json_input(entry, name, dt, shape, model_name, max_json_size, wide)


def _input_shape(entry: dict[str, Any]) -> tuple[tuple[int, ...], bool]:
    """An input's ``shape``, and whether a dim is 2**63 or more (Triton keeps dims as
    int64: such uints read back negative)."""
    shape_json = entry.get("shape")
    if type(shape_json) is not list:
        detail = NO_MEMBER.format("shape") if "shape" not in entry else NOT_ARRAY
        raise MalformedRequestError("Unable to parse 'shape': " + detail)
    wide = False
    for dim in shape_json:
        if type(dim) is not int or dim < 0:
            raise MalformedRequestError("Unable to parse 'shape': " + NOT_UINT)
        if dim >= I64_LIMIT:
            if dim >= U64_LIMIT:
                raise MalformedRequestError("Unable to parse 'shape': " + NOT_UINT)
            wide = True
    shape = tuple(d if d < I64_LIMIT else d - U64_LIMIT for d in shape_json) if wide else tuple(shape_json)
    return shape, wide


def _input_datatype(wire: str, shape: tuple[int, ...], wide: bool, name: str, model_name: str) -> DataType:
    """The DataType of an input's ``datatype`` name."""
    dt = BY_WIRE_NAME.get(wire)
    if dt is not None and not wide and 0 in shape:
        # An empty tensor skips every size check below, yet numpy must still represent it.
        check_representable(shape, dt, name, model_name)
    if dt is None:
        raise InvalidInputError(
            f"invalid datatype for input {name}: '{wire}' is not one of "
            f"{', '.join(t.wire_name for t in DATATYPES)} (model '{model_name}')",
            model=model_name,
            input=name,
        )
    return dt


def _binary_input(
    params: dict[str, Any], body: bytes, offset: int, name: str, dt: DataType, shape: tuple[int, ...], wide: bool,
    model_name: str,
) -> wire_inputs.WireInput:
    """An input whose bytes follow the JSON header (``binary_data_size`` of them, at ``offset``)."""
    size = params["binary_data_size"]
    if type(size) is not int or not 0 <= size < U64_LIMIT:
        raise MalformedRequestError("Unable to parse 'binary_data_size': " + NOT_UINT)
    available = len(body) - offset
    if size > available:
        raise InvalidInputError(
            f"unexpected size for input '{name}', expecting {size - available} additional bytes "
            f"for model '{model_name}'",
            model=model_name,
            input=name,
        )
    return wire_inputs.WireInput(name, dt, shape, wire_inputs.BINARY, body, offset, size, wide)


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
    if not is_uint(shm_offset):
        raise MalformedRequestError("Unable to parse 'shared_memory_offset': " + NOT_UINT)
    shm_size = params.get("shared_memory_byte_size", 0)
    if not is_uint(shm_size):
        raise MalformedRequestError("Unable to parse 'shared_memory_byte_size': " + NOT_UINT)
    return shm_offset, shm_size


def _resolve(resolve_shm: ShmResolver | None, region: str, offset: int, size: int) -> memoryview:
    if resolve_shm is not None:
        try:
            return memoryview(resolve_shm(region, offset, size))
        except KeyError:
            pass
    raise ModelNotFoundError(f"Unable to find shared memory region: '{region}'")


def _parse_outputs(
    outputs_json: Any, spec: HttpModelTables, prefix: str, model_name: str, resolve_shm: ShmResolver | None
) -> tuple[RequestedOutput, ...]:
    """The request's ``outputs`` list (Triton's output loop and ValidateOutputParameter)."""
    if type(outputs_json) is not list:
        raise MalformedRequestError("Unable to parse 'outputs': " + NOT_ARRAY)
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
                    raise MalformedRequestError("Unable to set 'binary_data': " + NOT_BOOL)
                if params["binary_data"]:
                    raise InvalidInputError("Output can't set both 'shared_memory_region' and 'binary_data'")
        if type(entry) is not dict:
            raise MalformedRequestError("Unable to parse 'name': " + NO_MEMBER.format("name"))
        name = entry.get("name")
        if not isinstance(name, str):
            name = member_str(entry, "name")
        if name in seen:
            raise InvalidInputError(f"{prefix}output '{name}' already exists in request", model=model_name)
        seen.add(name)
        if params is None:
            result.append(_requested(cache, spec, name, False, 0))
            continue
        classes = params.get("classification", 0)
        if type(classes) is not int or not 0 <= classes < U64_LIMIT:
            raise MalformedRequestError("Unable to set 'classification': " + NOT_UINT)
        if "shared_memory_region" in params:
            region = params["shared_memory_region"]
            if type(region) is not str:
                raise MalformedRequestError("Unable to parse 'shared_memory_region': " + NOT_STRING)
            shm_offset, shm_size = _shm_numbers(params)
            _resolve(resolve_shm, region, shm_offset, shm_size)  # 404 / bounds now, as Triton
            result.append(
                RequestedOutput(name, shm_region=region, shm_byte_size=shm_size, shm_offset=shm_offset)
            )
            continue
        binary = params.get("binary_data", False)
        if type(binary) is not bool:
            raise MalformedRequestError("Unable to parse 'binary_data': " + NOT_BOOL)
        result.append(_requested(cache, spec, name, binary, classes))
    return tuple(result)


def _requested(
    cache: dict[tuple[str, bool, int], RequestedOutput], spec: HttpModelTables, name: str, binary: bool, classes: int
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
