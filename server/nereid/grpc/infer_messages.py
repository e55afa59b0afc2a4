"""The full decoder and encoder of gRPC's infer messages: ModelInferRequest ->
InferRequest, outputs -> ModelInferResponse (both engines, unary and streaming).

``decode_request`` makes the InferRequest a ModelInferRequest means: inputs come as
``raw_input_contents`` (one blob per input, in order), typed ``contents``, or a shared
memory region; they are checked by the same ``ConfigRules`` and made into arrays by the
same ``wire_inputs.to_array`` as HTTP's, so a request means the same on both surfaces.
``encode_response``: outputs go out in the model's order as ``raw_output_contents`` (an
empty entry for one written to shared memory, so the lists stay aligned), as Triton does.
A repeated request and its answer skip both (``infer.InferMemo``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from tritonclient.grpc import service_pb2

from nereid.datatypes import BY_WIRE_NAME, DATATYPES
from nereid.errors import InternalError, InvalidInputError, ModelExecutionError, ModelNotFoundError
from nereid.inference import InferRequest, ParameterValue, RequestedOutput, SequenceFlags
from nereid.tensors import wire_inputs
from nereid.tensors import wire_outputs
from nereid.tensors.tables import ModelTables

__all__ = ["decode_request", "encode_response"]

#: The typed ``contents`` field of each datatype.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def decode_request(
    message: service_pb2.ModelInferRequest, codec: ModelTables, version: int, resolve_shm: Any
) -> InferRequest:
    """The InferRequest a ModelInferRequest means, checked against the model's config.
    Raises NereidError (InvalidInputError for what the client got wrong)."""
    name = message.model_name
    prefix = f"[request id: {message.id or '<id_unknown>'}] "
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise InvalidInputError(
            f"{prefix}expected {len(message.inputs)} raw input contents (one per input) for model '{name}', "
            f"got {len(raw)}",
            model=name,
        )
    parsed: dict[str, wire_inputs.WireInput] = {}
    for index, tensor in enumerate(message.inputs):
        parsed[tensor.name] = _input(tensor, raw[index] if raw else None, parsed, name, prefix, resolve_shm)
    rules = codec.rules
    names, rows = rules.check_request(parsed, name, prefix)
    checked = {}
    for input_name in names:
        item = parsed[input_name]
        rules.check_input(input_name, item, name, prefix)
        checked[input_name] = wire_inputs.to_array(item, name, prefix)
    arrays = checked if len(names) == 1 else {input_name: checked[input_name] for input_name in parsed}
    priority, timeout_us, custom, sequence = _parameters(message.parameters)
    outputs = _requested_outputs(message, codec, name, prefix, resolve_shm) if message.outputs else None
    return InferRequest(
        model_name=name, inputs=arrays, rows=rows, id=message.id, model_version=version, outputs=outputs,
        parameters=custom, priority=priority, timeout_us=timeout_us, binary_data_output=True, sequence=sequence,
    )


def _input(
    tensor: Any, blob: bytes | None, parsed: Mapping[str, wire_inputs.WireInput], model: str, prefix: str,
    resolve_shm: Any,
) -> wire_inputs.WireInput:
    name = tensor.name
    if name in parsed:
        raise InvalidInputError(f"{prefix}input '{name}' already exists in request", model=model, input=name)
    dt = BY_WIRE_NAME.get(tensor.datatype)
    if dt is None:
        raise InvalidInputError(
            f"invalid datatype for input {name}: '{tensor.datatype}' is not one of "
            f"{', '.join(t.wire_name for t in DATATYPES)} (model '{model}')",
            model=model, input=name,
        )
    shape = tuple(tensor.shape)
    has_contents = tensor.HasField("contents")
    region = tensor.parameters.get("shared_memory_region")
    if blob is not None:
        if has_contents:
            raise InvalidInputError(
                f"{prefix}contents field must not be specified when using raw_input_contents for '{name}' for "
                f"model '{model}'",
                model=model, input=name,
            )
        return wire_inputs.WireInput(name, dt, shape, wire_inputs.BINARY, blob, 0, len(blob))
    if region is not None:
        offset = tensor.parameters["shared_memory_offset"].int64_param if "shared_memory_offset" in tensor.parameters else 0
        size = tensor.parameters["shared_memory_byte_size"].int64_param if "shared_memory_byte_size" in tensor.parameters else 0
        try:
            view = resolve_shm(region.string_param, offset, size)
        except KeyError:
            raise ModelNotFoundError(f"Unable to find shared memory region: '{region.string_param}'") from None
        return wire_inputs.WireInput(name, dt, shape, wire_inputs.SHM, view, 0, view.nbytes)
    if has_contents:
        field = _CONTENTS_FIELD.get(dt.wire_name)
        if field is None:
            raise InvalidInputError(
                f"{prefix}{dt.wire_name} data for input '{name}' of model '{model}' must be sent in "
                "raw_input_contents (it has no typed contents field)",
                model=model, input=name,
            )
        values = list(getattr(tensor.contents, field))
        if dt.is_bytes:
            return wire_inputs.WireInput(name, dt, shape, wire_inputs.JSON, values, 0, 4 * len(values) + sum(map(len, values)))
        array = np.asarray(values, dtype=dt.numpy)
        expected = int(np.prod(shape, dtype=np.int64)) if shape else 0
        if array.size != expected:
            raise InvalidInputError(
                f"{prefix}unexpected number of elements for inference input '{name}' for model '{model}': "
                f"expected {expected}, got {array.size}",
                model=model, input=name,
            )
        return wire_inputs.WireInput(name, dt, shape, wire_inputs.JSON, array, 0, array.nbytes)
    raise InvalidInputError(
        f"{prefix}input '{name}' for model '{model}' has no data: send it in raw_input_contents, in contents, "
        "or in a shared memory region",
        model=model, input=name,
    )


def _value(parameter: Any) -> ParameterValue:
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind is not None else ""


def _parameters(parameters: Any) -> tuple[int, int | None, dict[str, ParameterValue], SequenceFlags | None]:
    """(priority, timeout in µs, custom parameters, sequence parameters) of a request
    (Triton's interpreted keys)."""
    priority, timeout_us = 0, None
    custom: dict[str, ParameterValue] = {}
    sequence: dict[str, Any] = {}
    for key, parameter in parameters.items():
        value = _value(parameter)
        if key == "priority":
            priority = int(value)
        elif key == "timeout":
            timeout_us = int(value)
        elif key == "sequence_id":
            kind = parameter.WhichOneof("parameter_choice")
            if kind not in ("int64_param", "string_param"):
                raise InvalidInputError(
                    "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
            # an int64 is Triton's uint64 correlation id, bit for bit
            sequence["id"] = value if isinstance(value, str) else int(value) % (1 << 64)
        elif key == "sequence_start" or key == "sequence_end":
            if parameter.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidInputError(f"invalid value type for '{key}' parameter, expected bool_param.")
            sequence[key[len("sequence_"):]] = bool(value)
        elif key == "binary_data_output":
            continue
        elif key == "triton_enable_empty_final_response":
            continue  # the stream's to read (clients send it on every request)
        elif key.startswith("triton_"):
            raise InvalidInputError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        elif key != "headers":
            custom[key] = value
    return priority, timeout_us, custom, SequenceFlags(**sequence) if sequence else None


def _requested_outputs(
    message: Any, codec: ModelTables, model: str, prefix: str, resolve_shm: Any
) -> tuple[RequestedOutput, ...]:
    seen: set[str] = set()
    result = []
    for output in message.outputs:
        name = output.name
        if name in seen:
            raise InvalidInputError(f"{prefix}output '{name}' already exists in request", model=model)
        seen.add(name)
        params = output.parameters
        classes = int(_value(params["classification"])) if "classification" in params else 0
        if "shared_memory_region" in params:
            if classes:
                raise InvalidInputError("Output can't set both 'shared_memory_region' and 'classification'")
            region = str(_value(params["shared_memory_region"]))
            offset = int(_value(params["shared_memory_offset"])) if "shared_memory_offset" in params else 0
            size = int(_value(params["shared_memory_byte_size"])) if "shared_memory_byte_size" in params else 0
            try:
                resolve_shm(region, offset, size)
            except KeyError:
                raise ModelNotFoundError(f"Unable to find shared memory region: '{region}'") from None
            result.append(RequestedOutput(name, shm_region=region, shm_byte_size=size, shm_offset=offset))
        else:
            result.append(RequestedOutput(name, binary_data=True, classification=classes))
    for out in result:
        if out.name not in codec.outputs:
            missing = min(o.name for o in result if o.name not in codec.outputs)
            raise InvalidInputError(f"unexpected inference output '{missing}' for model '{model}'", model=model)
    return tuple(result)


def encode_response(
    outputs: Mapping[str, Any], request: InferRequest, codec: ModelTables, version: int,
    labels: Mapping[str, Any] | None, write_shm: Any,
) -> service_pb2.ModelInferResponse:
    """The ModelInferResponse of a request's outputs: the requested ones (or all), in the
    model's order."""
    model = request.model_name
    response = service_pb2.ModelInferResponse(model_name=model, model_version=str(version), id=request.id)
    wanted = {out.name: out for out in request.outputs} if request.outputs is not None else None
    if wanted is not None:
        missing = [name for name in wanted if name not in outputs]
        if missing:
            raise ModelExecutionError(
                f"model '{model}' did not produce the requested output(s) {', '.join(map(repr, missing))}", model=model
            )
    for name, value in outputs.items():
        requested = wanted.get(name) if wanted is not None else None
        if wanted is not None and requested is None:
            continue
        arr, dt = wire_outputs.output_array(name, value, codec.output_types.get(name), model)
        if requested is not None and requested.classification:
            elements, shape = wire_outputs.classify(
                arr, dt, requested.classification, codec.batching, (labels or {}).get(name)
            )
            arr, dt = wire_outputs.bytes_object_array(elements, shape), wire_outputs.BYTES
        tensor = response.outputs.add(name=name, datatype=dt.wire_name, shape=arr.shape)
        pieces, size = wire_outputs.binary_blob(arr, dt, name, model)
        blob = pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
        if requested is not None and requested.shm_region is not None:
            if size > requested.shm_byte_size:
                raise InternalError(
                    f"shared memory size specified with the request for output '{name}' ({requested.shm_byte_size} "
                    f"bytes) should be at least {size} bytes to hold the results"
                )
            write_shm(requested.shm_region, requested.shm_offset, blob)
            tensor.parameters["shared_memory_region"].string_param = requested.shm_region
            tensor.parameters["shared_memory_byte_size"].int64_param = size
            if requested.shm_offset:
                tensor.parameters["shared_memory_offset"].int64_param = requested.shm_offset
            blob = b""
        response.raw_output_contents.append(blob)
    return response
