"""A Triton JSON model config (a config.json or a load API override, or config.pbtxt
once parsed) reshaped into config.toml's shape, for load.py's walk: the way back from
triton_json.py's rendering.

Knows which Triton fields nereid has no use for (accepted only at their defaults) and
where nereid's extensions travel (extension_parameters.py); validation stays in the walk.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nereid.config._walk import key_path, render
from nereid.config.extension_parameters import (
    EXECUTION_TIMEOUT_MS,
    INPUT_TENSORS,
    ISOLATION_SUFFIX,
    MAX_CONCURRENT_BATCHES,
    PAD_VALUE_PREFIX,
    PROCESSES_SUFFIX,
    isolation_group_name,
)
from nereid.config.triton_json import OPTIMIZATION_DEFAULTS
from nereid.errors import ConfigError

__all__ = ["toml_shaped"]

# Triton fields nereid has no use for, with the value Triton shows when they are unset.
# A JSON config may carry them (to_triton_json writes most of them) but only so.
_UNUSED_TOP = {
    "batch_input": [],
    "batch_output": [],
    # What Triton shows, plus the sub-messages a hand-written JSON may spell out unset.
    "optimization": {
        **OPTIMIZATION_DEFAULTS,
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


#: the per-group keys carried as ``instance_group.<group name>.<key>`` parameters
_GROUP_KEYS = {ISOLATION_SUFFIX: "isolation", PROCESSES_SUFFIX: "processes"}


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
