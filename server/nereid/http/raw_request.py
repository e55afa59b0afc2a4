"""A raw binary infer request (protocol.md §3.4: ``Inference-Header-Content-Length: 0``):
the whole body is the model's single input, its shape deduced from the config, as in
Triton. Checked by the same core as any other input, with Triton's texts.
"""

from __future__ import annotations

from typing import Any

from numpy.typing import NDArray

from nereid.config.schema import ModelInput
from nereid.errors import InvalidInputError
from nereid.inference import InferRequest
from nereid.tensors import wire_inputs
from nereid.tensors.tables import ModelTables

__all__ = ["parse_raw_request"]

#: a raw request has no JSON header, so no id
_PREFIX = "[request id: <id_unknown>] "


def parse_raw_request(
    body: bytes, spec: ModelTables, model_name: str, model_version: int | None, max_json_size: int
) -> InferRequest:
    """``body`` as the single input of the model ``spec`` describes: a BYTES input is one
    element (the body); another type fills the one variable dim of the config's shape (a
    batch of one when the model batches). ``max_json_size`` (``--http-max-input-size``)
    limits the body. Raises InvalidInputError with Triton's texts."""
    size = len(body)
    if size > max_json_size:
        raise InvalidInputError(
            f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {max_json_size} "
            "bytes. Use --http-max-input-size to increase the limit."
        )
    config = spec.config
    if len(config.input) != 1:
        raise InvalidInputError(
            f"{_PREFIX}Raw request must only have 1 input (found 1) to be deduced but got {len(config.input)} "
            f"inputs in '{model_name}' model configuration",
            model=model_name,
        )
    tensor = config.input[0]
    shape, variable_axis, fixed_count = _config_shape(tensor, spec.batching, model_name)
    dt = tensor.data_type
    if dt.is_bytes:
        if variable_axis != -1 or fixed_count != 1:
            raise InvalidInputError(
                f"{_PREFIX}For BYTE datatype raw input '{tensor.name}', the model must have input shape [1]",
                model=model_name,
                input=tensor.name,
            )
        inputs: dict[str, NDArray[Any]] = {tensor.name: wire_inputs.bytes_object_array([body], shape)}
    else:
        if variable_axis != -1:
            shape[variable_axis] = size // fixed_count // dt.itemsize if fixed_count else 0
        item = wire_inputs.WireInput(tensor.name, dt, tuple(shape), wire_inputs.BINARY, body, 0, size)
        spec.rules.check_input(tensor.name, item, model_name, _PREFIX)
        inputs = {tensor.name: wire_inputs.to_array(item, model_name, _PREFIX)}
    return InferRequest(
        model_name=model_name, inputs=inputs, rows=1, model_version=model_version, binary_data_output=True
    )


def _config_shape(tensor: ModelInput, batching: bool, model_name: str) -> tuple[list[int], int, int]:
    """The input's full shape from its config (a batch of one first when the model
    batches), the axis of its one variable dim (-1: none), and the product of the fixed
    dims. More than one variable dim cannot be deduced."""
    shape = [1] if batching else []
    variable_axis = -1
    fixed_count = 1
    for dim in tensor.dims:
        if dim == -1:
            if variable_axis != -1:
                raise InvalidInputError(
                    f"{_PREFIX}The shape of the raw input '{tensor.name}' can not be deduced because there are more "
                    "than one variable-sized dimension",
                    model=model_name,
                    input=tensor.name,
                )
            variable_axis = len(shape)
        else:
            fixed_count *= dim
        shape.append(dim)
    return shape, variable_axis, fixed_count
