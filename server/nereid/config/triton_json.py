"""A ModelConfig in Triton's JSON spelling, as ``/v2/models/{name}/config`` shows it.

With triton_json_reader.py (the way back: Triton JSON into config.toml's shape), the only
place that knows the JSON form; nereid's extensions travel under the parameter names of
extension_parameters.py.
"""

from __future__ import annotations

import copy

from nereid.config.extension_parameters import (
    EXECUTION_TIMEOUT_MS,
    INPUT_TENSORS,
    MAX_CONCURRENT_BATCHES,
    PAD_VALUE_PREFIX,
    PROCESSES_SUFFIX,
    isolation_parameter,
)
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

__all__ = ["OPTIMIZATION_DEFAULTS", "to_triton_json"]

#: the ``optimization`` Triton shows for a model that sets none
OPTIMIZATION_DEFAULTS = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}

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
        rendered["optimization"] = copy.deepcopy(OPTIMIZATION_DEFAULTS)
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
