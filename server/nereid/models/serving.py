"""ServingModel: a READY model version as the surfaces use it (the serving handle).

The surfaces (HTTP endpoints, the generate extension, the in-process API, metrics) reach
a model only through this object: ``infer`` (await the answer), ``submit`` (answered
through a callback), ``stream`` (a decoupled model's steps), and ``queue_depth`` /
``executing`` for metrics. How requests are batched and answered lives behind it
(batcher.py, pending.py); how it is built and closed in model_loader.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, Mapping, Protocol, Sequence

import numpy as np

from nereid.ensembles import EnsembleScheduler
from nereid.scheduling.batcher import DynamicBatcher
from nereid.scheduling.sequence_batcher import SequenceBatcher
from nereid.config.schema import ModelConfig
from nereid.errors import ModelNotFoundError, NereidError
from nereid.inference import InferRequest
from nereid.instances.thread import ModelInstance
from nereid.instances.process import ProcessInstance
from nereid.repository.model_file import ModelClass
from nereid.scheduling.pending import Answer, Bundle, BundleAnswer, OnAnswer
from nereid.stats import ModelStats

__all__ = ["ServingModel", "Ticket"]

class Ticket(Protocol):
    """What ``ServingModel.submit`` returns: ``withdraw()`` it if the caller goes away
    (a batcher's ``Pending``, or an ensemble's ``EnsembleTicket``)."""

    def withdraw(self) -> None: ...


@dataclass(eq=False)
class ServingModel:
    """A READY model version: its config (records and Triton JSON), statistics, and the
    ways in. ``batcher`` and ``instances`` are the loader's (model_loader.py), not the
    surfaces'. An ensemble's ``batcher`` is its EnsembleScheduler (its steps run through
    their own models' batchers), and it has no instances nor model class."""

    name: str
    version: int
    config: ModelConfig
    config_json: dict[str, Any]
    stats: ModelStats
    batcher: DynamicBatcher | SequenceBatcher | EnsembleScheduler
    instances: tuple[ModelInstance | ProcessInstance, ...]
    model_class: ModelClass | None
    labels: Mapping[str, list[str]] = field(default_factory=dict)
    #: set when this object stops taking traffic; ``successor`` when a reload of the
    #: same version replaced it.
    retired: bool = field(default=False, init=False, repr=False)
    successor: ServingModel | None = field(default=None, init=False, repr=False)

    @property
    def problem(self) -> str | None:
        """Why this version cannot serve now, when none of its instances can (a process
        restarting, an instance stuck past its execution timeout); None when one can.
        Requests still queue meanwhile, and run once an instance is back. An ensemble's:
        why one of its steps cannot serve (``EnsembleScheduler.problem``)."""
        if isinstance(self.batcher, EnsembleScheduler):
            return self.batcher.problem
        problems = [instance.problem for instance in self.instances]
        if not problems or any(problem is None for problem in problems):
            return None
        return "no instance can serve: " + "; ".join(p for p in problems if p is not None)

    @property
    def settled(self) -> bool:
        """Whether ``problem`` changes only along with what the model manager announces
        (``ModelManager.on_change``): none of its instances is a process (they restart on
        their own), the batcher times none of its batches (no execution timeout), and an
        ensemble's step models are settled (``EnsembleScheduler.settled``). A front-end
        worker answers readiness from its picture of the models only where every version
        it reads is settled (frontends/local_answers.py)."""
        if isinstance(self.batcher, EnsembleScheduler):
            return self.batcher.settled
        return not self.has_process_instances and self.config.execution_timeout_ms <= 0

    @property
    def withdrawn(self) -> bool:
        """An ensemble that Triton would have unloaded because of its step models
        (``EnsembleScheduler.withdrawn``): the index and readiness treat it as unloaded."""
        return isinstance(self.batcher, EnsembleScheduler) and self.batcher.withdrawn

    @property
    def has_process_instances(self) -> bool:
        return any(isinstance(instance, ProcessInstance) for instance in self.instances)

    @property
    def restarts(self) -> int:
        """Restarts of this version's process instances (0 for thread instances)."""
        return sum(instance.restarts for instance in self.instances if isinstance(instance, ProcessInstance))

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]:
        """Run one request through the batcher; its own output rows come back.

        A caller that looked this object up just before a reload retired it is served by
        the object that replaced it; after an unload it gets Triton's "no available
        versions" error (the manager never hands out a retired object itself)."""
        serving = self if self.successor is None and not self.retired else self._current()
        outputs: dict[str, np.ndarray] = await serving.batcher.infer(
            request, received_ns, priority=request.priority, timeout_us=request.timeout_us)
        return outputs

    def submit(self, request: InferRequest, received_ns: int | None, on_answer: OnAnswer) -> Ticket:
        """Queue one request without waiting (``infer`` for callback-driven callers):
        ``on_answer(outputs, error)`` is called once with its answer (``DynamicBatcher.submit``);
        ``ticket.withdraw()`` if the caller goes away."""
        serving = self if self.successor is None and not self.retired else self._current()
        return serving.batcher.submit(
            request, received_ns, on_answer, priority=request.priority, timeout_us=request.timeout_us)

    def submit_many(
        self, requests: Sequence[InferRequest], received_ns: Sequence[int], answers: Sequence[Answer], *,
        priority: int = 0, timeout_us: int | None = None,
    ) -> list[Ticket | NereidError]:
        """Queue several requests of one priority and timeout at once, each answered
        through its own ``Answer`` (``DynamicBatcher.submit_many``: one wake-up for them
        all; any other scheduler takes them one by one). One result per request: its
        Ticket, or the error that refused it."""
        serving = self if self.successor is None and not self.retired else self._current()
        batcher = serving.batcher
        if isinstance(batcher, DynamicBatcher):
            return list(batcher.submit_many(requests, received_ns, answers, priority=priority, timeout_us=timeout_us))
        tickets: list[Ticket | NereidError] = []
        for request, received, answer in zip(requests, received_ns, answers):
            try:
                tickets.append(batcher.submit(request, received, _callback_of(answer), priority=priority,
                                              timeout_us=timeout_us))
            except NereidError as exc:
                tickets.append(exc)
        return tickets

    @property
    def bundle_limit(self) -> int:
        """The most rows one bundle of requests may hold (``submit_bundle``); 0: this
        version takes none (``BatcherLifecycle.bundle_limit``)."""
        batcher = self.batcher
        return batcher.bundle_limit if isinstance(batcher, DynamicBatcher) else 0

    def submit_bundle(self, request: InferRequest, count: int, received_ns: int,
                      answer: BundleAnswer) -> Bundle | NereidError:
        """Queue ``count`` alike requests as one entry (``DynamicBatcher.submit_bundle``):
        ``request`` holds all their rows, ``received_ns`` is their mean, ``answer``
        answers them all; only within ``bundle_limit``. Its Bundle, or the error that
        refused it."""
        batcher = self.batcher
        assert isinstance(batcher, DynamicBatcher) and self.successor is None and not self.retired
        return batcher.submit_bundle(request, count, received_ns, answer, priority=request.priority,
                                     timeout_us=request.timeout_us)

    async def stream(
        self, request: InferRequest, received_ns: int | None = None
    ) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """A decoupled model's request: its outputs step by step (``DynamicBatcher.stream``).
        Closing the iteration early (the client went away) takes the request out of its
        queue or batch at once."""
        steps = self._current().batcher.stream(
            request, received_ns, priority=request.priority, timeout_us=request.timeout_us)
        async with contextlib.aclosing(steps):
            async for step in steps:
                yield step

    @property
    def queue_depth(self) -> int:
        """Requests waiting in this version's queue now."""
        return self.batcher.queue_depth

    @property
    def executing(self) -> int:
        """This version's batches running now."""
        return self.batcher.executing

    def _current(self) -> ServingModel:
        """The object serving this version now (its successor after a reload); Triton's
        error once unloaded. The callers skip the call while this one serves."""
        serving = self
        while serving.successor is not None:
            serving = serving.successor
        if serving.retired:
            raise ModelNotFoundError(
                f"Request for unknown model: '{self.name}' has no available versions", model=self.name
            )
        return serving


def _callback_of(answer: Answer) -> OnAnswer:
    """``on_answer(outputs, error)`` that answers ``answer`` (a scheduler that takes callbacks)."""

    def on_answer(outputs: Any, error: BaseException | None) -> None:
        if error is None:
            answer.set_result(outputs)
        elif isinstance(error, asyncio.CancelledError):
            answer.cancel()
        else:
            answer.set_exception(error)

    return on_answer
