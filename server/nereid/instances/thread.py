"""ModelInstance: one user ``Model`` object, its own thread(s) and its device.

Owns running user code off the event loop: construction, batches (assemble -> infer ->
split, all on the instance's threads for a synchronous ``infer``) and ``close()``.
Knows nothing about queues, scheduling or HTTP.

Whatever model code raises fails only the call it was in: an Exception, and as much any
other BaseException (SystemExit, KeyboardInterrupt, GeneratorExit, a CancelledError of
the model's own). None of them ends an instance thread, a batcher's worker or the event
loop. Only the loop cancelling the task that runs the model (``cancelled_by_loop``:
shutdown, a drain timeout) goes on up as a cancellation (model_errors.py). The threads
are ``InstanceThreads`` (below; process instances use them too); the records a batch
comes to, outcome.py's; a decoupled model's batches, decoupled.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Awaitable, Callable, ContextManager, Mapping, Sequence

import numpy as np

from nereid.tensors.assembly import assemble, split
from nereid.config.schema import ModelConfig
from nereid.context import ModelContext
from nereid.tensors.device import DeviceInputs, outputs_to_host
from nereid.errors import ModelExecutionError, ModelLoadError, NereidError
from nereid.inference import InferRequest
from nereid.faults import FaultLog
from nereid.instances.decoupled import DecoupledBatches
from nereid.instances.model_errors import as_exception, cancelled_by_loop
from nereid.instances.outcome import BatchOutcome, StepSink
from nereid.repository.model_file import ModelClass, describe_exception
from nereid.triton_python.adapter import TritonModel
from nereid.triton_python.bls import BlsTarget

__all__ = ["InstanceThreads", "ModelInstance", "BatchOutcome", "StepSink"]

_log = logging.getLogger("nereid")

#: How long ``ModelInstance.close`` waits for its threads to let go of their last call.
_STOP_TIMEOUT_S = 2.0


class ModelInstance(DecoupledBatches):
    """One instance of a model. ``start()`` builds the user's object on the instance's own
    thread; ``run_batch()`` executes one batch; ``close()`` calls the model's ``close()``
    and stops the threads. ``capacity`` batches may run at once."""

    def __init__(
        self,
        model_class: ModelClass,
        context: ModelContext,
        config: ModelConfig,
        faults: FaultLog | None = None,
        bls: BlsTarget | None = None,
        dispatch_turn: ContextManager[Any] | None = None,
    ) -> None:
        self.model_class = model_class
        #: held while ``infer`` runs: the version's instances on one CUDA device take turns
        #: queueing their work (``DispatchTurns``); none by default
        self.dispatch_turn: ContextManager[Any] = dispatch_turn or contextlib.nullcontext()
        #: the server's fault log (the model loader's; a log of its own when none is given)
        self.faults = faults if faults is not None else FaultLog()
        #: where a Triton model's BLS requests go (its server's models)
        self.bls = bls
        #: why this instance cannot serve right now (None: it can); set by the batcher
        #: while a batch is stuck past the execution timeout.
        self.problem: str | None = None
        #: the batcher times its batches where an execution timeout is set (a thread
        #: stuck in model code cannot be stopped)
        self.enforces_timeout = False
        self.context = context
        self.config = config
        self.name = context.instance_name
        batching = config.dynamic_batching
        self.capacity = batching.max_concurrent_batches if batching is not None else 1
        self._threads: InstanceThreads = InstanceThreads(self.capacity, self.name)
        self._model: Any = None
        self._infer: Callable[..., Any] | None = None
        self._cost: Callable[[dict[str, np.ndarray]], int] | None = None
        #: ``input_tensors = "torch"``: moves each batch's inputs onto the device (start())
        self.device_inputs: DeviceInputs | None = None

    @property
    def model(self) -> Any:
        """The user's Model object (None before ``start()``)."""
        return self._model

    @property
    def queues_batches(self) -> bool:
        """Whether a batch may be handed over while another runs (it waits for a free
        thread and starts the moment one is): a synchronous ``infer`` runs on the
        instance's threads; an ``async def infer`` runs on the loop, where it would not wait."""
        return not self.model_class.infer_is_async

    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None:
        """The model's ``batch_size(inputs)`` method, when it defines one."""
        return self._cost

    @property
    def sees_requests(self) -> bool:
        """The model gets the batch's requests one by one (a TritonPythonModel's
        ``execute``), not one batch of inputs."""
        return self.model_class.triton

    async def start(self) -> None:
        """Construct the user's Model on this instance's thread. Raises ModelLoadError."""
        try:
            self._model = await self._threads.call(self._construct)
        except BaseException as exc:  # SystemExit from __init__ too: a failed load, not an exit
            if cancelled_by_loop(exc):
                raise
            self._fault("__init__", exc)
            await self._threads.stop(_STOP_TIMEOUT_S)
            raise ModelLoadError(
                self.context.model_name,
                f"{self.model_class.path}: Model.__init__ failed for instance "
                f"{self.name}: {describe_exception(exc)}",
                str(self.model_class.path),
            ) from exc
        self._infer = self._model.execute if self.model_class.triton else self._model.infer
        if self.config.input_tensors == "torch" and not self.model_class.triton:
            self.device_inputs = await self._threads.call(DeviceInputs, self.context.device)
        if self.model_class.has_batch_size:
            self._cost = self._batch_size

    def _batch_size(self, inputs: dict[str, np.ndarray]) -> int:
        """The model's ``batch_size(inputs)``, its failures logged as model faults."""
        try:
            return self._model.batch_size(inputs)  # type: ignore[no-any-return]
        except Exception as exc:
            self._fault("batch_size", exc)
            raise
        except BaseException as exc:  # SystemExit & co: called on the loop by code that handles Exceptions
            self._fault("batch_size", exc)
            raise as_exception(exc)

    def _fault(self, stage: str, exc: BaseException) -> None:
        self.faults.record(self.context.model_name, self.context.model_version, stage, exc)

    def _output_fault(self, error: NereidError) -> None:
        if isinstance(error, ModelExecutionError):
            self.faults.record_message(self.context.model_name, self.context.model_version, "outputs", error.message)

    def _construct(self) -> Any:
        if self.context.device.startswith("cuda"):
            import torch  # lazily: only GPU instances need it

            torch.cuda.set_device(self.context.device)
        if self.model_class.triton:
            return TritonModel(self.model_class.cls, self.context, self.bls)
        if not self.model_class.init_takes_context:
            return self.model_class.cls()
        return self.model_class.cls(self.context)

    def run_batch(self, requests: Sequence[InferRequest], /) -> Awaitable[BatchOutcome]:
        """Execute one batch: never raises for model errors (they come back in the outcome).
        A model run on the instance's threads has the batch when this returns: the result
        is their future (no task between the batcher and the thread)."""
        if self.model_class.triton:
            return self._threads.call(self._run_triton, requests)
        if self.model_class.infer_is_async:
            return self._run_async(requests)
        return self._threads.call(self._run_sync, requests)

    def _run_sync(self, requests: Sequence[InferRequest]) -> BatchOutcome:
        prepared = self._prepare(requests)
        if isinstance(prepared, BatchOutcome):
            return prepared
        t0, t1, call = prepared
        try:
            with self.dispatch_turn:
                raw = call()
        except BaseException as exc:  # on the instance thread: all of it is the model's
            return self._infer_failed(exc, t0, t1)
        outcome = self._split(raw, requests, t0, t1, time.monotonic_ns())
        return dataclasses.replace(outcome, began_ns=t0, ended_ns=time.monotonic_ns())

    async def _run_async(self, requests: Sequence[InferRequest]) -> BatchOutcome:
        prepared = self._prepare(requests)
        if isinstance(prepared, BatchOutcome):
            return prepared
        t0, t1, call = prepared
        try:
            raw = await call()
        except BaseException as exc:
            if cancelled_by_loop(exc):
                raise
            return self._infer_failed(exc, t0, t1)
        return self._split(raw, requests, t0, t1, time.monotonic_ns())

    def _prepare(self, requests: Sequence[InferRequest]) -> tuple[int, int, Callable[[], Any]] | BatchOutcome:
        """When assembly began and ended, and the model's ``infer`` bound to the batch's
        inputs (and parameters); or the outcome that fails the batch at assembly."""
        t0 = time.monotonic_ns()
        inputs = self._assemble(requests, t0)
        if isinstance(inputs, BatchOutcome):
            return inputs
        infer = self._infer
        assert infer is not None
        parameters = self._parameters(requests)
        return t0, time.monotonic_ns(), lambda: infer(inputs, *parameters)

    def _infer_failed(self, exc: BaseException, t0: int, t1: int) -> BatchOutcome:
        """The outcome of a batch whose ``infer`` raised ``exc`` (assembled from t0 to t1)."""
        return BatchOutcome(None, self._execution_error(exc), t1 - t0, time.monotonic_ns() - t1, 0)

    def _run_triton(self, requests: Sequence[InferRequest]) -> BatchOutcome:
        """A TritonPythonModel's ``execute`` over the batch's requests, each answered on its
        own: an error response (or outputs that do not fit the config) fails only its
        request; a raise fails the batch."""
        t0 = time.monotonic_ns()
        try:
            answers = self._model.execute(requests)
        except BaseException as exc:  # on the instance thread: all of it is the model's
            error = exc if isinstance(exc, NereidError) else self._execution_error(exc)
            return BatchOutcome(None, error, 0, time.monotonic_ns() - t0, 0)
        t1 = time.monotonic_ns()
        outputs: list[Any] = []
        for request, answer in zip(requests, answers):
            if isinstance(answer, NereidError):
                outputs.append(answer)
                continue
            try:
                outputs.append(split(answer, [request], self.config, self.context.model_name)[0])
            except NereidError as exc:
                self._output_fault(exc)
                outputs.append(exc)
        return BatchOutcome(outputs, None, 0, t1 - t0, time.monotonic_ns() - t1)

    def _parameters(self, requests: Sequence[InferRequest]) -> tuple[list[Mapping[str, Any]], ...]:
        """``(per_row,)`` for a model whose infer takes parameters, else ``()``: one dict of
        request parameters per row of the batch (a request with several rows repeats it)."""
        if not self.model_class.infer_takes_parameters:
            return ()
        return ([request.parameters for request in requests for _ in range(request.rows)],)

    def _assemble(self, requests: Sequence[InferRequest], t0: int) -> dict[str, Any] | BatchOutcome:
        """The batch's inputs (on the device with ``input_tensors = "torch"``), or the
        outcome that fails the batch (compute_input timed)."""
        try:
            inputs = assemble(requests, self.config)
        except NereidError as exc:
            return BatchOutcome(None, exc, time.monotonic_ns() - t0, 0, 0)
        if self.device_inputs is None:
            return inputs
        try:
            return self.device_inputs(inputs)
        except BaseException as exc:  # torch's (out of memory): fails the batch
            return BatchOutcome(None, self._execution_error(exc), time.monotonic_ns() - t0, 0, 0)

    def _split(self, raw: Any, requests: Sequence[InferRequest], t0: int, t1: int, t2: int) -> BatchOutcome:
        """Each request's outputs from the model's return value, with the three durations."""
        try:
            if self.context.device != "cpu":  # CUDA tensors: one copy for the batch
                raw = outputs_to_host(raw)
            outputs = split(raw, requests, self.config, self.context.model_name)
        except NereidError as exc:
            self._output_fault(exc)
            return BatchOutcome(None, exc, t1 - t0, t2 - t1, time.monotonic_ns() - t2)
        except BaseException as exc:  # model objects' own code (no await here: never a cancellation)
            return BatchOutcome(None, self._execution_error(exc), t1 - t0, t2 - t1, time.monotonic_ns() - t2)
        return BatchOutcome(outputs, None, t1 - t0, t2 - t1, time.monotonic_ns() - t2)

    def _execution_error(self, exc: BaseException) -> ModelExecutionError:
        self._fault("infer", exc)
        model = self.context.model_name
        return ModelExecutionError(
            f'model "{model}" raised in infer: {describe_exception(exc)}', model=model
        )

    async def close(self, abandoned: bool = False) -> None:
        """Call the model's ``close()`` (on the instance thread) and stop the threads.
        ``abandoned``: a batch is still stuck in model code (shutdown gave up on it), so
        ``close()`` is not called (it would wait behind that batch) and nothing waits."""
        model = self._model
        if abandoned:
            self._model = self._infer = self._cost = None
            await self._threads.stop(0)
            return
        if model is not None and self.model_class.has_close:
            try:
                await self._threads.call(model.close)
            except BaseException as exc:  # a failing close() must not stop the unload
                if cancelled_by_loop(exc):
                    raise
                self._fault("close", exc)
        self._model = None
        self._infer = None
        self._cost = None
        if not await self._threads.stop(_STOP_TIMEOUT_S):
            _log.warning(
                "model %r instance %s: its thread is still busy in model code %.0f s after close; "
                "left behind as a daemon thread", self.context.model_name, self.name, _STOP_TIMEOUT_S,
            )


class InstanceThreads:
    """The instance's own threads: calls go in through a queue, results come back as
    asyncio futures resolved on their loop.

    Lighter than ``loop.run_in_executor`` with a ThreadPoolExecutor (no concurrent
    Future, no work-item lock, no thread-count check per call): that pair was a fifth of
    the server's time per request on the identity model. Daemon threads, so a model
    stuck in ``infer`` cannot keep the process alive at exit.
    """

    def __init__(self, count: int, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopping: list[asyncio.Future[Any]] | None = None  # what stop() waits for
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=True) for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def _serve(self) -> None:
        calls = self._calls
        while _run_call(calls.get()):
            pass

    async def stop(self, timeout: float) -> bool:
        """Stop every thread once the calls queued before are done, and wait (up to
        ``timeout`` seconds) until each has let go of its last call and is exiting. False
        if one is still busy (stuck in model code): a daemon thread, it cannot keep the
        process alive."""
        if self._stopping is None:  # once: a second stop would wait for threads long gone
            self._stopping = [self.call(_stop) for _ in self._threads]  # a thread takes one, then ends
        done, _ = await asyncio.wait(self._stopping, timeout=timeout)
        return len(done) == len(self._stopping)


def _stop() -> None:
    """Queued (never called) to tell a thread to answer it and end (``stop``)."""


def _run_call(call: Any) -> bool:
    """Run one queued call and hand its outcome to its loop; False for ``_stop``.

    Its own frame, so that a thread waiting for the next call holds no reference to the
    last one's function, arguments or result (the model object itself, after the call
    that built it): those must be released by the loop, never by a daemon thread that
    may still run while the interpreter shuts down (in 3.11 a daemon thread that needs
    the GIL then is ended by pthread_exit, which aborts the process when it unwinds
    through C++ code, as torch's tensor destructors are)."""
    loop, future, fn, args = call
    if fn is _stop:
        loop.call_soon_threadsafe(_resolve, future, None)
        return False
    try:
        result = fn(*args)
    except BaseException as exc:  # handed to the awaiting coroutine
        loop.call_soon_threadsafe(_reject, future, exc)
    else:
        loop.call_soon_threadsafe(_resolve, future, result)
    return True


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        if isinstance(exc, StopIteration):  # a Future refuses it (TypeError): it would never be done
            error = RuntimeError(f"model code raised {describe_exception(exc)}")
            error.__cause__ = exc
            exc = error
        future.set_exception(exc)
