"""ModelTables: one model config's lookup tables for decoding requests and encoding answers,
made once per served model version and read by every surface (HTTP's ``HttpModelTables`` adds
its memo to them; gRPC reads them as they are).

Owns the tables only; what they mean is ``request_checks`` (inputs) and the surfaces'
encoders (outputs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from nereid.config.schema import ModelConfig, ModelOutput
from nereid.datatypes import DataType
from nereid.inference import RequestedOutput
from nereid.tensors.checks import ConfigRules

__all__ = ["ModelTables"]


@dataclasses.dataclass(frozen=True, slots=True)
class ModelTables:
    config: ModelConfig
    rules: ConfigRules
    outputs: Mapping[str, ModelOutput]
    output_types: Mapping[str, DataType]
    batching: bool
    #: shared RequestedOutput records, one per (name, binary, classes) of the model's own
    #: outputs (a frozen record costs more to build than the rest of an output entry).
    requested: dict[tuple[str, bool, int], RequestedOutput]

    @staticmethod
    def fields_for(config: ModelConfig) -> dict[str, object]:
        """The tables of ``config``, as keyword arguments (for this class and its subclasses)."""
        return {
            "config": config,
            "rules": ConfigRules(config),
            "outputs": {tensor.name: tensor for tensor in config.output},
            "output_types": {tensor.name: tensor.data_type for tensor in config.output},
            "batching": config.max_batch_size > 0,
            "requested": {},
        }

    @classmethod
    def for_config(cls, config: ModelConfig) -> ModelTables:
        return cls(**ModelTables.fields_for(config))  # type: ignore[arg-type]
