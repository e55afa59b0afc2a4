"""An ensemble checked against its step models' configs (Triton's ValidateEnsembleConfig).

Owns the rules that need the step models: each step's maps name real inputs and outputs,
every required input is fed, each ensemble tensor has one datatype and one shape wherever
it is read or written, and no step allows a smaller batch than the ensemble. Pure: configs
in, a message out. The rules of the ensemble's own config alone are
``nereid.config.ensemble``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nereid.config.schema import EnsembleStep, ModelConfig, ModelInput, ModelOutput
from nereid.datatypes import DataType
from nereid.tensors.checks import dims_text

__all__ = ["decoupled_problem", "ensemble_problem", "shapes_match"]


@dataclass(frozen=True, slots=True)
class _Tensor:
    """An ensemble tensor as one model sees it: datatype, dims, and dims with the batch."""

    model: str
    data_type: DataType
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def shapes_match(one: Sequence[int], other: Sequence[int]) -> bool:
    """Triton's CompareDimsWithWildcard: the same rank, each dim equal or -1 on a side."""
    return len(one) == len(other) and all(a == b or a == -1 or b == -1 for a, b in zip(one, other))


def ensemble_problem(config: ModelConfig, steps: Sequence[ModelConfig]) -> str | None:
    """Why ``config`` (an ensemble) cannot run its steps, whose models' configs are
    ``steps`` (in step order), in Triton's words; None when it can."""
    assert config.ensemble_scheduling is not None
    name = config.name
    tensors: dict[str, _Tensor] = {}
    ios: list[ModelInput | ModelOutput] = [*config.input, *config.output]
    for io in ios:
        tensors[io.name] = _node(name, config.max_batch_size, io)
    for step, step_config in zip(config.ensemble_scheduling.step, steps):
        if 0 < step_config.max_batch_size < config.max_batch_size:
            return (f"ensemble '{name}' allows maximum batch size {config.max_batch_size}, but it contains model "
                    f"'{step.model_name}' which only allows maximum batch size to be {step_config.max_batch_size}")
        problem = _mapping_problem(name, step, step_config, tensors)
        if problem is not None:
            return problem
    return decoupled_problem(config, steps)[0]


def _mapping_problem(
    ensemble: str, step: EnsembleStep, config: ModelConfig, tensors: dict[str, _Tensor]
) -> str | None:
    model = step.model_name
    prefix = f"in ensemble '{ensemble}', "
    for step_input, tensor in step.input_map.items():
        if step_input not in config.inputs_by_name:
            return f"{prefix}ensemble tensor '{tensor}' is mapping to non-existing input '{step_input}' in model '{model}'"
    for model_input in config.input:
        mapped = step.input_map.get(model_input.name)
        if mapped is None:
            if model_input.optional:
                continue
            return f"{prefix}input '{model_input.name}' in model '{model}' is not mapped to any ensemble tensors"
        problem = _consistency(prefix, mapped, _node(model, config.max_batch_size, model_input), tensors)
        if problem is not None:
            return problem
    for step_output, tensor in step.output_map.items():
        output = config.outputs_by_name.get(step_output)
        if output is None:
            return f"{prefix}ensemble tensor '{tensor}' is mapped from non-existing output '{step_output}' in model '{model}'"
        problem = _consistency(prefix, tensor, _node(model, config.max_batch_size, output), tensors)
        if problem is not None:
            return problem
    return None


def decoupled_problem(config: ModelConfig, steps: Sequence[ModelConfig]) -> tuple[str | None, bool]:
    """Triton's rule for decoupled steps: each response of a decoupled step runs the steps
    after it once more, so every step's inputs must come from one flow (the ensemble's
    inputs, or one decoupled step's responses). Returns (why not, in Triton's words, or
    None; whether the ensemble is decoupled: a step of it is)."""
    assert config.ensemble_scheduling is not None
    labels = {tensor.name: 0 for tensor in config.input}  # the flow each tensor comes from
    waiting = list(zip(config.ensemble_scheduling.step, steps))
    fresh = 0
    while waiting:
        ready = [(s, c) for s, c in waiting if all(t in labels for t in s.input_map.values())]
        if not ready:  # pragma: no cover - the config's own check refuses what never runs
            break
        for step, step_config in ready:
            waiting.remove((step, step_config))
            flows = {labels[tensor] for tensor in step.input_map.values()}
            if len(flows) > 1:
                return (f"in ensemble '{config.name}', step of model '{step.model_name}' receives inputs originated "
                        "from different decoupled models"), False
            label = flows.pop()
            if step_config.decoupled:
                fresh += 1
                label = fresh
            labels.update((tensor, label) for tensor in step.output_map.values())
    return None, fresh > 0


def _node(model: str, max_batch_size: int, io: ModelInput | ModelOutput) -> _Tensor:
    dims = io.reshape if io.reshape is not None else io.dims
    return _Tensor(model, io.data_type, dims, ((-1,) if max_batch_size > 0 else ()) + dims)


def _consistency(prefix: str, name: str, tensor: _Tensor, tensors: dict[str, _Tensor]) -> str | None:
    """The first model's view of ensemble tensor ``name`` against ``tensor`` (recorded
    when it is the first)."""
    known = tensors.setdefault(name, tensor)
    if known.data_type is not tensor.data_type:
        return (f"{prefix}ensemble tensor '{name}': inconsistent data type: {known.data_type.config_name} is inferred "
                f"from model '{known.model}' while {tensor.data_type.config_name} is inferred from model '{tensor.model}'")
    # A tensor read by a batching and a non-batching model is consistent when the
    # non-batching one's shape is the batching one's with the batch dimension in front.
    if not shapes_match(known.dims, tensor.dims) and not shapes_match(known.full_dims, tensor.full_dims):
        return (f"{prefix}ensemble tensor '{name}': inconsistent shape: {dims_text(known.full_dims)} is inferred from "
                f"model '{known.model}' while {dims_text(tensor.full_dims)} is inferred from model '{tensor.model}'")
    return None
