"""An ensemble's own config: the ``ensemble_scheduling`` walk and Triton's rules for it.

Owns what one ensemble config can be checked for alone (Triton's
ValidateEnsembleSchedulingConfig: steps named, maps set, every input used, every output
written, no tensor written twice, no tensor left unused). What needs the step models'
configs (they exist, their inputs and outputs, datatypes, batch sizes) is
``nereid.ensembles.graph``'s, at load.
"""

from __future__ import annotations

from collections import deque
from typing import NoReturn

from nereid.config._walk import Table
from nereid.config.schema import ENSEMBLE_PLATFORM, EnsembleScheduling, EnsembleStep, ModelConfig
from nereid.errors import ConfigError

__all__ = ["ENSEMBLE_KEYS", "parse_ensemble_scheduling", "check_ensemble_config"]

#: the keys of ``[ensemble_scheduling]`` and of each of its steps
ENSEMBLE_KEYS = ("step",)
_STEP_KEYS = ("model_name", "model_version", "input_map", "output_map", "model_namespace")


def parse_ensemble_scheduling(table: Table) -> EnsembleScheduling:
    """``[ensemble_scheduling]`` -> its record (the keys and their types; the graph is
    ``check_ensemble_config``'s)."""
    return EnsembleScheduling(step=tuple(_step(step) for step in table.tables("step", _STEP_KEYS)))


def _step(table: Table) -> EnsembleStep:
    namespace = table.string("model_namespace", "")
    if namespace:
        table.fail("model_namespace", '"" (nereid has no model namespaces)', namespace)
    version = table.integer("model_version", -1, minimum=-1)
    if version == 0:
        table.fail("model_version", "-1 (the latest version) or a version >= 1", version)
    return EnsembleStep(
        model_name=table.string("model_name", ""),
        model_version=version,
        input_map=_tensor_map(table, "input_map"),
        output_map=_tensor_map(table, "output_map"),
    )


def _tensor_map(table: Table, key: str) -> dict[str, str]:
    mapping = table.table(key, None)
    if mapping is None:
        return {}
    result: dict[str, str] = {}
    for name, tensor in mapping.items():
        if not isinstance(tensor, str) or not tensor:
            mapping.fail(name, "the name of an ensemble tensor (a non-empty string)", tensor)
        result[str(name)] = tensor
    return result


def check_ensemble_config(config: ModelConfig, *, source: str, has_instance_group: bool) -> None:
    """Triton's rules for an ensemble's own config, with Triton's messages; ConfigError
    naming ``source``. ``has_instance_group``: the file set ``instance_group``."""
    name = config.name
    scheduling = config.ensemble_scheduling
    if config.platform != ENSEMBLE_PLATFORM:
        if scheduling is not None:
            _fail(source, "ensemble_scheduling",
                  f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}")
        return
    if scheduling is None:
        _fail(source, "platform",
              f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}")
    if has_instance_group:
        _fail(source, "instance_group", f"instance group should not be specified for ensemble '{name}'")
    if config.model_warmup:
        _fail(source, "model_warmup", f"model_warmup can not be specified for ensemble '{name}'")
    if not scheduling.step:
        _fail(source, "ensemble_scheduling", f"must specify 'step' for ensemble '{name}'")
    writers = _check_steps(config, source)
    _check_dataflow(config, source, writers)


def _check_steps(config: ModelConfig, source: str) -> dict[str, int]:
    """Each step's fields, and which step writes each tensor (written once only)."""
    assert config.ensemble_scheduling is not None
    writers: dict[str, int] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"ensemble_scheduling.step[{index}]"
        for field, value in (("model_name", step.model_name), ("input_map", step.input_map),
                             ("output_map", step.output_map)):
            if not value:
                _fail(source, where, f"must specify '{field}' in step {index} of ensemble '{config.name}'")
        for tensor in step.output_map.values():
            if tensor in writers or tensor in config.inputs_by_name:
                _fail(source, f"{where}.output_map",
                      f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                      f"'{config.name}' step {index}")
            writers[tensor] = index
    return writers


def _check_dataflow(config: ModelConfig, source: str, writers: dict[str, int]) -> None:
    """Every input feeds a step, every output is written by a step the inputs reach (no
    cycle stops it), and every tensor a step writes is reached and is read by a step or is
    an output."""
    assert config.ensemble_scheduling is not None
    steps = config.ensemble_scheduling.step
    read = {tensor for step in steps for tensor in step.input_map.values()}
    for ensemble_input in config.input:
        if ensemble_input.name not in read:
            _fail(source, "input", f"ensemble input '{ensemble_input.name}' for ensemble '{config.name}' is not used")
    ready = set(config.inputs_by_name)
    waiting = deque(range(len(steps)))
    progress = True
    while waiting and progress:  # run the steps whose inputs are ready until none is
        progress = False
        for _ in range(len(waiting)):
            index = waiting.popleft()
            if set(steps[index].input_map.values()) <= ready:
                ready.update(steps[index].output_map.values())
                progress = True
            else:
                waiting.append(index)
    for output in config.output:
        if output.name not in writers:
            _fail(source, "output", f"ensemble output '{output.name}' for ensemble '{config.name}' is not used")
        if output.name not in ready:
            _fail(source, "output", f"output '{output.name}' for ensemble '{config.name}' is not written: "
                  f"{_why_not_ready(list(steps[writers[output.name]].input_map.values()), steps, writers, ready)}")
    for written, index in writers.items():
        if written not in ready or (written not in read and written not in config.outputs_by_name):
            _fail(source, f"ensemble_scheduling.step[{index}].output_map",
                  f"ensemble tensor '{written}' is unused in ensemble '{config.name}'")


def _why_not_ready(inputs: list[str], steps: tuple[EnsembleStep, ...], writers: dict[str, int], ready: set[str]) -> str:
    """The first tensor upstream that nothing written feeds (Triton's "not connected"),
    or the cycle that keeps a tensor from being written."""
    seen: list[str] = []
    pending = [t for t in inputs if t not in ready]
    while pending:
        tensor = pending[0]
        if tensor in seen:
            return f"its steps depend on each other in a cycle through ensemble tensor '{tensor}'"
        seen.append(tensor)
        if tensor not in writers:
            return f"at least one of its depending tensors, '{tensor}', is not connected"
        pending = [t for t in steps[writers[tensor]].input_map.values() if t not in ready]
    return "its steps depend on each other in a cycle"


def _fail(source: str, key: str, detail: str) -> NoReturn:
    raise ConfigError(source, key, detail=detail)
