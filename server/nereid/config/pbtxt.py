"""config.pbtxt (Triton's protobuf text format) -> the same ModelConfig as config.toml, and
config.pbtxt -> config.toml text (``nereid convert-config``).

The file is parsed by protobuf's text format into Triton's ``ModelConfig`` message (the
``model_config_pb2`` tritonclient ships), rendered as Triton's JSON (only the fields the
file sets) and validated by the same walk as a load request's JSON override
(``config_from_triton_json``): same rules, same messages, naming the file.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

from nereid.config.load import config_from_triton_json
from nereid.config.schema import ENSEMBLE_PLATFORM, ModelConfig
from nereid.config.triton_json_reader import toml_shaped
from nereid.errors import ConfigError

__all__ = ["PBTXT_FILE", "load_pbtxt_config", "pbtxt_to_toml", "read_pbtxt"]

PBTXT_FILE = "config.pbtxt"


def read_pbtxt(path: Path) -> dict[str, Any]:
    """The fields a config.pbtxt sets, in Triton's JSON form. Raises ConfigError naming
    the file (a parse error with its line and column)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, "", detail=f"cannot read the file ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "", detail=f"not UTF-8 text ({exc.reason})") from exc
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        reason = str(exc).split(" : ", 1)[-1] if line is not None else str(exc)
        where = f"line {line}, column {column}: " if line is not None else ""
        unknown = _unknown_name(reason, message.DESCRIPTOR.file.pool)
        detail = f"{where}{unknown}" if unknown else f"invalid protobuf text format: {where}{reason}"
        raise ConfigError(source, "", detail=detail) from exc
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return _with_numbers(data, message.DESCRIPTOR)


def load_pbtxt_config(
    path: Path, folder_name: str, data: dict[str, Any] | None = None, *, source: str | None = None
) -> ModelConfig:
    """Read and validate one config.pbtxt (``data``: its fields, already read, or completed
    by the model's ``auto_complete_config``; ``source`` then names where they came from).
    ``backend: "python"`` is required, but for ``platform: "ensemble"``."""
    source = source or str(path)
    if data is None:
        data = read_pbtxt(path)
    backend = data.get("backend")
    if backend != "python" and not (data.get("platform") == ENSEMBLE_PLATFORM and not backend):
        got = f'"{backend}"' if backend else (f'platform "{data["platform"]}"' if data.get("platform") else "nothing")
        raise ConfigError(
            source, "backend", expected='"python" (nereid serves Triton Python-backend models and ensembles only)', got=got
        )
    return config_from_triton_json(data, source=source, folder_name=folder_name)


def pbtxt_to_toml(path: Path, folder_name: str) -> str:
    """The config.toml that means what ``path`` means: every field the file sets, checked
    first as the server would (raises ConfigError)."""
    data = read_pbtxt(path)
    load_pbtxt_config(path, folder_name, data)
    shaped = toml_shaped(data, source=str(path), folder_name=folder_name)
    header = f"# converted from {path.name} by `nereid convert-config`\n"
    return header + _toml_text(shaped)


# -- config.toml as a person writes it ---------------------------------------------------

#: Keys in the order the README's config.toml reference gives them; others follow.
_TOP_ORDER = (
    "name", "backend", "platform", "runtime", "max_batch_size", "default_model_filename", "execution_timeout_ms",
    "version_policy", "input", "output", "dynamic_batching", "instance_group", "parameters",
    "model_transaction_policy", "model_warmup",
)
_ITEM_ORDER = ("name", "data_type", "dims", "count", "kind", "batch_size")
#: An inline value (``dims = [16]``, ``reshape = { shape = [] }``) up to this long; longer
#: ones get a table of their own.
_INLINE_WIDTH = 88


def _toml_text(data: dict[str, Any]) -> str:
    """TOML in the shape of the README's configs (tomli_w spreads every list over lines
    and inlines arrays of tables): top-level keys first, then one ``[table]`` or
    ``[[array]]`` per section; short lists and small tables inline; ``[parameters]`` as
    ``key = "value"``."""
    data = dict(data)
    parameters = data.get("parameters")
    if isinstance(parameters, dict):
        data["parameters"] = {
            key: value["string_value"] if isinstance(value, dict) and set(value) == {"string_value"} else value
            for key, value in parameters.items()
        }
    for section in ("input", "output"):
        for item in data.get(section) or []:
            if isinstance(item, dict) and item.get("reshape") == {}:  # protobuf drops an empty shape
                item["reshape"] = {"shape": []}
    lines: list[str] = []
    sections: list[tuple[str, Any]] = []
    for key, value in _ordered(data, _TOP_ORDER):
        if isinstance(value, dict) or _is_table_array(value):
            sections.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_inline(value)}")
    for key, value in sections:
        for table in value if isinstance(value, list) else [value]:
            lines += ["", f"[[{_key(key)}]]" if isinstance(value, list) else f"[{_key(key)}]"]
            lines += _table_lines(table, _key(key))
    return "\n".join(lines) + "\n"


def _table_lines(table: dict[str, Any], path: str) -> list[str]:
    """A table's body: inline values first, then its sub-tables (``[path.key]``)."""
    lines: list[str] = []
    nested: list[tuple[str, Any]] = []
    for key, value in _ordered(table, _ITEM_ORDER):
        text = _inline(value)
        if (isinstance(value, dict) or _is_table_array(value)) and len(key) + len(text) + 3 > _INLINE_WIDTH:
            nested.append((key, value))
        else:
            lines.append(f"{_key(key)} = {text}")
    for key, value in nested:
        where = f"{path}.{_key(key)}"
        for item in value if isinstance(value, list) else [value]:
            lines += ["", f"[[{where}]]" if isinstance(value, list) else f"[{where}]"]
            lines += _table_lines(item, where)
    return lines


def _inline(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(item) for item in value) + "]"
    import tomli_w

    return tomli_w.dumps({"v": value})[len("v = "):].rstrip("\n")  # tomli_w's escaping of strings


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _inline(key)


def _is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _ordered(table: dict[str, Any], first: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(k, table[k]) for k in first if k in table] + [(k, v) for k, v in table.items() if k not in first]


_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')


def _unknown_name(reason: str, pool: Any) -> str | None:
    """protobuf's "has no field named" / "has no value named" as nereid says it for
    config.toml: the name, where, and the nearest known one; None for other errors."""
    if (field := _UNKNOWN_FIELD.search(reason)) is not None:
        message_type, name = field.groups()
        known = [f.name for f in pool.FindMessageTypeByName(message_type).fields]
        what, close = "field", difflib.get_close_matches(name, known, n=1)
    elif (value := _UNKNOWN_VALUE.search(reason)) is not None:
        message_type, name = value.groups()
        known = [v.name for v in pool.FindEnumTypeByName(message_type).values]
        # nereid's TOML takes FP32 for TYPE_FP32; protobuf's text format wants the whole name
        whole = [k for k in known if k.split("_", 1)[-1] == name.upper() or k == name.upper()]
        what, close = "value", whole or difflib.get_close_matches(name, known, n=1)
    else:
        return None
    hint = f" (did you mean {json.dumps(close[0])}?)" if close else f" (known {what}s: {', '.join(known)})"
    return f"unknown {what} {json.dumps(name)} of {message_type.rsplit('.', 1)[-1]}{hint}"


def _with_numbers(data: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    """protobuf's JSON writes 64-bit integers as strings; as numbers again (by the
    message's own field types), so the TOML reads as a person would write it."""
    from google.protobuf.descriptor import FieldDescriptor

    wide = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for item in value.values():
                        _with_numbers(item, value_field.message_type)
                elif value_field.cpp_type in wide:
                    data[key] = {k: int(v) for k, v in value.items()}
            else:
                for item in value if isinstance(value, list) else [value]:
                    _with_numbers(item, field.message_type)
        elif field.cpp_type in wide:
            data[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return data
