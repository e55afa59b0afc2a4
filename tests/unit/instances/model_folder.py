"""A model "m" (version 1) laid out in a test's folder as the repository would hold it:
the model file, its parsed config and one CPU instance's context, which instances are
built from."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path
from typing import NamedTuple

from nereid.config import parse_model_config
from nereid.config.schema import ModelConfig
from nereid.context import ModelContext


class ModelFolder(NamedTuple):
    model_file: Path
    context: ModelContext
    config: ModelConfig


def model_folder(root: Path, source: str, config_toml: str) -> ModelFolder:
    """``source`` as ``root/m/1/model.py``, with ``config_toml`` as its config."""
    folder = root / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(textwrap.dedent(source))
    config = parse_model_config(tomllib.loads(config_toml), source="m/config.toml", folder_name="m")
    context = ModelContext(model_name="m", model_version=1, instance_name="m_0", device="cpu", kind="CPU",
                           config={}, parameters={}, model_dir=folder)
    return ModelFolder(folder / "model.py", context, config)
