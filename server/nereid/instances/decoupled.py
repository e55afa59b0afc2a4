"""DecoupledBatches: how a thread instance (``thread.ModelInstance``) runs one batch of a
decoupled model, step by step: ``run_stream`` and its three kinds of model (a generator
``infer``, an async generator ``infer``, a decoupled TritonPythonModel).

Kept apart from ``thread.py``, which holds what one infer request of a model that is not
decoupled crosses (``run_batch``), so that a reader of that path need not skip over this.
Knows nothing about queues, scheduling or HTTP; whatever model code raises comes back in
the outcome (model_errors.py).
"""

from __future__ import annotations

import abc
import asyncio
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nereid.config.schema import ModelConfig
from nereid.context import ModelContext
from nereid.errors import ModelExecutionError, NereidError
from nereid.inference import InferRequest
from nereid.instances.model_errors import cancelled_by_loop
from nereid.instances.outcome import BatchOutcome, StepSink
from nereid.repository.model_file import ModelClass
from nereid.tensors.assembly import assemble, split, split_step
from nereid.tensors.device import DeviceInputs

__all__ = ["DecoupledBatches"]


class DecoupledBatches(abc.ABC):
    """``run_stream`` of ``thread.ModelInstance``, which is this class with its batches
    and lifecycle: the attributes and methods below are the instance's."""

    model_class: ModelClass
    config: ModelConfig
    context: ModelContext
    device_inputs: DeviceInputs | None
    _threads: Any  # thread.InstanceThreads
    _model: Any
    _infer: Callable[..., Any] | None

    @abc.abstractmethod
    def _output_fault(self, error: NereidError) -> None:
        """Log an output that does not fit the config as the model's fault."""

    @abc.abstractmethod
    def _execution_error(self, exc: BaseException) -> ModelExecutionError:
        """What the model raised, logged, as the batch's error."""

    @abc.abstractmethod
    def _parameters(self, requests: Sequence[InferRequest]) -> tuple[list[Mapping[str, Any]], ...]:
        """The per-row request parameters, for a model whose infer takes them."""

    async def run_stream(
        self, requests: Sequence[InferRequest], sink: StepSink, abandoned: Callable[[], bool], /
    ) -> BatchOutcome:
        """Execute one batch of a decoupled model: ``infer`` is a generator (or async
        generator) yielding output dicts for the whole batch, step by step. Each step is
        split per request and handed to ``sink`` on the event loop. The generator is closed
        early once ``abandoned()`` (every request finished or gone). Never raises for model
        errors (they come back in the outcome)."""
        loop = asyncio.get_running_loop()
        if self.model_class.triton:
            return await self._stream_triton(requests, sink, abandoned)
        if self.model_class.infer_is_async:
            return await self._stream_async(requests, sink, abandoned)

        def deliver(parts: list[dict[str, np.ndarray]], finished: list[bool]) -> None:
            loop.call_soon_threadsafe(sink, parts, finished)

        outcome: BatchOutcome = await self._threads.call(self._stream_sync, requests, deliver, abandoned)
        return outcome

    async def _stream_triton(
        self, requests: Sequence[InferRequest], sink: StepSink, abandoned: Callable[[], bool]
    ) -> BatchOutcome:
        """A decoupled TritonPythonModel: ``execute`` runs on the instance thread and
        returns; responses come through each request's sender, from any thread, until
        each request's final flag (or until nobody listens)."""
        loop = asyncio.get_running_loop()
        count = len(requests)
        open_requests = set(range(count))
        all_final = loop.create_future()
        name = self.context.model_name
        config = self.config

        def on_loop(index: int, answer: Any, final: bool) -> None:
            if index not in open_requests:
                return
            parts: list[Any] = [None] * count
            finished = [False] * count
            if isinstance(answer, dict):
                try:
                    answer = split(answer, [requests[index]], config, name)[0]
                except NereidError as exc:
                    self._output_fault(exc)
                    answer, final = exc, True
            elif answer is not None:  # an error response ends its request
                final = True
            parts[index], finished[index] = answer, final
            sink(parts, finished)
            if final:
                open_requests.discard(index)
            if (not open_requests or abandoned()) and not all_final.done():
                all_final.set_result(None)

        def deliver(index: int, answer: Any, final: bool) -> None:
            loop.call_soon_threadsafe(on_loop, index, answer, final)

        t0 = time.monotonic_ns()
        try:
            await self._threads.call(self._model.execute_decoupled, requests, deliver, lambda _: abandoned())
        except BaseException as exc:
            if cancelled_by_loop(exc):
                raise
            return self._stream_outcome(t0, exc)
        if open_requests:
            await all_final
        return self._stream_outcome(t0, None)

    def _stream_sync(
        self, requests: Sequence[InferRequest], deliver: StepSink, abandoned: Callable[[], bool]
    ) -> BatchOutcome:
        t0 = time.monotonic_ns()
        try:
            steps = self._steps(requests, "__next__", "a decoupled model's infer must be a generator")
            try:
                for step in steps:
                    deliver(*split_step(step, requests, self.config, self.context.model_name))
                    if abandoned():
                        break
            finally:
                steps.close()
        except BaseException as exc:  # on the instance thread: all of it is the model's
            return self._stream_outcome(t0, exc)
        return self._stream_outcome(t0, None)

    async def _stream_async(
        self, requests: Sequence[InferRequest], sink: StepSink, abandoned: Callable[[], bool]
    ) -> BatchOutcome:
        t0 = time.monotonic_ns()
        try:
            steps = self._steps(requests, "__anext__", "a decoupled async model's infer must be an async generator")
            try:
                async for step in steps:
                    sink(*split_step(step, requests, self.config, self.context.model_name))
                    if abandoned():
                        break
            finally:
                await steps.aclose()
        except BaseException as exc:
            if cancelled_by_loop(exc):
                raise
            return self._stream_outcome(t0, exc)
        return self._stream_outcome(t0, None)

    def _steps(self, requests: Sequence[InferRequest], step_method: str, must_be: str) -> Any:
        """The model's (async) generator for this batch: ``must_be`` (a TypeError) when
        what ``infer`` returned has no ``step_method``."""
        inputs: dict[str, Any] = assemble(requests, self.config)
        if self.device_inputs is not None:
            inputs = self.device_inputs(inputs)
        assert self._infer is not None
        steps = self._infer(inputs, *self._parameters(requests))
        if not hasattr(steps, step_method):
            raise TypeError(f"{must_be}, got {type(steps).__name__}")
        return steps

    def _stream_outcome(self, t0: int, exc: BaseException | None) -> BatchOutcome:
        """How a stream that began at ``t0`` ended: done, or failed with ``exc`` (a
        NereidError as it is, anything else as the model's execution error)."""
        error: NereidError | None = None
        if isinstance(exc, NereidError):
            self._output_fault(exc)
            error = exc
        elif exc is not None:
            error = self._execution_error(exc)
        return BatchOutcome([] if error is None else None, error, 0, time.monotonic_ns() - t0, 0)
