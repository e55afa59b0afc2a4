"""EnsembleScheduler: runs one ensemble version's requests as a dataflow of step requests.

Each ensemble request starts every step whose input tensors are ready, and each step's
outputs make more ready, until none is left (Triton's ensemble scheduler). A step request
is an ordinary request to the step model's serving version: it waits in that model's
queue and is batched by its dynamic batcher with whatever else is queued there (other
ensemble requests' steps included), and the step model's statistics count it. The steps'
models are looked up per request (``model_version`` -1: the latest READY version), so
reloading a step model is seen at once, and while one is not loaded the ensemble says so
(``problem``). Knows nothing about HTTP, gRPC or how models are loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Protocol

import numpy as np

from nereid.config.schema import EnsembleStep, ModelConfig
from nereid.datatypes import DataType
from nereid.ensembles.graph import ensemble_problem
from nereid.errors import (
    ExecutionTimeoutError,
    InternalError,
    ModelExecutionError,
    NereidError,
    QueueFullError,
    RequestTimeoutError,
    UnavailableError,
)
from nereid.inference import InferRequest
from nereid.stats import ModelStats
from nereid.tensors.checks import ConfigRules

__all__ = ["EnsembleScheduler", "StepModel", "StepModels"]

_log = logging.getLogger("nereid")

#: ``on_answer(outputs, error)``, as ``DynamicBatcher.submit`` takes it
OnAnswer = Callable[[Any, "BaseException | None"], None]


class StepModel(Protocol):
    """A step's model as the scheduler uses it (a ServingModel)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def problem(self) -> str | None: ...

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]: ...


class StepModels(Protocol):
    """Where the steps' models are found (the model manager)."""

    def get(self, name: str, version: int | None = None, /) -> StepModel:
        """The READY version (None: the latest), or the NereidError saying why there is none."""


class EnsembleScheduler:
    """The scheduler of one ensemble version: ``infer``, ``submit`` and ``stream`` as a
    DynamicBatcher offers them, for a ServingModel whose config is an ensemble's."""

    def __init__(self, config: ModelConfig, steps: StepModels, stats: ModelStats,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        assert config.ensemble_scheduling is not None
        self.config = config
        self.name = config.name
        self._steps = config.ensemble_scheduling.step
        self._models = steps
        self._stats = stats
        self._clock = clock
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False
        # (config object, its rules) per step model, rebuilt when the step model reloads
        self._rules: dict[str, tuple[ModelConfig, ConfigRules]] = {}
        self._checked: tuple[int, ...] = ()

    async def __aenter__(self) -> EnsembleScheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> bool:
        """Stop taking requests; let those running finish (their steps run in the step
        models); after ``drain_timeout`` the rest fail with UnavailableError (False)."""
        self._closed = True
        if not self._running:
            return True
        _, pending = await asyncio.wait(set(self._running), timeout=drain_timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return not pending

    @property
    def queue_depth(self) -> int:
        """An ensemble has no queue of its own (its steps wait in their models' queues)."""
        return 0

    @property
    def executing(self) -> int:
        """Ensemble requests in flight."""
        return len(self._running)

    @property
    def problem(self) -> str | None:
        """Why the ensemble cannot serve now (Triton's words): a step's model has no
        READY version (or not the one the step names), or the step models' configs no
        longer fit the ensemble (a step model reloaded with other inputs); None when it can."""
        configs = []
        for step in self._steps:
            try:
                model = self._model(step)
            except NereidError:
                if step.model_version == -1:
                    return f"ensemble '{self.name}' depends on '{step.model_name}' which has no loaded version"
                return (f"ensemble '{self.name}' depends on '{step.model_name}' whose required version "
                        f"{step.model_version} is not loaded")
            if model.problem is not None:
                return f"ensemble '{self.name}' depends on '{step.model_name}': {model.problem}"
            configs.append(model.config)
        key = tuple(id(config) for config in configs)
        if key != self._checked:
            problem = ensemble_problem(self.config, configs)
            if problem is not None:
                return problem
            self._checked = key
        return None

    # -- the three ways in -------------------------------------------------------------

    async def infer(self, request: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                    timeout_us: int | None = None) -> dict[str, np.ndarray]:
        """Run one ensemble request; the ensemble's outputs. A step's failure fails it,
        with the step's error class and ``in ensemble 'E', step 'S': <its message>``."""
        if self._closed:
            raise UnavailableError(f"model '{self.name}' was unloaded")
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            return await self._run(request, self._clock() if received_ns is None else received_ns)
        finally:
            self._running.discard(task)

    def submit(self, request: InferRequest, received_ns: int | None, on_answer: OnAnswer, *, priority: int = 0,
               timeout_us: int | None = None) -> EnsembleTicket:
        """Start one ensemble request; ``on_answer(outputs, error)`` is called once with
        its answer (a CancelledError when withdrawn)."""
        if self._closed:
            raise UnavailableError(f"model '{self.name}' was unloaded")
        received = self._clock() if received_ns is None else received_ns
        task = asyncio.get_running_loop().create_task(self._run(request, received))
        self._running.add(task)
        task.add_done_callback(lambda done: self._answer(done, on_answer))
        return EnsembleTicket(task)

    async def stream(self, request: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                     timeout_us: int | None = None) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """The ensemble's one response as a stream of one (its steps are not decoupled)."""
        yield await self.infer(request, received_ns)

    def _answer(self, task: asyncio.Task[dict[str, np.ndarray]], on_answer: OnAnswer) -> None:
        self._running.discard(task)
        try:
            if task.cancelled():
                on_answer(None, asyncio.CancelledError())
            elif (error := task.exception()) is not None:
                on_answer(None, error)
            else:
                on_answer(task.result(), None)
        except Exception:  # noqa: BLE001 - a failing caller must not stop the loop's callbacks
            _log.exception("answering an ensemble request of '%s' failed", self.name)

    # -- the dataflow --------------------------------------------------------------------

    async def _run(self, request: InferRequest, received_ns: int) -> dict[str, np.ndarray]:
        started = self._clock()
        try:
            outputs = await self._dataflow(request)
        except BaseException as exc:
            self._stats.record_failure(self._clock() - received_ns, _reason(exc))
            raise
        ended = self._clock()
        # Triton charges an ensemble request the steps' compute; here the time its steps
        # took, from the first step's start to the last one's end, as compute_infer.
        self._stats.record_batch(max(request.rows, 1), ended - received_ns, [started - received_ns],
                                 (0, ended - started, 0), None)
        return outputs

    async def _dataflow(self, request: InferRequest) -> dict[str, np.ndarray]:
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        waiting = list(range(len(self._steps)))
        running: dict[asyncio.Task[dict[str, np.ndarray]], EnsembleStep] = {}
        try:
            while True:
                for index in [i for i in waiting if self._ready(self._steps[i], tensors)]:
                    waiting.remove(index)
                    step = self._steps[index]
                    running[asyncio.ensure_future(self._run_step(step, tensors, request))] = step
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    outputs = task.result()  # a step's error ends the request
                    for step_output, tensor in step.output_map.items():
                        tensors[tensor] = outputs[step_output]
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        missing = [output.name for output in self.config.output if output.name not in tensors]
        if missing:  # pragma: no cover - load-time validation makes every output written
            raise InternalError(f"in ensemble '{self.name}': outputs {missing} were not written by any step")
        return {output.name: tensors[output.name] for output in self.config.output}

    @staticmethod
    def _ready(step: EnsembleStep, tensors: Mapping[str, np.ndarray]) -> bool:
        return all(tensor in tensors for tensor in step.input_map.values())

    async def _run_step(
        self, step: EnsembleStep, tensors: Mapping[str, np.ndarray], request: InferRequest
    ) -> dict[str, np.ndarray]:
        try:
            model = self._model(step)
            inputs = {step_input: tensors[tensor] for step_input, tensor in step.input_map.items()}
            rows = self._check(model, inputs)
            step_request = InferRequest(
                model_name=model.name, inputs=inputs, rows=rows, id=request.id, model_version=model.version,
                parameters=request.parameters, priority=request.priority, timeout_us=request.timeout_us,
            )
            outputs = await model.infer(step_request)
            missing = [name for name in step.output_map if name not in outputs]
            if missing:
                raise ModelExecutionError(
                    f"model '{model.name}' gave no output '{missing[0]}' (its output_map maps it)", model=model.name)
            return outputs
        except NereidError as exc:
            raise _in_step(exc, self.name, step.model_name) from exc

    def _model(self, step: EnsembleStep) -> StepModel:
        return self._models.get(step.model_name, None if step.model_version == -1 else step.model_version)

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


class EnsembleTicket:
    """What ``EnsembleScheduler.submit`` returns: ``withdraw()`` cancels the request
    (its steps leave their queues, or their batches' answers are dropped)."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    def withdraw(self) -> None:
        self._task.cancel()


class _Facts:
    """A step input as the checking core reads it (its datatype was checked at load)."""

    __slots__ = ("dt", "shape", "size", "negative")

    def __init__(self, array: np.ndarray, data_type: DataType) -> None:
        self.dt: DataType | None = data_type
        self.shape: tuple[int, ...] = array.shape
        self.size = array.nbytes
        self.negative = False


def _in_step(exc: NereidError, ensemble: str, step: str) -> NereidError:
    """``exc``, the same class with the same subject, its message prefixed with the
    ensemble and the step (``in ensemble 'E', step 'S': ...``)."""
    message = f"in ensemble '{ensemble}', step '{step}': {exc.message}"
    wrapped = type(exc).__new__(type(exc))
    wrapped.__dict__.update(exc.__dict__)
    Exception.__init__(wrapped, message)
    wrapped.message = message
    return wrapped


def _reason(exc: BaseException) -> str:
    """Triton's failure reason (the metric label) for an ensemble request that failed."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, (QueueFullError, RequestTimeoutError)):
        return "REJECTED"
    if isinstance(exc, (ModelExecutionError, ExecutionTimeoutError)):
        return "BACKEND"
    return "OTHER"
