"""A TritonPythonModel's ``auto_complete_config``: the model supplies (part of) its config.

As in Triton, the model file is executed in a throwaway namespace (nothing it makes there
reaches ``initialize``), ``TritonPythonModel.auto_complete_config`` gets a
``pb_utils.ModelConfig`` holding the config so far (the config.pbtxt's fields, or just the
name and backend when the folder has no config file), and what it returns is the config
nereid validates.
"""

from __future__ import annotations

import runpy
import sys
import threading
from pathlib import Path
from typing import Any

from nereid.errors import ConfigError
from nereid.triton_python import pb_utils
from nereid.triton_python.adapter import install_pb_utils

__all__ = ["auto_complete_config", "defines_triton_model"]

_lock = threading.Lock()  # sys.path is shared: one model file at a time


def _namespace(model_file: Path) -> dict[str, Any]:
    install_pb_utils()
    with _lock:
        sys.path.insert(0, str(model_file.parent))
        try:
            return runpy.run_path(str(model_file), run_name=f"_nereid_auto_complete_{model_file.parent.name}")
        finally:
            sys.path.remove(str(model_file.parent))


def defines_triton_model(model_file: Path) -> bool:
    """Whether the file's text defines a TritonPythonModel (read, not run)."""
    try:
        return "class TritonPythonModel" in model_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def auto_complete_config(model_file: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """``config`` completed by the model file's ``TritonPythonModel.auto_complete_config``;
    None when the file defines none. Raises ConfigError naming the file when the file
    cannot run or the function fails (the setters' ValueError messages are Triton's)."""
    if not defines_triton_model(model_file):
        return None
    source = f"{model_file} (auto_complete_config)"
    try:
        namespace = _namespace(model_file)
    except BaseException as exc:  # the user's module: anything may come out of it
        raise ConfigError(source, "", detail=f"the model file failed to run: {type(exc).__name__}: {exc}") from exc
    model_class = namespace.get("TritonPythonModel")
    complete = getattr(model_class, "auto_complete_config", None)
    if complete is None:
        return None
    try:
        result = complete(pb_utils.ModelConfig(config))
    except BaseException as exc:
        raise ConfigError(source, "", detail=f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(result, pb_utils.ModelConfig):
        raise ConfigError(source, "", expected="a pb_utils.ModelConfig returned", got=type(result).__name__)
    return result.as_dict()
