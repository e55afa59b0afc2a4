"""The model config the Triton JSON tests start from (``add_one``), and the JSON override
path they read configs back through."""

from __future__ import annotations

from typing import Any

import pytest

from nereid.config import (
    InstanceGroup,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelTransactionPolicy,
    config_from_triton_json,
)
from nereid.datatypes import DataType, by_config_name
from nereid.errors import ConfigError

SOURCE = "load request for add_one"


def data_type(name: str) -> DataType:
    found = by_config_name(name)
    assert found is not None, name
    return found


FP32 = data_type("FP32")
INT64 = data_type("INT64")


def minimal(**changes: Any) -> ModelConfig:
    fields: dict[str, Any] = {
        "name": "add_one",
        "max_batch_size": 8,
        "input": (ModelInput("INPUT0", FP32, (-1, 4)),),
        "output": (ModelOutput("OUTPUT0", FP32, (-1, 4)),),
        "instance_group": (InstanceGroup("add_one"),),
        "model_transaction_policy": ModelTransactionPolicy(),
    }
    fields.update(changes)
    return ModelConfig(**fields)


def from_json(obj: object) -> ModelConfig:
    return config_from_triton_json(obj, source=SOURCE, folder_name="add_one")


def json_error(obj: object) -> str:
    with pytest.raises(ConfigError) as info:
        from_json(obj)
    return str(info.value)
