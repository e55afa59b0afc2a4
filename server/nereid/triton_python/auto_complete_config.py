"""``pb_utils.ModelConfig``: the config a TritonPythonModel's ``auto_complete_config``
receives and returns (Triton's JSON form), with the setters' checks and messages as
Triton words them. ``auto_complete.py`` runs the hook; ``pb_utils.py`` re-exports this.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["ModelConfig"]


class ModelConfig:
    """The config ``auto_complete_config`` receives and returns (Triton's JSON form)."""

    def __init__(self, model_config: Mapping[str, Any] | str) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config = config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but in auto-complete-config "
                             f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                                 f"function for model '{self._name()}' tries to set scheduling_choice as "
                                 "'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:  # noqa: A002 (Triton's name)
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        model = self._name()
        name = tensor.get("name")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            listed = ", ".join(f"'{key}'" for key in allowed[:-1]) + f" and '{allowed[-1]}'"
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model '{model}' contains "
                             f"property other than {listed}.")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                where = f"{kind} '{name}'" if required != "name" else kind
                raise ValueError(f"{where} in auto-complete-config function for model '{model}' is missing "
                                 f"'{required}' property.")
        for current in self._model_config[kind]:
            if current["name"] != name:
                continue
            data_type = current.get("data_type", "TYPE_INVALID")
            if data_type != "TYPE_INVALID" and data_type != tensor["data_type"]:
                raise ValueError(f"unable to load model '{model}', configuration expects datatype {data_type} for "
                                 f"{kind} '{name}', model provides {tensor['data_type']}")
            dims = [int(d) for d in current.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(f"model '{model}', tensor '{name}': the model expects dims {list(tensor['dims'])} "
                                 f"but the model configuration specifies dims {dims}")
            current.update(tensor)
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        model = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property in auto-complete-config function for model '{model}' "
                                 "contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            if "decoupled" in policy and policy["decoupled"] != transaction_policy_dict["decoupled"]:
                raise ValueError(f"trying to change decoupled property in auto-complete-config for model '{model}', "
                                 f"which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = transaction_policy_dict["decoupled"]
