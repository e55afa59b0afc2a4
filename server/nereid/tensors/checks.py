"""The one request-checking core: a request's inputs against its model config.

Every surface (HTTP infer, generate, the in-process API, later gRPC) decodes its own wire
format into facts about each input (datatype, shape, byte size) and asks this module
whether they fit the config: input names and count, the batch dimension, datatype, shape
against ``dims`` (-1 any size) and byte size. The rules and their order are Triton
core's (``InferenceRequest::Normalize``); a problem is raised as an ``InputProblem`` with
a reason ``code`` and its facts, and its text is rendered by the surface's renderer:
``triton_text`` (HTTP and gRPC: Triton's own messages), or a surface's own.

Knows nothing about wire formats, JSON or HTTP.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import DataType
from nereid.errors import InvalidInputError

__all__ = [
    "ConfigRules", "Facts", "InputFacts", "InputProblem", "Problem", "Renderer", "check_representable", "dims_text",
    "triton_text",
]

_I64_LIMIT = 1 << 63


class Problem(enum.Enum):
    """Why a request does not fit its model config (one reason per rule)."""

    INPUT_COUNT = "input count"  # too few / too many inputs, or a required one missing
    UNEXPECTED_INPUT = "unexpected input"  # a name the config does not have
    NO_BATCH_DIMENSION = "no batch dimension"  # a scalar input for a batching model
    BATCH_MISMATCH = "batch mismatch"  # inputs disagree on the batch size
    BATCH_SIZE = "batch size"  # batch larger than max_batch_size, or 0
    DATATYPE = "datatype"
    UNSPECIFIED_DIMENSION = "unspecified dimension"  # a negative dim in a request shape
    SHAPE = "shape"  # shape does not match [batch] + dims
    BYTE_SIZE = "byte size"  # data size does not match shape x element size
    TOO_LARGE = "too large"  # a shape no array can have


@dataclass(frozen=True)
class Facts:
    """What a renderer gets: the problem, the model, the input (when one is at fault),
    the request-id prefix the surface uses, and the rule's numbers (``detail``)."""

    problem: Problem
    model: str
    input: str | None
    prefix: str
    detail: Mapping[str, Any] = field(default_factory=dict)


#: Renders one problem as its message.
Renderer = Callable[[Facts], str]


class InputProblem(InvalidInputError):
    """A request that does not fit its model config (HTTP 400); ``code`` says which rule,
    ``facts`` holds what the message was rendered from."""

    def __init__(self, facts: Facts, render: Renderer) -> None:
        super().__init__(render(facts), model=facts.model, input=facts.input)
        self.code = facts.problem
        self.facts = facts


class InputFacts(Protocol):
    """One decoded input, as a surface describes it: ``size`` is its data's byte size
    (ignored for BYTES), ``negative`` whether its shape came with a negative dim."""

    @property
    def dt(self) -> DataType | None: ...  # None: not known to the surface (an unknown input)
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def size(self) -> int: ...
    @property
    def negative(self) -> bool: ...


def dims_text(dims: Iterable[int]) -> str:
    """Triton's ``[a,b,c]`` shape text (no spaces)."""
    return "[" + ",".join(str(d) for d in dims) + "]"


_SHAPE_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


#: Triton's one-line messages (``str.format``: ``prefix``, ``name`` the input, ``m`` the
#: model, and the problem's details); the others are built in ``triton_text``.
_TEXTS: dict[Problem, str] = {
    Problem.UNEXPECTED_INPUT: "unexpected inference input '{name}' for model '{m}'",
    Problem.NO_BATCH_DIMENSION: "{prefix}input '{name}' has no shape but model requires batch dimension for '{m}'",
    Problem.BATCH_MISMATCH: "{prefix}input '{name}' batch size does not match other inputs for '{m}'",
    Problem.DATATYPE: "{prefix}inference input '{name}' data-type is '{got}', but model '{m}' expects '{expected}'",
    Problem.BYTE_SIZE: "{prefix}input byte size mismatch for input '{name}' for model '{m}'. Expected {expected}, got {got}",
}


def triton_text(facts: Facts) -> str:
    """Triton's message for a problem, as tritonserver's core words it (§4.2)."""
    p, m, name, prefix, d = facts.problem, facts.model, facts.input, facts.prefix, facts.detail
    if p is Problem.INPUT_COUNT:
        missing = d["missing"]
        # Triton's string building drops the '[' when nothing is missing ("... input(s) ]").
        missing_text = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
        got_text = "[" + ",".join(f"'{n}'" for n in d["got"]) + "]"
        low, high = d["required"], d["inputs"]
        head = f"expected {high} inputs" if low == high else f"expected number of inputs between {low} and {high}"
        return (
            f"{prefix}{head} but got {len(d['got'])} inputs for model '{m}'. Got input(s) {got_text}, "
            f"but missing required input(s) {missing_text}. Please provide all required input(s)."
        )
    template = _TEXTS.get(p)
    if template is not None:
        return template.format(prefix=prefix, name=name, m=m, **d)
    if p is Problem.BATCH_SIZE:
        if d["batch"] == 0:  # Triton passes a zero batch on to the backend; a batcher cannot run it
            return f"{prefix}inference request batch-size must be between 1 and {d['max']} for '{m}', got 0"
        return f"{prefix}inference request batch-size must be <= {d['max']} for '{m}'"
    if p is Problem.UNSPECIFIED_DIMENSION:
        return f"{prefix}All input dimensions should be specified for input '{name}' for model '{m}', got {dims_text(d['got'])}"
    if p is Problem.SHAPE:
        note = _SHAPE_NOTE if d["batching"] else ""
        return (
            f"{prefix}unexpected shape for input '{name}' for model '{m}'. Expected {dims_text(d['expected'])}, "
            f"got {dims_text(d['got'])}. {note}"
        )
    assert p is Problem.TOO_LARGE
    return (
        f"invalid shape for input '{name}': shape {list(d['got'])} causes total element count to exceed "
        f"maximum size of {_I64_LIMIT - 1} (model '{m}')"
    )


class ConfigRules:
    """One model config's rules, precomputed once per served model version."""

    __slots__ = ("config", "inputs", "required_inputs", "required_names", "batching")

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.inputs: Mapping[str, ModelInput] = {tensor.name: tensor for tensor in config.input}
        self.required_names = tuple(tensor.name for tensor in config.input if not tensor.optional)
        self.required_inputs = len(self.required_names)
        self.batching = config.max_batch_size > 0

    def check_inputs(
        self, inputs: Mapping[str, InputFacts], model: str, prefix: str = "", render: Renderer = triton_text
    ) -> tuple[list[str], int]:
        """Every input of a request against the config, in Triton's order: the request
        (``check_request``), then each input's datatype, shape and byte size in check
        order. Returns (the names in check order, the request's rows). Raises InputProblem."""
        names, rows = self.check_request(inputs, model, prefix, render)
        for name in names:
            self.check_input(name, inputs[name], model, prefix, render)
        return names, rows

    def check_request(
        self, inputs: Mapping[str, InputFacts], model: str, prefix: str = "", render: Renderer = triton_text
    ) -> tuple[list[str], int]:
        """The request as a whole: input count, names, batch dimension and batch size
        (names visited sorted, as Triton does). Returns (the names in check order, the
        request's rows); each input is then checked with ``check_input`` (a surface that
        decodes inputs checks and decodes them one by one, in that order)."""
        config = self.config
        detail: dict[str, Any]
        count = len(inputs)
        if count > len(config.input) or count < self.required_inputs:
            raise self._count_problem(inputs, model, prefix, render)
        names = sorted(inputs) if count > 1 else list(inputs)
        batch, batch_input = -1, None
        for name in names:
            tensor = self.inputs.get(name)
            if tensor is None:
                detail = {"inputs": tuple(sorted(self.inputs))}
                raise InputProblem(Facts(Problem.UNEXPECTED_INPUT, model, name, prefix, detail), render)
            if not self.batching or tensor.is_shape_tensor:
                continue
            shape = inputs[name].shape
            if not shape:
                detail = {"expected": (-1, *tensor.dims), "got": shape}
                raise InputProblem(Facts(Problem.NO_BATCH_DIMENSION, model, name, prefix, detail), render)
            if batch == -1:
                batch, batch_input = shape[0], name
            elif shape[0] != batch:
                detail = {"expected": batch, "got": shape[0]}
                raise InputProblem(Facts(Problem.BATCH_MISMATCH, model, name, prefix, detail), render)
        if count < len(config.input) and any(name not in inputs for name in self.required_names):
            # Triton only compares counts, so a required input replaced by an optional one
            # would reach the model; nereid refuses it with the same message.
            raise self._count_problem(inputs, model, prefix, render)
        if self.batching and batch != -1 and not 0 < batch <= config.max_batch_size:
            detail = {"batch": batch, "max": config.max_batch_size}
            raise InputProblem(Facts(Problem.BATCH_SIZE, model, batch_input, prefix, detail), render)
        return names, batch if batch > 0 else 1

    def check_input(
        self, name: str, item: InputFacts, model: str, prefix: str = "", render: Renderer = triton_text
    ) -> None:
        """One input's datatype, shape (against [batch] + dims) and byte size."""
        tensor = self.inputs[name]
        if item.dt is not tensor.data_type:
            types = {"got": item.dt.wire_name if item.dt is not None else "?", "expected": tensor.data_type.wire_name}
            raise InputProblem(Facts(Problem.DATATYPE, model, name, prefix, types), render)
        shape = item.shape
        batched = self.batching and not tensor.is_shape_tensor
        dims = shape[1:] if batched else shape
        config_dims = tensor.dims
        if dims != config_dims or item.negative:
            matches = len(dims) == len(config_dims)
            if matches:
                for got, want in zip(dims, config_dims):
                    if got < 0:
                        raise InputProblem(
                            Facts(Problem.UNSPECIFIED_DIMENSION, model, name, prefix, {"got": shape}), render
                        )
                    if want != -1 and want != got:
                        matches = False
                        break
            if not matches:
                detail: dict[str, Any] = {
                    "expected": ((-1,) if batched else ()) + config_dims, "got": shape, "batching": self.batching,
                }
                raise InputProblem(Facts(Problem.SHAPE, model, name, prefix, detail), render)
        if tensor.data_type.is_bytes:
            return  # BYTES framing is the surface's to check, while decoding the elements
        expected_size = math.prod(shape) * tensor.data_type.itemsize
        if expected_size != item.size:
            sizes = {"expected": expected_size, "got": item.size}
            raise InputProblem(Facts(Problem.BYTE_SIZE, model, name, prefix, sizes), render)

    def _count_problem(
        self, inputs: Mapping[str, InputFacts], model: str, prefix: str, render: Renderer
    ) -> InputProblem:
        detail = {
            "missing": [t.name for t in self.config.input if not t.optional and t.name not in inputs],
            "got": sorted(inputs),
            "required": self.required_inputs,
            "inputs": len(self.config.input),
        }
        return InputProblem(Facts(Problem.INPUT_COUNT, model, None, prefix, detail), render)


def check_representable(shape: tuple[int, ...], dt: DataType, name: str, model: str) -> None:
    """Refuse a shape no array can have: the non-zero dims times the element size must fit
    in int64 even when another dim is 0 (numpy checks that, and so would any buffer)."""
    size = max(dt.itemsize, 1)
    for dim in shape:
        if dim > 1:
            if size > (_I64_LIMIT - 1) // dim:
                raise InputProblem(Facts(Problem.TOO_LARGE, model, name, "", {"got": shape}), triton_text)
            size *= dim
