"""The request of Triton's generate extension (``/generate``, ``/generate_stream``): a
JSON object whose keys named like model inputs become input tensors and whose other keys
(and its ``parameters`` object) become request parameters.

Owns turning that JSON into an InferRequest; the inputs are then checked by the one
checking core (``nereid.tensors.checks``), its problems worded for this JSON form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from nereid.config.schema import ModelConfig, ModelInput
from nereid.errors import InvalidInputError, MalformedRequestError
from nereid.inference import InferRequest, ParameterValue
from nereid.tensors.checks import ConfigRules, Facts, Problem, triton_text

__all__ = ["parse_generate_request"]

_U64_LIMIT = 1 << 64


def parse_generate_request(
    body: bytes, config: ModelConfig, *, model_name: str, model_version: int | None = None
) -> InferRequest:
    """A generate request body -> an InferRequest for ``config``'s model.

    The body is a JSON object. A key named like a model input becomes that input: a
    scalar is one element, a list (nested lists are flattened) its elements, typed by the
    config input (STRING inputs as UTF-8 bytes; JSON strings only; integers range-checked;
    booleans only for BOOL). The shape is the config ``dims`` with a ``-1`` taking the
    element count, prefixed by a batch dimension of 1 when the model batches. ``id`` (a
    string) is the request id, echoed in the response. The ``parameters`` object and
    every other key become request parameters (string, number or boolean; ``parameters``
    wins over a top-level key of the same name); ``priority`` and ``timeout`` (unsigned
    integers) are the scheduling fields of the infer protocol, ``triton_*`` is reserved.

    Raises MalformedRequestError (bad JSON, 500 as in Triton) or InvalidInputError (400).
    """
    root = _json_object(body)
    where = f"generate request for model '{model_name}'"
    request_id = root.get("id", "")
    if type(request_id) is not str:
        raise InvalidInputError(f"{where}: field 'id': expected a JSON string, got {_json_kind(request_id)}")
    explicit = root.get("parameters", {})
    if type(explicit) is not dict:
        raise InvalidInputError(f"{where}: field 'parameters': expected a JSON object, got {_json_kind(explicit)}")
    inputs: dict[str, np.ndarray] = {}
    specs: dict[str, ModelInput] = {}
    merged: list[tuple[str, Any, str]] = []
    for key, value in root.items():
        if key in ("id", "parameters"):
            continue
        spec = config.input_by_name(key)
        if spec is not None:
            inputs[key] = _input_array(value, spec, config.max_batch_size > 0, model_name)
            specs[key] = spec
        else:
            merged.append((key, value, f"field '{key}' (not an input of the model, so a request parameter)"))
    merged.extend((key, value, f"parameter '{key}'") for key, value in explicit.items())
    custom: dict[str, ParameterValue] = {}
    priority, timeout_us = _parameters(merged, custom, where)
    facts = {name: _Facts(array, specs[name]) for name, array in inputs.items()}
    ConfigRules(config).check_inputs(facts, model_name, render=_problem_text(where, root, config))
    return InferRequest(
        model_name=model_name,
        inputs=inputs,
        rows=1,
        id=request_id,
        model_version=model_version,
        parameters=custom,
        priority=priority,
        timeout_us=timeout_us,
    )


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        root = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequestError(f"failed to parse the request JSON buffer: {exc}") from None
    if type(root) is not dict:
        raise MalformedRequestError(
            f"failed to parse the request JSON buffer: expected a JSON object, got {_json_kind(root)}"
        )
    return root


def _parameters(
    merged: list[tuple[str, Any, str]], custom: dict[str, ParameterValue], where: str
) -> tuple[int, int | None]:
    """The request parameters (key, value, how the message names it), in order:
    (priority, timeout_us); the others go into ``custom``."""
    priority = 0
    timeout_us: int | None = None
    for key, value, what in merged:
        if key.startswith("triton_"):
            raise InvalidInputError(
                f"{where}: {what}: parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        if key in ("priority", "timeout"):
            if type(value) is not int or not 0 <= value < _U64_LIMIT:
                raise InvalidInputError(f"{where}: {what}: expected an unsigned integer, got {_describe(value)}")
            if key == "priority":
                priority = value
            else:
                timeout_us = value
            continue
        if type(value) not in (str, int, bool, float):
            raise InvalidInputError(
                f"{where}: {what}: expected a JSON string, number or boolean, got {_json_kind(value)}"
            )
        custom[key] = value
    return priority, timeout_us


def _problem_text(where: str, root: dict[str, Any], config: ModelConfig) -> Callable[[Facts], str]:
    """How the checking core's problems read for this JSON form."""

    def render(facts: Facts) -> str:
        if facts.problem is Problem.INPUT_COUNT:  # the only one a JSON key can cause: inputs are made to fit
            wanted = ", ".join(f"'{name}'" for name in facts.detail["missing"])
            fields = ", ".join(f"'{key}'" for key in root) or "none"
            return (
                f"{where}: missing required input(s) {wanted}: send each as a top-level JSON field "
                f"(model inputs: {', '.join(repr(spec.name) for spec in config.input)}; got fields: {fields})"
            )
        return f"{where}: {triton_text(facts)}"

    return render


class _Facts:
    """An input made by ``_input_array`` as the checking core reads it."""

    __slots__ = ("dt", "shape", "size", "negative")

    def __init__(self, array: np.ndarray, spec: ModelInput) -> None:
        self.dt = spec.data_type
        self.shape: tuple[int, ...] = array.shape
        self.size = array.nbytes
        self.negative = False


def _input_array(value: Any, spec: ModelInput, batching: bool, model_name: str) -> np.ndarray:
    dt = spec.data_type
    where = f"model '{model_name}', input '{spec.name}' ({dt.wire_name}, dims {list(spec.dims)})"
    elements = _flatten(value) if type(value) is list else [value]
    if dt.is_bytes:
        bad = next((e for e in elements if type(e) is not str), _NONE)
        if bad is not _NONE:
            raise InvalidInputError(
                f"{where}: expected a JSON string (or a list of them), got {_describe(bad)}",
                model=model_name,
                input=spec.name,
            )
        array = np.empty(len(elements), dtype=object)
        array[:] = [e.encode("utf-8") for e in elements]
    else:
        kind = dt.numpy.kind
        low = high = 0
        if kind == "b":
            expected = "a JSON boolean"
        elif kind in "iu":
            info = np.iinfo(dt.numpy)
            low, high = int(info.min), int(info.max)
            expected = f"a JSON integer in [{low}, {high}]"
        else:
            expected = "a JSON number"
        bad = next((e for e in elements if not _element_ok(e, kind, low, high)), _NONE)
        if bad is not _NONE:
            raise InvalidInputError(
                f"{where}: expected {expected} (or a list of them), got {_describe(bad)}",
                model=model_name,
                input=spec.name,
            )
        collect = np.float64 if kind not in "biu" else dt.numpy
        array = np.array(elements, dtype=collect).astype(dt.numpy, copy=False)
    shape = _shape_for(spec.dims, len(elements))
    if shape is None:
        raise InvalidInputError(
            f"{where}: {len(elements)} element(s) do not fit dims {list(spec.dims)}",
            model=model_name,
            input=spec.name,
        )
    return array.reshape(((1,) if batching else ()) + shape)


_NONE = object()


def _element_ok(element: Any, kind: str, low: int, high: int) -> bool:
    if kind == "b":
        return type(element) is bool
    if kind in "iu":
        return type(element) is int and low <= element <= high
    return type(element) is int or type(element) is float


def _flatten(value: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _shape_for(dims: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """The shape with ``dims``' fixed sizes holding ``count`` elements: the last ``-1``
    takes what is left (other ``-1`` are 1); None when they do not fit."""
    fixed = math.prod(d for d in dims if d != -1)
    variable = [axis for axis, d in enumerate(dims) if d == -1]
    if not variable:
        return tuple(dims) if fixed == count else None
    if fixed == 0:
        return None if count else tuple(0 if d == -1 else d for d in dims)
    if count % fixed:
        return None
    shape = [1 if d == -1 else d for d in dims]
    shape[variable[-1]] = count // fixed
    return tuple(shape)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "boolean"
    if type(value) in (int, float):
        return "number"
    if type(value) is str:
        return "string"
    if type(value) is list:
        return "array"
    return "object"


def _describe(value: Any) -> str:
    kind = _json_kind(value)
    if kind in ("object", "array"):
        return f"JSON {kind}"
    text = orjson.dumps(value).decode()
    if len(text) > 40:
        text = text[:37] + "..."
    return f"JSON {kind} {text}"
