"""EnsembleScheduler: one ensemble version's way in, as a DynamicBatcher's for a model.

``infer``, ``submit`` and ``stream`` run a request through the version's Dataflow
(dataflow.py: a step request per step, each through its step model's own queue and
batcher) and count it in the ensemble's statistics; ``problem`` says why the ensemble
cannot serve now (a step model not loaded, or no longer fitting); ``aclose`` lets the
requests running finish. Knows nothing about HTTP, gRPC or how models are loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import numpy as np

from nereid.config.schema import ModelConfig
from nereid.ensembles.dataflow import Dataflow, StepModels
from nereid.ensembles.graph import decoupled_problem, ensemble_problem
from nereid.errors import InternalError, NereidError, UnavailableError
from nereid.inference import ComputeTotals, InferRequest
from nereid.stats import ModelStats

__all__ = ["EnsembleScheduler", "EnsembleTicket"]

_log = logging.getLogger("nereid")

#: The failure reason (metric label) of every failed ensemble request, whatever failed it:
#: Triton's ensemble scheduler reports its failures with FailureReason::OTHER only
#: (RequestTracker's ReportStatisticsWithDuration, and each RespondIfError of
#: ensemble_scheduler.cc); the failed step request counts its own reason in its model.
_FAILURE_REASON = "OTHER"

#: ``on_answer(outputs, error)``, as ``DynamicBatcher.submit`` takes it
OnAnswer = Callable[[Any, "BaseException | None"], None]


class EnsembleScheduler:
    """The scheduler of one ensemble version: ``infer``, ``submit`` and ``stream`` as a
    DynamicBatcher offers them, for a ServingModel whose config is an ensemble's."""

    def __init__(self, config: ModelConfig, steps: StepModels, stats: ModelStats,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        assert config.ensemble_scheduling is not None
        self.config = config
        self.name = config.name
        self._flow = Dataflow(config, steps)
        self._stats = stats
        self._clock = clock
        #: requests in flight, and the tasks of those that came through ``submit``
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._checked: tuple[int, ...] = ()

    async def __aenter__(self) -> EnsembleScheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, drain_timeout: float | None = None) -> bool:
        """Stop taking requests; let those running finish (their steps run in the step
        models); after ``drain_timeout`` the rest fail with UnavailableError (False)."""
        self._closed = True
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout)
        except TimeoutError:
            for task in self._tasks:
                task.cancel()
            return False
        return True

    @property
    def queue_depth(self) -> int:
        """An ensemble has no queue of its own (its steps wait in their models' queues)."""
        return 0

    @property
    def executing(self) -> int:
        """Ensemble requests in flight."""
        return self._inflight

    @property
    def problem(self) -> str | None:
        """Why the ensemble cannot serve now (Triton's words): a step's model has no
        READY version (or not the one the step names), or the step models' configs no
        longer fit the ensemble (a step model reloaded with other inputs), or a step
        model cannot serve now; None when it can."""
        found = self._problem()
        return None if found is None else found[0]

    @property
    def settled(self) -> bool:
        """Whether ``problem`` changes only when a step model is loaded, unloaded or
        reloaded (what the model manager announces): every step's model is settled
        (``ServingModel.settled``); a step with no model now is the manager's state."""
        for step in self._flow.steps:
            try:
                model = self._flow.model(step)
            except NereidError:
                continue
            if not model.settled:
                return False
        return True

    @property
    def withdrawn(self) -> bool:
        """True when Triton would have unloaded the ensemble: its dependency check fails
        (a step model with no loaded version or not the required one, or one that no
        longer fits), and ModelRepositoryManager::LoadModelByDependency unloads an
        ensemble whose check fails, leaving it UNAVAILABLE with the reason "unloaded"
        (which strict readiness accepts) until the step model is back. False when it
        serves, or when only a step model's instances cannot serve now (Triton keeps
        the ensemble loaded then)."""
        found = self._problem()
        return found is not None and found[1]

    def _problem(self) -> tuple[str, bool] | None:
        """(why the ensemble cannot serve, whether Triton would have unloaded it), or None."""
        configs = []
        for step in self._flow.steps:
            try:
                model = self._flow.model(step)
            except NereidError:
                if step.model_version == -1:
                    return f"ensemble '{self.name}' depends on '{step.model_name}' which has no loaded version", True
                return (f"ensemble '{self.name}' depends on '{step.model_name}' whose required version "
                        f"{step.model_version} is not loaded"), True
            if model.problem is not None:
                return f"ensemble '{self.name}' depends on '{step.model_name}': {model.problem}", False
            configs.append(model.config)
        key = tuple(id(config) for config in configs)
        if key != self._checked:
            problem = ensemble_problem(self.config, configs)
            if problem is not None:
                return problem, True
            if decoupled_problem(self.config, configs)[1] != self.config.decoupled:
                return (f"ensemble '{self.name}': a step model's decoupled setting changed since the ensemble "
                        "loaded; load the ensemble again"), True
            self._checked = key
        return None

    # -- the three ways in -------------------------------------------------------------

    async def infer(self, request: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                    timeout_us: int | None = None) -> dict[str, np.ndarray]:
        """Run one ensemble request; the ensemble's outputs. A step's failure fails it,
        with the step's error class and ``in ensemble 'E', step 'S': <its message>``."""
        return await self._run(request, *self._arrived(received_ns))

    def submit(self, request: InferRequest, received_ns: int | None, on_answer: OnAnswer, *, priority: int = 0,
               timeout_us: int | None = None) -> EnsembleTicket:
        """Start one ensemble request; ``on_answer(outputs, error)`` is called once with
        its answer (a CancelledError when withdrawn)."""
        task = asyncio.get_running_loop().create_task(self._run(request, *self._arrived(received_ns)))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._answer(done, on_answer))
        return EnsembleTicket(task)

    async def stream(self, request: InferRequest, received_ns: int | None = None, *, priority: int = 0,
                     timeout_us: int | None = None) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """The ensemble's responses as they come: one per flow that completes its outputs
        (one in all for an ensemble without decoupled steps). Leaving early cancels the
        steps still running."""
        responses = self._counted(request, *self._arrived(received_ns))
        async with contextlib.aclosing(responses):
            async for outputs in responses:
                yield outputs

    def _arrived(self, received_ns: int | None) -> tuple[int, int]:
        """(when the request was received, when it reached this scheduler: Triton's
        queue start of an ensemble request, EnsembleScheduler::Enqueue)."""
        if self._closed:
            raise UnavailableError(f"model '{self.name}' was unloaded")
        now = self._clock()
        return (now if received_ns is None else received_ns), now

    def _answer(self, task: asyncio.Task[dict[str, np.ndarray]], on_answer: OnAnswer) -> None:
        self._tasks.discard(task)
        try:
            if task.cancelled():
                on_answer(None, asyncio.CancelledError())
            elif (error := task.exception()) is not None:
                on_answer(None, error)
            else:
                on_answer(task.result(), None)
        except Exception:  # noqa: BLE001 - a failing caller must not stop the loop's callbacks
            _log.exception("answering an ensemble request of '%s' failed", self.name)

    # -- statistics around the dataflow ---------------------------------------------------

    async def _run(self, request: InferRequest, received_ns: int, enqueued_ns: int) -> dict[str, np.ndarray]:
        """The request's one response (a decoupled ensemble's last), counted."""
        last: dict[str, np.ndarray] | None = None
        async for outputs in self._counted(request, received_ns, enqueued_ns):
            last = outputs
        if last is None:
            raise InternalError(f"ensemble '{self.name}': its steps gave no response")
        return last

    async def _counted(self, request: InferRequest, received_ns: int,
                       enqueued_ns: int) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """The dataflow's responses; the request counted in the ensemble's statistics when
        it ends, as Triton's RequestTracker counts it: on success, one execution of the
        request's batch size whose compute_input, compute_infer and compute_output are
        the sums of what its step requests were charged (their batches' compute times),
        and a queue time from its arrival here to its first steps' start; on failure
        (leaving early too), one failure with Triton's reason, OTHER."""
        started = self._clock()
        totals = ComputeTotals()
        self._inflight += 1
        self._idle.clear()
        try:
            responses = self._flow.responses(request, totals)
            async with contextlib.aclosing(responses):
                async for outputs in responses:
                    yield outputs
        except BaseException as exc:
            self._stats.record_failure(self._clock() - received_ns, _FAILURE_REASON)
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        compute = (totals.input_ns, totals.infer_ns, totals.output_ns)
        self._stats.record_batch(max(request.rows, 1), self._clock() - received_ns, [started - enqueued_ns],
                                 compute, None)
        if request.compute_totals is not None:  # a step of an outer ensemble: charged there too
            request.compute_totals.add(*compute)


class EnsembleTicket:
    """What ``EnsembleScheduler.submit`` returns: ``withdraw()`` cancels the request
    (its steps leave their queues, or their batches' answers are dropped)."""

    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    def withdraw(self) -> None:
        self._task.cancel()
