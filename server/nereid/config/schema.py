"""Frozen records mirroring Triton's ``ModelConfig`` message, with Triton's defaults.

Owns the shape of a model config. Knows nothing about TOML (load.py) or JSON
(triton_json.py); nothing downstream of the loader ever sees a raw dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from nereid.datatypes import DataType

__all__ = [
    "ModelConfig",
    "ModelInput",
    "ModelOutput",
    "VersionPolicy",
    "QueuePolicy",
    "DynamicBatching",
    "InstanceGroup",
    "ModelTransactionPolicy",
    "WarmupInput",
    "ModelWarmup",
    "SequenceBatching",
    "SequenceControl",
    "SequenceControlInput",
    "SequenceInitialState",
    "SequenceState",
    "SequenceStrategy",
    "EnsembleStep",
    "EnsembleScheduling",
    "ENSEMBLE_PLATFORM",
]

#: The ``platform`` of an ensemble (a model whose ``ensemble_scheduling`` runs other models).
ENSEMBLE_PLATFORM = "ensemble"


@dataclass(frozen=True, slots=True)
class ModelInput:
    """One ``[[input]]``. ``dims`` excludes the batch dimension when batching; -1 = any size."""

    name: str
    data_type: DataType
    dims: tuple[int, ...]
    format: str = "FORMAT_NONE"
    reshape: tuple[int, ...] | None = None
    is_shape_tensor: bool = False
    allow_ragged_batch: bool = False
    optional: bool = False
    #: nereid extension: requests whose -1 dims differ may share a batch, padded with this.
    pad_value: float | int | None = None


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """One ``[[output]]``."""

    name: str
    data_type: DataType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    label_filename: str = ""
    is_shape_tensor: bool = False


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Which versions of a model are served: ``latest`` (the ``num_versions`` highest),
    ``all``, or ``specific`` (the listed ``versions``)."""

    kind: str = "latest"  # "latest" | "all" | "specific"
    num_versions: int = 1
    versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``."""

    timeout_action: str = "REJECT"  # "REJECT" | "DELAY"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """``[dynamic_batching]``: its presence turns the dynamic batcher on."""

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: Mapping[int, QueuePolicy] = field(default_factory=dict)
    #: nereid extension: batches one instance may run at once.
    max_concurrent_batches: int = 1

    def queue_policy(self, priority_level: int) -> QueuePolicy:
        """The policy in force for a priority level (the level's own, else the default)."""
        policy = self.priority_queue_policy.get(priority_level)
        if policy is not None:
            return policy
        return self.default_queue_policy or QueuePolicy()


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """One ``[[instance_group]]``. ``kind`` is ``KIND_AUTO``, ``KIND_CPU`` or ``KIND_GPU``."""

    name: str = ""
    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()
    #: nereid extension: ``"thread"`` (instances are threads of the server) or
    #: ``"process"`` (each instance is an OS process of its own under a supervisor); ``""``
    #: (not set): decided at load, ``"process"`` for instances on a GPU (the model's Python
    #: must not share a GIL with the server), ``"thread"`` on the CPU (devices.py).
    isolation: str = ""
    #: nereid extension, for process instances: ``"per_device"`` (the group's instances on
    #: one device share one worker process: one CUDA context, a CUDA stream per instance) or
    #: ``"per_instance"`` (a process each); ``""`` (not set): ``"per_device"`` on a GPU,
    #: ``"per_instance"`` on the CPU (devices.py).
    processes: str = ""


@dataclass(frozen=True, slots=True)
class ModelTransactionPolicy:
    decoupled: bool = False


@dataclass(frozen=True, slots=True)
class WarmupInput:
    """One input of a warmup sample: exactly one of zero_data, random_data, input_data_file."""

    data_type: DataType
    dims: tuple[int, ...]
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str = ""


@dataclass(frozen=True, slots=True)
class ModelWarmup:
    """One ``[[model_warmup]]`` sample, run ``count`` times on every instance."""

    name: str
    batch_size: int = 1
    inputs: Mapping[str, WarmupInput] = field(default_factory=dict)
    count: int = 1


# -- sequence_batching (Triton's ModelSequenceBatching) -----------------------------------


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """One ``control`` of a control input: what the sequence batcher writes into it.
    ``kind`` is ``CONTROL_SEQUENCE_START``, ``_END``, ``_READY`` or ``_CORRID``; a boolean
    kind gives exactly one of the three ``*_false_true`` pairs, CORRID a ``data_type``."""

    kind: str = "CONTROL_SEQUENCE_START"
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: DataType | None = None


@dataclass(frozen=True, slots=True)
class SequenceControlInput:
    """One ``control_input``: a model input the server fills (the client never sends it)."""

    name: str
    control: tuple[SequenceControl, ...] = ()


@dataclass(frozen=True, slots=True)
class SequenceInitialState:
    """A state's value on a sequence's START: zeros, or the raw bytes of ``data_file``
    (in the model version's ``initial_state`` folder)."""

    data_type: DataType
    dims: tuple[int, ...]
    zero_data: bool = False
    data_file: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class SequenceState:
    """One implicit ``state``: the server feeds ``input_name`` at every step of a
    sequence and keeps the model's ``output_name`` for the next one."""

    input_name: str
    output_name: str
    data_type: DataType
    dims: tuple[int, ...]
    initial_state: tuple[SequenceInitialState, ...] = ()
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False


@dataclass(frozen=True, slots=True)
class SequenceStrategy:
    """``direct`` or ``oldest`` (Triton's oneof strategy_choice), with both messages'
    fields: direct uses the delay and ``minimum_slot_utilization``, oldest the rest."""

    kind: str = "direct"  # "direct" | "oldest"
    max_queue_delay_microseconds: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    preserve_ordering: bool = False


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """``[sequence_batching]``: its presence makes the model stateful (scheduling/sequences.py).
    ``strategy`` None: neither direct nor oldest given (Triton then runs direct)."""

    strategy: SequenceStrategy | None = None
    #: Triton's default (0 in the file means 1 s).
    max_sequence_idle_microseconds: int = 1_000_000
    control_input: tuple[SequenceControlInput, ...] = ()
    state: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One ``[[ensemble_scheduling.step]]``: a model run with ensemble tensors as inputs.
    ``input_map``: the step model's input -> the ensemble tensor it reads; ``output_map``:
    the step model's output -> the ensemble tensor it writes. ``model_version`` -1: the
    model's latest READY version at each request."""

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=dict)
    output_map: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EnsembleScheduling:
    """``[ensemble_scheduling]`` of a ``platform = "ensemble"`` model."""

    step: tuple[EnsembleStep, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A whole model config, validated. Defaults are Triton's."""

    name: str
    platform: str = ""
    backend: str = "python"
    runtime: str = ""
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    max_batch_size: int = 0
    input: tuple[ModelInput, ...] = ()
    output: tuple[ModelOutput, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    instance_group: tuple[InstanceGroup, ...] = ()
    default_model_filename: str = "model.py"
    parameters: Mapping[str, str] = field(default_factory=dict)
    model_transaction_policy: ModelTransactionPolicy | None = None
    model_warmup: tuple[ModelWarmup, ...] = ()
    #: nereid extension: a batch running longer fails its requests; 0 = no limit.
    execution_timeout_ms: int = 0
    #: nereid extension: how ``infer`` gets its inputs: ``"numpy"`` arrays, or ``"torch"``
    #: tensors already on the instance's device (device_tensors.py).
    input_tensors: str = "numpy"
    #: set (only) for ``platform = "ensemble"``: the steps (ensembles/ runs them).
    ensemble_scheduling: EnsembleScheduling | None = None

    # Derived once (plain attributes: read per request without a call).
    #: model_transaction_policy.decoupled
    decoupled: bool = field(init=False, compare=False, repr=False)
    #: ``input`` and ``output`` by name
    inputs_by_name: Mapping[str, ModelInput] = field(init=False, compare=False, repr=False)
    outputs_by_name: Mapping[str, ModelOutput] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        policy = self.model_transaction_policy
        object.__setattr__(self, "decoupled", policy is not None and policy.decoupled)
        object.__setattr__(self, "inputs_by_name", {tensor.name: tensor for tensor in self.input})
        object.__setattr__(self, "outputs_by_name", {tensor.name: tensor for tensor in self.output})

    def input_by_name(self, name: str) -> ModelInput | None:
        return self.inputs_by_name.get(name)

    def output_by_name(self, name: str) -> ModelOutput | None:
        return self.outputs_by_name.get(name)
