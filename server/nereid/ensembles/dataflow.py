"""One ensemble request as a dataflow of step requests (Triton's ensemble scheduling).

A step starts as soon as every ensemble tensor it reads is there, so steps that do not
depend on each other run at the same time; each step request goes to its step model's
serving version (its queue, batcher and instances). Tensors live in flows: the request's
own, and one more per response of a decoupled step, where the steps after that step run
once per response (Triton lets a step read tensors of one flow only, graph.py). Each time
a flow completes the ensemble's outputs, that is one response of the ensemble: exactly one
when no step is decoupled. Each step request carries the ensemble request's id,
correlation id and sequence flags, priority, timeout and parameters, and the ensemble's
ComputeTotals, which its step model adds its compute times to. Knows nothing else of
statistics, nor of how the request came in (scheduler.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nereid.config.schema import EnsembleStep, ModelConfig
from nereid.datatypes import DataType
from nereid.errors import InternalError, ModelExecutionError, NereidError
from nereid.inference import ComputeTotals, InferRequest
from nereid.tensors.checks import ConfigRules

__all__ = ["Dataflow", "StepModel", "StepModels", "in_step"]

_log = logging.getLogger("nereid")


class StepModel(Protocol):
    """A step's model as the dataflow uses it (a ServingModel)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def problem(self) -> str | None: ...
    @property
    def settled(self) -> bool: ...

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]: ...

    def stream(
        self, request: InferRequest, received_ns: int | None = None
    ) -> AsyncGenerator[dict[str, np.ndarray], None]: ...


class StepModels(Protocol):
    """Where the steps' models are found (the model manager)."""

    def get(self, name: str, version: int | None = None, /) -> StepModel:
        """The READY version (None: the latest), or the NereidError saying why there is none."""


class _Flow:
    """The tensors of one flow, and the flow it branched from (None: the request's)."""

    __slots__ = ("tensors", "parent")

    def __init__(self, tensors: dict[str, np.ndarray], parent: _Flow | None) -> None:
        self.tensors = tensors
        self.parent = parent

    def find(self, name: str) -> np.ndarray | None:
        flow: _Flow | None = self
        while flow is not None:
            array = flow.tensors.get(name)
            if array is not None:
                return array
            flow = flow.parent
        return None


@dataclass(frozen=True, slots=True)
class _Event:
    """What a running step reports: a response's outputs (``outputs``), its end (``last``),
    or its failure (``error``)."""

    flow: _Flow
    step: EnsembleStep
    decoupled: bool
    outputs: Mapping[str, np.ndarray] | None = None
    error: NereidError | None = None
    last: bool = True


class Dataflow:
    """Runs the requests of one ensemble version (``responses``)."""

    def __init__(self, config: ModelConfig, models: StepModels) -> None:
        assert config.ensemble_scheduling is not None
        self.name = config.name
        self.steps = config.ensemble_scheduling.step
        self.outputs = tuple(output.name for output in config.output)
        self._models = models
        # (config object, its rules) per step model, rebuilt when the step model reloads
        self._rules: dict[str, tuple[ModelConfig, ConfigRules]] = {}

    def model(self, step: EnsembleStep) -> StepModel:
        """The step's model now (``model_version`` -1: its latest READY version)."""
        return self._models.get(step.model_name, None if step.model_version == -1 else step.model_version)

    async def responses(self, request: InferRequest,
                        totals: ComputeTotals | None = None) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """The ensemble's responses to ``request``, as flows complete its outputs. A
        step's failure raises its error, naming the ensemble and the step
        (``in_step``); leaving early (or failing) cancels the steps still running. Each
        step request that succeeds adds its compute durations to ``totals``."""
        events: asyncio.Queue[_Event] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        root = _Flow(dict(request.inputs), None)
        running = self._start(root, root.tensors, request, totals, events, tasks)
        try:
            while running:
                event = await events.get()
                if event.last:
                    running -= 1
                if event.error is not None:
                    raise event.error
                if event.outputs is None:
                    continue
                flow = _Flow({}, event.flow) if event.decoupled else event.flow
                written = {tensor: event.outputs[output] for output, tensor in event.step.output_map.items()
                           if output in event.outputs}
                flow.tensors.update(written)
                running += self._start(flow, written, request, totals, events, tasks)
                if any(name in written for name in self.outputs):
                    found = {name: flow.find(name) for name in self.outputs}
                    if all(array is not None for array in found.values()):
                        yield {name: array for name, array in found.items() if array is not None}
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, flow: _Flow, written: Mapping[str, np.ndarray], request: InferRequest,
               totals: ComputeTotals | None, events: asyncio.Queue[_Event], tasks: set[asyncio.Task[None]]) -> int:
        """Start the steps that ``written`` made ready in ``flow`` (each once per flow:
        when the last of its inputs arrives); how many started."""
        started = 0
        for step in self.steps:
            inputs = step.input_map.values()
            if any(tensor in written for tensor in inputs) and all(tensor in flow.tensors for tensor in inputs):
                task = asyncio.ensure_future(self._run_step(step, flow, request, totals, events))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                started += 1
        return started

    async def _run_step(self, step: EnsembleStep, flow: _Flow, request: InferRequest,
                        totals: ComputeTotals | None, events: asyncio.Queue[_Event]) -> None:
        """One step request; its responses, then its end, go to ``events`` (always one
        event with ``last``)."""
        decoupled = False
        try:
            model = self.model(step)
            decoupled = model.config.decoupled
            inputs = {step_input: flow.tensors[tensor] for step_input, tensor in step.input_map.items()}
            # As Triton's EnsembleContext::InitStep: the ensemble request's id, correlation id
            # and sequence flags, priority, timeout and parameters, and its statistics
            # aggregator as the step request's second one (``totals``).
            step_request = InferRequest(
                model_name=model.name, inputs=inputs, rows=self._check(model, inputs), id=request.id,
                model_version=model.version, parameters=request.parameters, priority=request.priority,
                timeout_us=request.timeout_us, sequence=request.sequence, compute_totals=totals,
            )
            if not decoupled:
                outputs = await model.infer(step_request)
                _check_outputs(model, step, outputs)
                events.put_nowait(_Event(flow, step, False, outputs))
                return
            async for outputs in model.stream(step_request):
                events.put_nowait(_Event(flow, step, True, outputs, last=False))
            events.put_nowait(_Event(flow, step, True))
        except NereidError as exc:
            events.put_nowait(_Event(flow, step, decoupled, error=in_step(exc, self.name, step.model_name)))
        except Exception as exc:  # a bug must fail the request, not leave it waiting
            _log.exception("ensemble '%s', step '%s' failed", self.name, step.model_name)
            error = InternalError(f"in ensemble '{self.name}', step '{step.model_name}': {exc!r}")
            events.put_nowait(_Event(flow, step, decoupled, error=error))

    def _check(self, model: StepModel, inputs: Mapping[str, np.ndarray]) -> int:
        """The step request's inputs against the step model's config (shapes with -1
        dims are known only now); its rows."""
        cached = self._rules.get(model.name)
        if cached is None or cached[0] is not model.config:
            cached = self._rules[model.name] = (model.config, ConfigRules(model.config))
        rules = cached[1]
        facts = {name: _Facts(array, rules.inputs[name].data_type) for name, array in inputs.items()}
        _, rows = rules.check_inputs(facts, model.name)
        return rows


def _check_outputs(model: StepModel, step: EnsembleStep, outputs: Mapping[str, np.ndarray]) -> None:
    missing = [name for name in step.output_map if name not in outputs]
    if missing:
        raise ModelExecutionError(
            f"model '{model.name}' gave no output '{missing[0]}' (its output_map maps it)", model=model.name)


class _Facts:
    """A step input as the checking core reads it (its datatype was checked at load)."""

    __slots__ = ("dt", "shape", "size", "negative")

    def __init__(self, array: np.ndarray, data_type: DataType) -> None:
        self.dt: DataType | None = data_type
        self.shape: tuple[int, ...] = array.shape
        self.size = array.nbytes
        self.negative = False


def in_step(exc: NereidError, ensemble: str, step: str) -> NereidError:
    """``exc``, the same class with the same subject, its message prefixed with the
    ensemble and the step (``in ensemble 'E', step 'S': ...``)."""
    message = f"in ensemble '{ensemble}', step '{step}': {exc.message}"
    wrapped = type(exc).__new__(type(exc))
    wrapped.__dict__.update(exc.__dict__)
    Exception.__init__(wrapped, message)
    wrapped.message = message
    return wrapped
