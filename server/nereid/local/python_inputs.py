"""Python values (a dict of arrays, lists, tensors) -> a checked InferRequest: each value
made an array of its input's datatype, then the request checked by the one checking core
(``nereid.tensors.checks``), its problems worded for Python callers.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import DataType
from nereid.errors import InvalidInputError
from nereid.inference import InferRequest, ParameterValue
from nereid.tensors.checks import ConfigRules, Facts, Problem, triton_text

__all__ = ["build_request"]


def build_request(
    config: ModelConfig,
    model: str,
    inputs: Mapping[str, Any],
    parameters: Mapping[str, ParameterValue] | None = None,
    priority: int = 0,
    timeout_us: int | None = None,
) -> InferRequest:
    """A checked InferRequest from Python values: each value becomes an array of its
    input's datatype here, then the request is checked by the one checking core
    (``nereid.tensors.checks``), its problems worded for Python callers. Raises
    InvalidInputError naming the model, the input, what was expected and what was given."""
    arrays: dict[str, np.ndarray] = {}
    facts: dict[str, _ArrayFacts] = {}
    known = {tensor.name: tensor for tensor in config.input}
    for name, value in inputs.items():
        spec = known.get(name)
        array = _as_array(model, spec, value) if spec is not None else np.asarray(value, dtype=object)
        arrays[name] = array
        facts[name] = _ArrayFacts(array, spec)
    _, rows = ConfigRules(config).check_inputs(facts, model, render=_python_text)
    return InferRequest(
        model_name=model,
        inputs=arrays,
        rows=rows,
        parameters=dict(parameters or {}),
        priority=priority,
        timeout_us=timeout_us,
    )


class _ArrayFacts:
    """An array as the checking core reads an input. Its datatype is the config's (the
    array was made, or checked, for it by _as_array); an unknown input has none."""

    __slots__ = ("dt", "shape", "size", "negative")

    def __init__(self, array: np.ndarray, spec: ModelInput | None) -> None:
        self.dt: DataType | None = spec.data_type if spec is not None else None
        self.shape: tuple[int, ...] = array.shape
        self.size = array.nbytes
        self.negative = False


def _python_text(facts: Facts) -> str:
    """A problem of an in-process request, in Python's terms (shapes as lists)."""
    p, m, name, d = facts.problem, facts.model, facts.input, facts.detail
    where = f"model '{m}', input '{name}'"
    if p is Problem.UNEXPECTED_INPUT:
        return f"unexpected inference input '{name}' for model '{m}' (inputs: {list(d['inputs'])})"
    if p is Problem.INPUT_COUNT:
        if d["missing"]:
            return f"model '{m}': missing required input '{d['missing'][0]}'"
        return f"model '{m}': expected at most {d['inputs']} inputs, got {len(d['got'])}: {list(d['got'])}"
    if p is Problem.NO_BATCH_DIMENSION or p is Problem.SHAPE:
        return f"{where}: expected shape {list(d['expected'])}, got {list(d['got'])}"
    if p is Problem.BATCH_MISMATCH:
        return f"{where}: expected batch size {d['expected']} (as the other inputs), got {d['got']}"
    if p is Problem.BATCH_SIZE:
        return f"{where}: expected a batch of 1..{d['max']} rows, got {d['batch']}"
    return triton_text(facts)  # datatype and byte size: _as_array made them right


def _as_array(model: str, spec: ModelInput, value: Any) -> np.ndarray:
    dtype = spec.data_type
    if dtype.is_bytes:
        array = np.asarray(value, dtype=object)
        flat = array.reshape(-1)
        for index, item in enumerate(flat):
            if isinstance(item, str):
                flat[index] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                raise InvalidInputError(
                    f"model '{model}', input '{spec.name}': expected str or bytes elements (STRING), "
                    f"got {type(item).__name__}",
                    model=model, input=spec.name,
                )
        return array
    if isinstance(value, np.ndarray):
        if value.dtype != dtype.numpy:
            raise InvalidInputError(
                f"model '{model}', input '{spec.name}': expected data type {dtype.wire_name} "
                f"(numpy {dtype.numpy}), got numpy {value.dtype}",
                model=model, input=spec.name,
            )
        return value
    if type(value).__module__.startswith("torch"):
        return _as_array(model, spec, value.detach().cpu().numpy())
    try:
        return np.asarray(value, dtype=dtype.numpy)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"model '{model}', input '{spec.name}': expected values convertible to {dtype.wire_name}, got {exc}",
            model=model, input=spec.name,
        ) from exc
