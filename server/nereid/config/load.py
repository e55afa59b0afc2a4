"""config.toml (or a Triton JSON override) -> a validated ModelConfig: the typed walk.

Owns which keys exist, their types and single-field ranges; cross-field rules are in
_rules.py, the JSON spelling in triton_json.py and triton_json_reader.py. Knows nothing
about models or serving.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nereid.config._rules import check_rules
from nereid.config.ensemble import ENSEMBLE_KEYS, check_ensemble_config, parse_ensemble_scheduling
from nereid.config._walk import Table
from nereid.config.sequence_batching import SEQUENCE_BATCHING_KEYS, check_sequence_batching, parse_sequence_batching
from nereid.config.schema import (
    ENSEMBLE_PLATFORM,
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTransactionPolicy,
    ModelWarmup,
    QueuePolicy,
    VersionPolicy,
    WarmupInput,
)
from nereid.config.extension_parameters import (
    EXECUTION_TIMEOUT_MS,
    INPUT_TENSORS,
    MAX_CONCURRENT_BATCHES,
    PAD_VALUE_PREFIX,
    PROCESSES_SUFFIX,
    isolation_group_name,
)
from nereid.config.triton_json_reader import toml_shaped
from nereid.datatypes import DATATYPES, DataType, by_config_name
from nereid.errors import ConfigError

import tomllib

__all__ = ["load_model_config", "parse_model_config", "config_from_triton_json"]

_TOP_KEYS = (
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
    "output", "dynamic_batching", "sequence_batching", "instance_group", "default_model_filename", "parameters",
    "model_transaction_policy", "model_warmup", "execution_timeout_ms", "input_tensors",
    "ensemble_scheduling",
)  # fmt: skip
_VERSION_POLICY_KEYS = ("latest", "all", "specific")
_INPUT_KEYS = (
    "name", "data_type", "format", "dims", "reshape", "is_shape_tensor",
    "allow_ragged_batch", "optional", "pad_value",
)  # fmt: skip
_OUTPUT_KEYS = ("name", "data_type", "dims", "reshape", "label_filename", "is_shape_tensor")
_DYNAMIC_BATCHING_KEYS = (
    "preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering",
    "priority_levels", "default_priority_level", "default_queue_policy",
    "priority_queue_policy", "max_concurrent_batches",
)  # fmt: skip
_QUEUE_POLICY_KEYS = (
    "timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size",
)  # fmt: skip
_INSTANCE_GROUP_KEYS = ("name", "count", "kind", "gpus", "isolation", "processes")
_WARMUP_KEYS = ("name", "batch_size", "inputs", "count")
_WARMUP_INPUT_KEYS = ("data_type", "dims", "zero_data", "random_data", "input_data_file")
_WARMUP_DATA_KEYS = ("zero_data", "random_data", "input_data_file")

_FORMATS = ("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW")
_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")
_TIMEOUT_ACTIONS = ("REJECT", "DELAY")
_INPUT_TENSORS = ("numpy", "torch")
_ISOLATIONS = ("thread", "process")
_PROCESSES = ("per_device", "per_instance")
_DATA_TYPE_NAMES = ", ".join(dt.config_name for dt in DATATYPES)
_DIMS = "a list of integers, each -1 (any size) or >= 1"


def load_model_config(path: Path, folder_name: str) -> ModelConfig:
    """Read and validate one config.toml. ``folder_name`` is the model folder's name, which
    the config's ``name`` must equal (and defaults to). Raises ConfigError naming the file."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(source, "", detail=f"cannot read the file ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "", detail=f"invalid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, "", detail=f"invalid TOML: not UTF-8 text ({exc.reason})"
        ) from exc
    return parse_model_config(data, source=source, folder_name=folder_name)


def parse_model_config(data: Mapping[str, object], *, source: str, folder_name: str) -> ModelConfig:
    """Validate an already-parsed TOML document. ``source`` names it in every error."""
    return _parse(data, source, folder_name, json_form=False)


def config_from_triton_json(obj: object, *, source: str, folder_name: str) -> ModelConfig:
    """Validate a config in Triton's JSON form (the load API's ``config`` override, or
    what to_triton_json renders): the same walk and the same messages as config.toml."""
    data = toml_shaped(obj, source=source, folder_name=folder_name)
    return _parse(data, source, folder_name, json_form=True)


def _parse(
    data: Mapping[str, object], source: str, folder_name: str, *, json_form: bool
) -> ModelConfig:
    root = Table(source, "", data, _TOP_KEYS, json_form=json_form)
    name = root.string("name", folder_name)
    platform = root.string("platform", "")
    ensemble = platform == ENSEMBLE_PLATFORM  # an ensemble runs other models: no backend of its own
    backend = root.string("backend", "" if ensemble else "python")
    if backend != "python" and not ensemble:
        root.fail("backend", '"python" (the only backend nereid serves)', backend)
    if backend and ensemble:
        root.fail("backend", f'nothing (platform "{ENSEMBLE_PLATFORM}" runs its steps\' models)', backend)
    scheduling = root.table("ensemble_scheduling", ENSEMBLE_KEYS)
    dynamic_batching = root.table("dynamic_batching", _DYNAMIC_BATCHING_KEYS)
    policy = root.table("model_transaction_policy", ("decoupled",))
    sequence_batching = root.table("sequence_batching", SEQUENCE_BATCHING_KEYS)
    config = ModelConfig(
        name=name,
        platform=platform,
        backend=backend,
        runtime=root.string("runtime", ""),
        version_policy=_version_policy(root.table("version_policy", _VERSION_POLICY_KEYS)),
        max_batch_size=root.integer("max_batch_size", 0, minimum=0),
        input=tuple(_input(t) for t in root.tables("input", _INPUT_KEYS)),
        output=tuple(_output(t) for t in root.tables("output", _OUTPUT_KEYS)),
        dynamic_batching=None if dynamic_batching is None else _dynamic(dynamic_batching),
        sequence_batching=None if sequence_batching is None else parse_sequence_batching(
            sequence_batching, root.integer("max_batch_size", 0, minimum=0)),
        instance_group=() if ensemble else _instance_groups(root, name),
        default_model_filename=root.string("default_model_filename", "" if ensemble else "model.py"),
        parameters=_parameters(root.table("parameters", None)),
        # Always present: Triton's python backend sets it, so /config shows it either way.
        model_transaction_policy=ModelTransactionPolicy(
            decoupled=False if policy is None else policy.boolean("decoupled", False)
        ),
        model_warmup=tuple(_warmup(t) for t in root.tables("model_warmup", _WARMUP_KEYS)),
        execution_timeout_ms=root.integer("execution_timeout_ms", 0, minimum=0),
        input_tensors=_choice(root, "input_tensors", _INPUT_TENSORS, "numpy"),
        ensemble_scheduling=None if scheduling is None else parse_ensemble_scheduling(scheduling),
    )
    check_rules(config, source=source, folder_name=folder_name)
    check_sequence_batching(config, source)
    check_ensemble_config(config, source=source, has_instance_group=bool(root.raw("instance_group")))
    return config


def _version_policy(table: Table | None) -> VersionPolicy:
    if table is None:
        return VersionPolicy()
    if len(table.data) != 1:
        table.fail(None, "exactly one of latest, all, specific", table.data)
    if table.has("latest"):
        latest = table.child("latest", table.raw("latest"), ("num_versions",))
        return VersionPolicy("latest", num_versions=latest.integer("num_versions", 1, minimum=1))
    if table.has("all"):
        table.child("all", table.raw("all"), ())
        return VersionPolicy("all")
    specific = table.child("specific", table.raw("specific"), ("versions",))
    versions = specific.integers("versions")
    if not versions or min(versions) < 1:
        specific.fail("versions", "a non-empty list of integers >= 1", specific.raw("versions"))
    return VersionPolicy("specific", versions=versions)


def _data_type(table: Table, key: str) -> DataType:
    name = table.string(key)
    data_type = by_config_name(name.upper())
    if data_type is None:
        expected = f"one of {_DATA_TYPE_NAMES} (the TYPE_ prefix is optional)"
        table.fail(key, expected, name)
    return data_type


def _dims(table: Table, key: str, *, required: bool = True) -> tuple[int, ...]:
    dims = table.integers(key, None if required else ())
    if any(d < 1 and d != -1 for d in dims):
        table.fail(key, _DIMS, table.raw(key))
    if required and not dims:
        # Triton rejects empty dims for every model, batching or not; a batched model
        # whose requests are [batch] writes dims = [1] with an empty reshape instead.
        expected = "a non-empty list of integers"
        expected += " (for a [batch] shape: dims = [1], reshape = { shape = [] })"
        table.fail(key, expected, [])
    return dims


def _reshape(table: Table) -> tuple[int, ...] | None:
    reshape = table.table("reshape", ("shape",))
    return None if reshape is None else _dims(reshape, "shape", required=False)


def _shape_tensor(table: Table) -> bool:
    value = table.boolean("is_shape_tensor", False)
    if value:
        table.fail(
            "is_shape_tensor", "false (Triton supports shape tensors for TensorRT only)", value
        )
    return value


def _input(table: Table) -> ModelInput:
    pad_value = table.raw("pad_value")
    if pad_value is not None and (
        isinstance(pad_value, bool) or not isinstance(pad_value, (int, float))
    ):
        table.fail("pad_value", "a number", pad_value)
    return ModelInput(
        name=table.string("name", non_empty=True),
        data_type=_data_type(table, "data_type"),
        dims=_dims(table, "dims"),
        format=table.enum("format", "FORMAT_NONE", _FORMATS, "FORMAT_"),
        reshape=_reshape(table),
        is_shape_tensor=_shape_tensor(table),
        allow_ragged_batch=table.boolean("allow_ragged_batch", False),
        optional=table.boolean("optional", False),
        pad_value=pad_value,
    )


def _output(table: Table) -> ModelOutput:
    return ModelOutput(
        name=table.string("name", non_empty=True),
        data_type=_data_type(table, "data_type"),
        dims=_dims(table, "dims"),
        reshape=_reshape(table),
        label_filename=table.string("label_filename", ""),
        is_shape_tensor=_shape_tensor(table),
    )


def _dynamic(table: Table) -> DynamicBatching:
    default_policy = table.table("default_queue_policy", _QUEUE_POLICY_KEYS)
    return DynamicBatching(
        preferred_batch_size=table.integers("preferred_batch_size", ()),
        max_queue_delay_microseconds=table.integer("max_queue_delay_microseconds", 0, minimum=0),
        preserve_ordering=table.boolean("preserve_ordering", False),
        priority_levels=table.integer("priority_levels", 0, minimum=0),
        default_priority_level=table.integer("default_priority_level", 0, minimum=0),
        default_queue_policy=None if default_policy is None else _queue_policy(default_policy),
        priority_queue_policy=_priority_policies(table.table("priority_queue_policy", None)),
        max_concurrent_batches=table.integer("max_concurrent_batches", 1, minimum=1),
    )


def _priority_policies(table: Table | None) -> dict[int, QueuePolicy]:
    if table is None:
        return {}
    policies: dict[int, QueuePolicy] = {}
    for key, value in table.items():
        # TOML and JSON keys are strings ("1"); a dict built in Python may use ints.
        level = int(key) if isinstance(key, str) and key.isdecimal() else table.as_int(key)
        if level is None or level < 1:
            table.fail(None, "priority levels (integers >= 1) as keys", key)
        policies[level] = _queue_policy(table.child(key, value, _QUEUE_POLICY_KEYS))
    return policies


def _queue_policy(table: Table) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=table.enum("timeout_action", "REJECT", _TIMEOUT_ACTIONS),
        default_timeout_microseconds=table.integer("default_timeout_microseconds", 0, minimum=0),
        allow_timeout_override=table.boolean("allow_timeout_override", False),
        max_queue_size=table.integer("max_queue_size", 0, minimum=0),
    )


def _instance_groups(root: Table, model_name: str) -> tuple[InstanceGroup, ...]:
    if not root.has("instance_group"):
        # Triton's default: one group named after the model, kind resolved at load time.
        return (InstanceGroup(name=model_name),)
    groups = []
    for index, table in enumerate(root.tables("instance_group", _INSTANCE_GROUP_KEYS)):
        gpus = table.integers("gpus", ())
        if any(gpu < 0 for gpu in gpus):
            table.fail("gpus", "a list of integers >= 0 (GPU ids)", table.raw("gpus"))
        group = InstanceGroup(
            # Triton names an unnamed group <model>_<index>; its instances append _<k>.
            name=table.string("name", f"{model_name}_{index}", non_empty=True),
            count=table.integer("count", 1, minimum=1),
            kind=table.enum("kind", "KIND_AUTO", _KINDS, "KIND_"),
            gpus=gpus,
            isolation=_choice(table, "isolation", _ISOLATIONS, ""),
            processes=_choice(table, "processes", _PROCESSES, ""),
        )
        groups.append(group)
    return tuple(groups)


def _choice(table: Table, key: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices`` (case does not matter, as for the enums); ``default`` when not
    set. ``input_tensors`` (default "numpy"), and a group's ``isolation`` and ``processes``
    (default "": decided by the kind at load, devices.resolve_instance_groups/processes_of)."""
    if not table.has(key):
        return default
    value = table.raw(key)
    if isinstance(value, str) and value.lower() in choices:
        return value.lower()
    table.fail(key, " or ".join(f'"{choice}"' for choice in choices), value)


def _parameters(table: Table | None) -> dict[str, str]:
    if table is None:
        return {}
    parameters: dict[str, str] = {}
    for key, value in table.items():
        name = str(key)
        # The JSON form carries nereid's extensions under these names
        # (extension_parameters.py), so a user parameter of that name would be read back
        # as the extension.
        home = _extension_home(name)
        if home is not None:
            table.fail_detail(key, f"this name is reserved for nereid's extension; set {home}")
        parameters[name] = _parameter_value(table, key, value)
    return parameters


def _extension_home(name: str) -> str | None:
    """Where to set the extension a parameter name is reserved for; None if it is free."""
    if name == MAX_CONCURRENT_BATCHES:
        return "dynamic_batching.max_concurrent_batches"
    if name.startswith(PAD_VALUE_PREFIX):
        return "pad_value in the input's [[input]] table"
    if name == EXECUTION_TIMEOUT_MS:
        return "the top-level execution_timeout_ms"
    if name == INPUT_TENSORS:
        return "the top-level input_tensors"
    if isolation_group_name(name) is not None:
        return "isolation in the group's [[instance_group]] table"
    if isolation_group_name(name, PROCESSES_SUFFIX) is not None:
        return "processes in the group's [[instance_group]] table"
    return None


def _parameter_value(table: Table, key: object, value: object) -> str:
    """Every parameter reaches the model as a string, as in Triton."""
    if isinstance(value, Mapping) and list(value) == ["string_value"]:
        text = value["string_value"]  # Triton's JSON form: {"string_value": "v"}
        if isinstance(text, str):
            return text
    elif isinstance(value, bool):
        return "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        return str(value)
    table.fail(key, "a string, number or boolean", value)


def _warmup(table: Table) -> ModelWarmup:
    inputs = table.table("inputs", None)
    return ModelWarmup(
        name=table.string("name", ""),
        batch_size=table.integer("batch_size", 1, minimum=1),
        inputs={}
        if inputs is None
        else {
            str(key): _warmup_input(inputs.child(key, value, _WARMUP_INPUT_KEYS))
            for key, value in inputs.items()
        },
        # Triton's default 0 means "once", the same as 1; store 1 so there is one spelling.
        count=max(table.integer("count", 1, minimum=0), 1),
    )


def _warmup_input(table: Table) -> WarmupInput:
    given = [key for key in _WARMUP_DATA_KEYS if table.has(key)]
    if len(given) != 1:
        got = " and ".join(given) if given else "none of them"
        detail = f"expected exactly one of zero_data, random_data, input_data_file, got {got}"
        table.fail_detail(None, detail)
    dims = table.integers("dims")
    if any(d < 1 for d in dims):
        table.fail(
            "dims", "a list of integers >= 1 (warmup data has fixed sizes)", table.raw("dims")
        )
    for flag in ("zero_data", "random_data"):
        if table.has(flag) and not table.boolean(flag, True):
            table.fail(flag, "true (leave the key out instead)", False)
    return WarmupInput(
        data_type=_data_type(table, "data_type"),
        dims=dims,
        zero_data=table.has("zero_data"),
        random_data=table.has("random_data"),
        input_data_file=table.string("input_data_file", "", non_empty=True),
    )
