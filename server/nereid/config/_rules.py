"""Cross-field rules of a model config, checked once on the records after load.py's walk.

Owns the rules that relate fields to each other (Triton's ValidateModelConfig family plus
nereid's extensions). Knows nothing about TOML or JSON: it sees only schema records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NoReturn

from nereid.config._walk import key_path, render
from nereid.config.schema import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelWarmup,
)
from nereid.errors import ConfigError

__all__ = ["check_rules"]

_NOT_BATCHING = "max_batch_size is 0: the model does not batch"


def check_rules(config: ModelConfig, *, source: str, folder_name: str) -> None:
    """Raise ConfigError for the first rule ``config`` breaks; ``folder_name`` is the model
    folder's name (empty when there is none to compare with)."""
    rules = _Rules(source)
    rules.name(config.name, folder_name)
    rules.tensors("input", config.input, config.max_batch_size)
    rules.tensors("output", config.output, config.max_batch_size)
    for index, tensor in enumerate(config.input):
        rules.input(f"input[{index}]", tensor, config.max_batch_size)
    if config.dynamic_batching is not None:
        rules.dynamic_batching(config.dynamic_batching, config.max_batch_size)
    for index, group in enumerate(config.instance_group):
        rules.instance_group(f"instance_group[{index}]", group)
    rules.isolation_by_name(config.instance_group)
    for index, warmup in enumerate(config.model_warmup):
        rules.warmup(f"model_warmup[{index}]", warmup, config)


class _Rules:
    """The rules, one method per part of the config, sharing the file name for errors."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, expected: str, value: object) -> NoReturn:
        raise ConfigError(self.source, where, expected=expected, got=render(value))

    def detail(self, where: str, detail: str) -> NoReturn:
        raise ConfigError(self.source, where, detail=detail)

    def name(self, name: str, folder_name: str) -> None:
        if not name:
            self.fail("name", "a non-empty string", name)
        if folder_name and name != folder_name:
            self.fail("name", f"{render(folder_name)} (the folder name)", name)

    def tensors(
        self, section: str, tensors: Sequence[ModelInput | ModelOutput], max_batch_size: int
    ) -> None:
        first_index: dict[str, int] = {}
        for index, tensor in enumerate(tensors):
            where = f"{section}[{index}]"
            if tensor.name in first_index:
                other = f"{section}[{first_index[tensor.name]}]"
                self.detail(
                    f"{where}.name", f"duplicate name {render(tensor.name)} ({other} has it too)"
                )
            first_index[tensor.name] = index
            if tensor.reshape is not None:
                self.reshape(f"{where}.reshape.shape", tensor.dims, tensor.reshape, max_batch_size)

    def reshape(
        self, where: str, dims: tuple[int, ...], shape: tuple[int, ...], max_batch_size: int
    ) -> None:
        if not shape and max_batch_size == 0:
            # An empty reshape drops the only dimension: a scalar, which Triton does not have.
            self.fail(where, f"a non-empty shape ({_NOT_BATCHING})", list(shape))
        if not _reshape_fits(dims, shape):
            expected = f"a shape with the element count of dims {render(dims)}"
            self.fail(where, expected + " (between matching -1 dims)", list(shape))

    def input(self, where: str, tensor: ModelInput, max_batch_size: int) -> None:
        if tensor.format != "FORMAT_NONE" and len(tensor.dims) != 3:
            self.fail(f"{where}.dims", f"3 dims for format {tensor.format}", list(tensor.dims))
        if tensor.pad_value is None:
            return
        where = f"{where}.pad_value"
        if max_batch_size == 0:
            self.detail(
                where, f"needs max_batch_size > 0 to pad requests into a batch ({_NOT_BATCHING})"
            )
        if -1 not in tensor.dims:
            self.detail(
                where,
                f"needs a -1 (variable-size) dimension to pad, got dims {render(tensor.dims)}",
            )
        # Padding casts the value to the input's dtype, so refuse what would not survive it.
        bounds = _integer_bounds(tensor)
        value = tensor.pad_value
        if bounds is not None and (
            not isinstance(value, int) or not bounds[0] <= value <= bounds[1]
        ):
            expected = f"an integer in {bounds[0]}..{bounds[1]} ({tensor.data_type.config_name})"
            self.fail(where, expected, value)

    def dynamic_batching(self, batching: DynamicBatching, max_batch_size: int) -> None:
        where = "dynamic_batching"
        sizes = batching.preferred_batch_size
        if sizes and max_batch_size == 0:
            self.fail(
                f"{where}.preferred_batch_size", f"an empty list ({_NOT_BATCHING})", list(sizes)
            )
        if any(not 1 <= size <= max_batch_size for size in sizes):
            expected = f"sizes in 1..{max_batch_size} (max_batch_size)"
            self.fail(f"{where}.preferred_batch_size", expected, list(sizes))
        levels = batching.priority_levels
        # As in Triton, priorities are only checked when there are some: with
        # priority_levels = 0 every request has the same priority and the rest is unused.
        if levels > 0:
            in_range = f"in 1..{levels} (priority_levels)"
            if not 1 <= batching.default_priority_level <= levels:
                self.fail(
                    f"{where}.default_priority_level",
                    f"an integer {in_range}",
                    batching.default_priority_level,
                )
            for level in batching.priority_queue_policy:
                if level > levels:
                    self.fail(
                        key_path(f"{where}.priority_queue_policy", level),
                        f"a priority level {in_range}",
                        level,
                    )
        if batching.preserve_ordering:
            self.preserve_ordering(batching)

    def preserve_ordering(self, batching: DynamicBatching) -> None:
        # Triton's rules: reordering by priority or by delayed timeouts would break the order.
        where = "dynamic_batching"
        if batching.priority_levels > 1:
            self.fail(
                f"{where}.priority_levels",
                "0 or 1 when preserve_ordering is true",
                batching.priority_levels,
            )
        policies = [("default_queue_policy", batching.default_queue_policy)]
        policies += [
            (key_path("priority_queue_policy", k), v)
            for k, v in batching.priority_queue_policy.items()
        ]
        for name, policy in policies:
            if (
                policy is not None
                and policy.timeout_action == "DELAY"
                and policy.default_timeout_microseconds
            ):
                expected = '"REJECT" when preserve_ordering is true and a timeout is set'
                self.fail(f"{where}.{name}.timeout_action", expected, policy.timeout_action)

    def instance_group(self, where: str, group: InstanceGroup) -> None:
        # Triton: KIND_GPU and KIND_AUTO may list GPUs (AUTO falls back to CPU when one
        # is missing); KIND_CPU must not.
        if group.kind == "KIND_CPU" and group.gpus:
            self.fail(f"{where}.gpus", "no GPUs with kind KIND_CPU", list(group.gpus))
        # processes: how process instances are laid out; threads have none
        if group.processes and group.isolation == "thread":
            self.fail(f"{where}.processes", 'no processes with isolation = "thread" (or isolation = "process")',
                      group.processes)

    def isolation_by_name(self, groups: Sequence[InstanceGroup]) -> None:
        # The JSON form keys a group's isolation and processes by its name, so groups
        # sharing a name (which the loader allows) must share them too.
        first_index: dict[str, int] = {}
        for index, group in enumerate(groups):
            first = first_index.setdefault(group.name, index)
            for key in ("isolation", "processes"):
                theirs, mine = getattr(groups[first], key), getattr(group, key)
                if theirs != mine:
                    expected = (
                        f"{render(theirs) if theirs else 'no ' + key} (the {key} of instance_group[{first}], "
                        f"which has the same name {render(group.name)})"
                    )
                    self.fail(f"instance_group[{index}].{key}", expected, mine or "none")

    def warmup(self, where: str, warmup: ModelWarmup, config: ModelConfig) -> None:
        size = warmup.batch_size
        if config.max_batch_size == 0 and size != 1:
            self.fail(f"{where}.batch_size", f"1 ({_NOT_BATCHING})", size)
        if config.max_batch_size > 0 and size > config.max_batch_size:
            self.fail(
                f"{where}.batch_size",
                f"an integer in 1..{config.max_batch_size} (max_batch_size)",
                size,
            )
        names = ", ".join(tensor.name for tensor in config.input)
        for name, sample in warmup.inputs.items():
            spec = config.input_by_name(name)
            if spec is None:
                self.fail(f"{where}.inputs", f"names of the model's inputs ({names})", name)
            sample_where = key_path(f"{where}.inputs", name)
            if sample.data_type != spec.data_type:
                expected = f"{spec.data_type.config_name} (the data type of input {render(name)})"
                self.fail(f"{sample_where}.data_type", expected, sample.data_type.config_name)
            if not _shape_matches(spec.dims, sample.dims):
                expected = f"a shape matching dims {render(spec.dims)} of input {render(name)}"
                self.fail(f"{sample_where}.dims", expected, list(sample.dims))
        for spec in config.input:
            if not spec.optional and spec.name not in warmup.inputs:
                self.detail(
                    f"{where}.inputs",
                    f"missing input {render(spec.name)} (only optional inputs may be left out)",
                )


def _integer_bounds(tensor: ModelInput) -> tuple[int, int] | None:
    """The values an integer (or bool) input can hold; None for float and STRING inputs."""
    kind, bits = tensor.data_type.numpy.kind, 8 * tensor.data_type.itemsize
    if tensor.data_type.is_bytes or kind not in "biu":
        return None
    if kind == "b":
        return 0, 1
    if kind == "u":
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _shape_matches(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d in (-1, s) for d, s in zip(dims, shape))


def _element_count(shape: tuple[int, ...]) -> int:
    """Triton's GetElementCount: -1 with any -1 dim, 0 for an empty shape."""
    if -1 in shape:
        return -1
    return math.prod(shape) if shape else 0


def _chunks(shape: tuple[int, ...]) -> list[int]:
    """Element counts of the runs between -1 dims: [2, 4, -1, 6] -> [8, 6]."""
    counts = [1]
    for dim in shape:
        if dim == -1:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts


def _reshape_fits(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Triton's ValidateIOShape: same element count (an empty reshape takes a one-element
    dims), and with -1 dims the same count between each pair of them."""
    count, reshaped = _element_count(dims), _element_count(shape)
    if count != reshaped and not (reshaped == 0 and count == 1):
        return False
    return count != -1 or _chunks(dims) == _chunks(shape)
