"""Model configuration: config.toml -> frozen records (schema) -> Triton JSON."""

from nereid.config.load import load_model_config, parse_model_config, config_from_triton_json
from nereid.config.schema import (
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
from nereid.config.triton_json import to_triton_json

__all__ = [
    "load_model_config",
    "parse_model_config",
    "config_from_triton_json",
    "to_triton_json",
    "ModelConfig",
    "ModelInput",
    "ModelOutput",
    "VersionPolicy",
    "QueuePolicy",
    "DynamicBatching",
    "InstanceGroup",
    "ModelTransactionPolicy",
    "ModelWarmup",
    "WarmupInput",
]
