"""config.pbtxt (Triton's protobuf text format) -> the same ModelConfig as config.toml, and
config.pbtxt -> config.toml text (``nereid convert-config``).

The file is parsed by protobuf's text format into Triton's ``ModelConfig`` message (the
``model_config_pb2`` tritonclient ships), rendered as Triton's JSON (only the fields the
file sets) and validated by the same walk as a load request's JSON override
(``config_from_triton_json``): same rules, same messages, naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nereid.config.load import config_from_triton_json
from nereid.config.schema import ModelConfig
from nereid.config.triton_json import toml_shaped
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
        raise ConfigError(source, "", detail=f"invalid protobuf text format: {where}{reason}") from exc
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return _with_numbers(data, message.DESCRIPTOR)


def load_pbtxt_config(
    path: Path, folder_name: str, data: dict[str, Any] | None = None, *, source: str | None = None
) -> ModelConfig:
    """Read and validate one config.pbtxt (``data``: its fields, already read, or completed
    by the model's ``auto_complete_config``; ``source`` then names where they came from).
    ``backend: "python"`` is required."""
    source = source or str(path)
    if data is None:
        data = read_pbtxt(path)
    backend = data.get("backend")
    if backend != "python":
        got = f'"{backend}"' if backend else (f'platform "{data["platform"]}"' if data.get("platform") else "nothing")
        raise ConfigError(
            source, "backend", expected='"python" (nereid serves Triton Python-backend models only)', got=got
        )
    return config_from_triton_json(data, source=source, folder_name=folder_name)


def pbtxt_to_toml(path: Path, folder_name: str) -> str:
    """The config.toml that means what ``path`` means: every field the file sets, checked
    first as the server would (raises ConfigError)."""
    import tomli_w

    data = read_pbtxt(path)
    load_pbtxt_config(path, folder_name, data)
    shaped = toml_shaped(data, source=str(path), folder_name=folder_name)
    header = f"# converted from {path.name} by `nereid convert-config`\n"
    return header + tomli_w.dumps(shaped)


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
