"""The Triton JSON spelling of a model config, both ways: render a ModelConfig for
/v2/models/{name}/config, and reshape a JSON override into config.toml's shape.

The only module that knows the JSON form; validation stays in load.py's walk.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping

from nereid.config._walk import key_path, render
from nereid.config.sequence_batching import render_sequence_batching
from nereid.config.schema import (
    DynamicBatching,
    EnsembleScheduling,
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelWarmup,
    QueuePolicy,
    VersionPolicy,
)
from nereid.errors import ConfigError

__all__ = ["to_triton_json", "toml_shaped"]

#: nereid's extensions travel as parameters (never invented top-level fields), so stock
#: clients parse the JSON; load.py refuses user parameters with these names.
MAX_CONCURRENT_BATCHES = "max_concurrent_batches"
PAD_VALUE_PREFIX = "pad_value."
EXECUTION_TIMEOUT_MS = "execution_timeout_ms"
INPUT_TENSORS = "input_tensors"
#: ``instance_group.<group name>.isolation`` and ``...processes``, present for groups that
#: set them.
ISOLATION_PREFIX = "instance_group."
ISOLATION_SUFFIX = ".isolation"
PROCESSES_SUFFIX = ".processes"
#: the per-group keys carried as ``instance_group.<group name>.<key>`` parameters
_GROUP_KEYS = {ISOLATION_SUFFIX: "isolation", PROCESSES_SUFFIX: "processes"}


def isolation_parameter(group_name: str, suffix: str = ISOLATION_SUFFIX) -> str:
    """The parameter that carries a group's ``isolation`` (or, with PROCESSES_SUFFIX, its
    ``processes``) in the JSON form."""
    return ISOLATION_PREFIX + group_name + suffix


def isolation_group_name(parameter: str, suffix: str = ISOLATION_SUFFIX) -> str | None:
    """The group an ``instance_group.<name>.isolation`` parameter (or ``<suffix>``) names,
    else None."""
    if (
        parameter.startswith(ISOLATION_PREFIX)
        and parameter.endswith(suffix)
        and len(parameter) > len(ISOLATION_PREFIX) + len(suffix)
    ):
        return parameter[len(ISOLATION_PREFIX) : -len(suffix)]
    return None


_OPTIMIZATION = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}

# Triton fields nereid has no use for, with the value Triton shows when they are unset.
# A JSON config may carry them (to_triton_json writes most of them) but only so.
_UNUSED_TOP = {
    "batch_input": [],
    "batch_output": [],
    # What Triton shows, plus the sub-messages a hand-written JSON may spell out unset.
    "optimization": {
        **_OPTIMIZATION,
        "graph": {"level": 0},
        "cuda": {
            "graphs": False,
            "busy_wait_events": False,
            "graph_spec": [],
            "output_copy_stream": False,
        },
        "execution_accelerators": {
            "gpu_execution_accelerator": [],
            "cpu_execution_accelerator": [],
        },
    },
    "cc_model_filenames": {},
    "metric_tags": {},
    "model_operations": {"op_library_filename": []},
    "model_repository_agents": {"agents": []},
    "response_cache": {"enable": False},
    "model_metrics": {"metric_control": []},
}
_UNUSED_IO = {"is_non_linear_format_io": False}
_UNUSED_GROUP = {
    "secondary_devices": [],
    "profile": [],
    "passive": False,
    "host_policy": "",
    "rate_limiter": {"resources": [], "priority": 0},
}
_INTEGER = re.compile(r"-?[0-9]+")


def to_triton_json(config: ModelConfig) -> dict[str, object]:
    """``config`` as Triton's ``/config`` endpoint shows it: protobuf JSON with every scalar,
    list and map present, unset sub-messages left out, enums by name, int64s as numbers.
    Deterministic: equal configs render to equal dicts with equal key order."""
    rendered: dict[str, object] = {
        "name": config.name,
        "platform": config.platform,
        "backend": config.backend,
        "runtime": config.runtime,
        "version_policy": _version_policy(config.version_policy),
        "max_batch_size": config.max_batch_size,
        "input": [_input(tensor) for tensor in config.input],
        "output": [_output(tensor) for tensor in config.output],
        "batch_input": [],
        "batch_output": [],
    }
    if config.ensemble_scheduling is None:  # Triton fills no optimization for an ensemble
        rendered["optimization"] = copy.deepcopy(_OPTIMIZATION)
    if config.dynamic_batching is not None:
        rendered["dynamic_batching"] = _dynamic_batching(config.dynamic_batching)
    if config.sequence_batching is not None:
        rendered["sequence_batching"] = render_sequence_batching(config.sequence_batching)
    if config.ensemble_scheduling is not None:
        rendered["ensemble_scheduling"] = _ensemble_scheduling(config.ensemble_scheduling)
    rendered.update(
        {
            "instance_group": [_instance_group(group) for group in config.instance_group],
            "default_model_filename": config.default_model_filename,
            "cc_model_filenames": {},
            "metric_tags": {},
            "parameters": _parameters(config),
            "model_warmup": [_warmup(warmup) for warmup in config.model_warmup],
            # Triton's python backend always sets it, and perf_analyzer reads it.
            "model_transaction_policy": {"decoupled": config.decoupled},
        }
    )
    return rendered


def _ensemble_scheduling(scheduling: EnsembleScheduling) -> dict[str, object]:
    return {
        "step": [
            {
                "model_name": step.model_name,
                "model_version": step.model_version,
                "input_map": dict(step.input_map),
                "output_map": dict(step.output_map),
                "model_namespace": "",
            }
            for step in scheduling.step
        ]
    }


def _version_policy(policy: VersionPolicy) -> dict[str, object]:
    if policy.kind == "all":
        return {"all": {}}
    if policy.kind == "specific":
        return {"specific": {"versions": list(policy.versions)}}
    return {"latest": {"num_versions": policy.num_versions}}


def _input(tensor: ModelInput) -> dict[str, object]:
    return _tensor(
        tensor,
        {"format": tensor.format},
        {
            "is_shape_tensor": tensor.is_shape_tensor,
            "allow_ragged_batch": tensor.allow_ragged_batch,
            "optional": tensor.optional,
        },
    )


def _output(tensor: ModelOutput) -> dict[str, object]:
    return _tensor(tensor, {}, {"label_filename": tensor.label_filename, "is_shape_tensor": tensor.is_shape_tensor})


def _tensor(
    tensor: ModelInput | ModelOutput, before_dims: dict[str, object], after_reshape: dict[str, object]
) -> dict[str, object]:
    """An input or output in Triton's field order: name, data type, ``before_dims``, dims,
    reshape (when set), ``after_reshape``, then the unused flag."""
    rendered: dict[str, object] = {
        "name": tensor.name,
        "data_type": tensor.data_type.config_name,
        **before_dims,
        "dims": list(tensor.dims),
    }
    if tensor.reshape is not None:
        rendered["reshape"] = {"shape": list(tensor.reshape)}
    rendered.update(after_reshape, is_non_linear_format_io=False)
    return rendered


def _dynamic_batching(batching: DynamicBatching) -> dict[str, object]:
    rendered: dict[str, object] = {
        "preferred_batch_size": list(batching.preferred_batch_size),
        "max_queue_delay_microseconds": batching.max_queue_delay_microseconds,
        "preserve_ordering": batching.preserve_ordering,
        "priority_levels": batching.priority_levels,
        "default_priority_level": batching.default_priority_level,
    }
    if batching.default_queue_policy is not None:
        rendered["default_queue_policy"] = _queue_policy(batching.default_queue_policy)
    # protobuf's JSON form writes map keys as strings, even uint64 ones.
    levels = sorted(batching.priority_queue_policy)
    rendered["priority_queue_policy"] = {
        str(level): _queue_policy(batching.priority_queue_policy[level]) for level in levels
    }
    return rendered


def _queue_policy(policy: QueuePolicy) -> dict[str, object]:
    return {
        "timeout_action": policy.timeout_action,
        "default_timeout_microseconds": policy.default_timeout_microseconds,
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


def _instance_group(group: InstanceGroup) -> dict[str, object]:
    return {
        "name": group.name,
        "kind": group.kind,
        "count": group.count,
        "gpus": list(group.gpus),
        "secondary_devices": [],
        "profile": [],
        "passive": False,
        "host_policy": "",
    }


def _parameters(config: ModelConfig) -> dict[str, object]:
    values = dict(config.parameters)
    batching = config.dynamic_batching
    if batching is not None and batching.max_concurrent_batches != 1:
        values[MAX_CONCURRENT_BATCHES] = str(batching.max_concurrent_batches)
    for tensor in config.input:
        if tensor.pad_value is not None:
            values[PAD_VALUE_PREFIX + tensor.name] = str(tensor.pad_value)
    for group in config.instance_group:
        # as set: not set ("") is left out (its default depends on the device)
        if group.isolation:
            values[isolation_parameter(group.name)] = group.isolation
        if group.processes:
            values[isolation_parameter(group.name, PROCESSES_SUFFIX)] = group.processes
    if config.execution_timeout_ms:
        values[EXECUTION_TIMEOUT_MS] = str(config.execution_timeout_ms)
    if config.input_tensors != "numpy":
        values[INPUT_TENSORS] = config.input_tensors
    # Sorted: two equal configs may hold their parameters in different insertion orders.
    return {key: {"string_value": values[key]} for key in sorted(values)}


def _warmup(warmup: ModelWarmup) -> dict[str, object]:
    inputs: dict[str, object] = {}
    for name in sorted(warmup.inputs):
        sample = warmup.inputs[name]
        rendered: dict[str, object] = {
            "data_type": sample.data_type.config_name,
            "dims": list(sample.dims),
        }
        # A protobuf oneof: only the member that is set appears.
        if sample.zero_data:
            rendered["zero_data"] = True
        elif sample.random_data:
            rendered["random_data"] = True
        else:
            rendered["input_data_file"] = sample.input_data_file
        inputs[name] = rendered
    return {
        "name": warmup.name,
        "batch_size": warmup.batch_size,
        "inputs": inputs,
        "count": warmup.count,
    }


# -- JSON -> config.toml's shape --------------------------------------------------------


def toml_shaped(obj: object, *, source: str, folder_name: str = "") -> dict[str, object]:
    """A Triton JSON config reshaped as config.toml would hold it, for load.py's walk:
    nulls dropped (protobuf reads them as unset), fields nereid does not use removed when
    they hold their default (ConfigError otherwise), and nereid's extensions moved from
    ``parameters`` back to their fields. ``folder_name`` is the model name when the JSON
    gives none (unnamed groups are named after it). ``obj`` itself is left untouched."""
    if not isinstance(obj, Mapping):
        raise ConfigError(source, "", expected="a JSON object", got=render(obj))
    data = _without_nulls(obj)
    assert isinstance(data, dict)
    _drop_unused(data, "", _UNUSED_TOP, source)
    for section, unused in (
        ("input", _UNUSED_IO),
        ("output", _UNUSED_IO),
        ("instance_group", _UNUSED_GROUP),
    ):
        items = data.get(section)
        if isinstance(items, list):
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    _drop_unused(item, f"{section}[{index}]", unused, source)
    _extensions_from_parameters(data, source, folder_name)
    return data


def _without_nulls(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _drop_unused(
    table: dict[str, object], where: str, unused: Mapping[str, object], source: str
) -> None:
    for key, default in unused.items():
        if key not in table:
            continue
        value = table.pop(key)
        if not _is_default(value, default):
            expected = "its default value (nereid does not use this Triton field)"
            raise ConfigError(source, key_path(where, key), expected=expected, got=render(value))


def _is_default(value: object, default: object) -> bool:
    """Whether a JSON value means the same as ``default``; a partial object matches when
    every key it has does (protobuf fills the rest)."""
    if isinstance(default, dict):
        return isinstance(value, dict) and all(
            key in default and _is_default(item, default[key]) for key, item in value.items()
        )
    if isinstance(default, list):
        return value == []
    if isinstance(default, bool):
        return value is default
    if isinstance(default, int):
        return (
            not isinstance(value, bool)
            and isinstance(value, (int, str))
            and str(value) == str(default)
        )
    # Strings: enum names (case-insensitive in Triton's parser) and plain strings alike.
    return isinstance(value, str) and isinstance(default, str) and value.upper() == default.upper()


def _extensions_from_parameters(data: dict[str, object], source: str, folder_name: str) -> None:
    parameters = data.get("parameters")
    if not isinstance(parameters, dict):
        return
    _execution_timeout_from_parameters(data, parameters, source)
    _input_tensors_from_parameters(data, parameters, source)
    _isolation_from_parameters(data, parameters, source, folder_name)
    batching = data.get("dynamic_batching")
    inputs = data.get("input")
    by_name = {
        item.get("name"): item
        for item in (inputs if isinstance(inputs, list) else [])
        if isinstance(item, dict)
    }
    for key in [key for key in parameters if isinstance(key, str)]:
        where = key_path("parameters", key)
        if key == MAX_CONCURRENT_BATCHES and isinstance(batching, dict):
            batching[key] = _number(parameters.pop(key), where, source, integer=True)
        elif key.startswith(PAD_VALUE_PREFIX) and key[len(PAD_VALUE_PREFIX) :] in by_name:
            tensor = by_name[key[len(PAD_VALUE_PREFIX) :]]
            tensor["pad_value"] = _number(parameters.pop(key), where, source, integer=False)
        # Anything else stays a parameter; load.py refuses the reserved names left over.


def _execution_timeout_from_parameters(
    data: dict[str, object], parameters: dict[object, object], source: str
) -> None:
    if EXECUTION_TIMEOUT_MS not in parameters:
        return
    where = key_path("parameters", EXECUTION_TIMEOUT_MS)
    value = _number(parameters.pop(EXECUTION_TIMEOUT_MS), where, source, integer=True)
    if EXECUTION_TIMEOUT_MS in data:
        given = data[EXECUTION_TIMEOUT_MS]
        # Both spellings at once: fine when they agree (int64s may arrive as strings).
        if isinstance(given, bool) or not isinstance(given, (int, str)) or str(given) != str(value):
            detail = f"conflicts with execution_timeout_ms = {render(given)}; set it in one place"
            raise ConfigError(source, where, detail=detail)
    data[EXECUTION_TIMEOUT_MS] = value


def _input_tensors_from_parameters(data: dict[str, object], parameters: dict[object, object], source: str) -> None:
    if INPUT_TENSORS not in parameters:
        return
    where = key_path("parameters", INPUT_TENSORS)
    value = _string(parameters.pop(INPUT_TENSORS), where, source)
    if INPUT_TENSORS in data:
        given = data[INPUT_TENSORS]
        if not isinstance(given, str) or given.lower() != value.lower():
            detail = f"conflicts with input_tensors = {render(given)}; set it in one place"
            raise ConfigError(source, where, detail=detail)
    data[INPUT_TENSORS] = value


def _isolation_from_parameters(
    data: dict[str, object], parameters: dict[object, object], source: str, folder_name: str
) -> None:
    """``instance_group.<name>.isolation`` and ``.processes`` into the groups they name."""
    model_name = data.get("name", folder_name)
    groups = data.get("instance_group")
    for key in [key for key in parameters if isinstance(key, str)]:
        found = [(suffix, name) for suffix, name in _GROUP_KEYS.items() if isolation_group_name(key, suffix)]
        if not found:
            continue
        suffix, field = found[0]
        group_name = isolation_group_name(key, suffix)
        if groups is None and group_name == model_name:
            # No groups given: the default group is named after the model (load.py).
            groups = data["instance_group"] = [{"name": model_name}]
        named = [
            (index, item)
            for index, item in enumerate(groups if isinstance(groups, list) else [])
            if isinstance(item, dict) and item.get("name", f"{model_name}_{index}") == group_name
        ]
        if not named:
            continue  # load.py refuses the reserved name left over
        where = key_path("parameters", key)
        value = _string(parameters.pop(key), where, source)
        for index, item in named:
            given = item.get(field, value)
            if not isinstance(given, str) or given.lower() != value.lower():
                detail = (
                    f"conflicts with instance_group[{index}].{field} = {render(given)}; "
                    "set it in one place"
                )
                raise ConfigError(source, where, detail=detail)
            item.setdefault(field, value)


def _string(value: object, where: str, source: str) -> str:
    text = value.get("string_value") if isinstance(value, Mapping) else value
    if isinstance(text, str):
        return text
    raise ConfigError(source, where, expected="a string in a string_value", got=render(value))


def _number(value: object, where: str, source: str, *, integer: bool) -> int | float:
    text = value.get("string_value") if isinstance(value, Mapping) else value
    if isinstance(text, str):
        if _INTEGER.fullmatch(text.strip()):
            return int(text)
        if not integer:
            try:
                return float(text)
            except ValueError:
                pass
    expected = "an integer" if integer else "a number"
    raise ConfigError(source, where, expected=f"{expected} in a string_value", got=render(value))
