"""ProcessInstance: a model instance in an OS process (``isolation = "process"``), of its
own or shared with the model's other instances on its device (``processes``): the batches
side; the process is ``worker.py``'s, its supervisor ``supervisor.py``'s.

It has the surface of ``thread.ModelInstance`` (the batcher, warmup and loader cannot
tell them apart): ``start``, ``run_batch``, ``run_stream``, ``cost_function``, ``close``,
``problem``. A batch is assembled here, on the event loop, written into its slot's
shared-memory arena and sent; the loop wakes when the reply arrives (no thread hop); its
outputs are read back and split here, so they are checked exactly as for a thread
instance. Streams (decoupled models) run on the instance's threads, one acknowledged step
at a time.

A process that dies (a signal, ``os._exit``, a crash in a C extension) fails the batch it
was running with an error naming the model, the instance and the cause; the batcher then
reruns the batch-mates one at a time, so only the request that crashes it fails. A batch
past ``execution_timeout_ms`` fails with ExecutionTimeoutError and its process is killed.
Either way the supervisor restarts the process and batches wait for it. In a shared
process a death fails the running batches of every instance in it.
"""

from __future__ import annotations

import asyncio
import time
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from nereid import errors
from nereid.tensors.assembly import assemble, split, split_step
from nereid.config.schema import ModelConfig
from nereid.context import ModelContext
from nereid.errors import ExecutionTimeoutError, ModelExecutionError, ModelLoadError, NereidError
from nereid.inference import InferRequest
from nereid.instances.thread import InstanceThreads
from nereid.instances.model_errors import model_exception
from nereid.instances.outcome import BatchOutcome, StepSink
from nereid.faults import FaultLog
from nereid.repository.model_file import ModelClass
from nereid.instances.call_server import CallServer
from nereid.instances.channel import Arena, ChannelClosed, write_arrays
from nereid.triton_python.bls import BlsTarget
from nereid.instances.replies import adopt_arena, await_reply, release_after_reply, reply_outputs, restore_unsendable
from nereid.instances.link import Slot
from nereid.instances.supervisor import WorkerProcess

__all__ = ["InstanceDiedError", "ProcessInstance", "worker_process"]


def worker_process(model_file: Path, config: ModelConfig) -> WorkerProcess:
    """A worker process for instances of the model ``config`` describes (they join it as
    ProcessInstances, before the first starts it): one, or all those on one device."""
    batching = config.dynamic_batching
    capacity = batching.max_concurrent_batches if batching is not None else 1
    # Two batch slots per batch it may run: the batcher hands the next batch over while
    # the current one runs, and it waits in the process, inputs in, for its turn (not
    # under an execution timeout, which counts from the moment a batch is sent).
    slots = capacity if config.execution_timeout_ms else 2 * capacity
    return WorkerProcess(model_file, config.name, slots + 1, capacity)  # + the control channel


class InstanceDiedError(ModelExecutionError):
    """The process of an instance died (or was killed at its execution timeout) while
    running a batch."""


class ProcessInstance:
    """One instance in a process of its own (see the module docstring)."""

    def __init__(
        self, model_file: Path, context: ModelContext, config: ModelConfig, faults: FaultLog | None = None,
        bls: BlsTarget | None = None, host: WorkerProcess | None = None,
    ) -> None:
        """``bls``: where its model code's BLS requests go (None: not available); its
        custom metrics go to ``context.metrics`` (``call_server.py``). ``host``: the worker
        process it joins (``worker_process()``, shared with other instances); None: one of
        its own."""
        self.model_file = model_file
        #: the server's fault log: outputs that do not match the config (model code's own
        #: failures are logged by the process)
        self.faults = faults if faults is not None else FaultLog()
        self.context = context
        self.config = config
        self.name = context.instance_name
        batching = config.dynamic_batching
        self.capacity = batching.max_concurrent_batches if batching is not None else 1
        self.timeout_s = config.execution_timeout_ms / 1000 if config.execution_timeout_ms else None
        #: the batcher leaves the execution timeout to this instance (it kills its process).
        self.enforces_timeout = True
        #: a batch handed over while another runs is assembled at once and waits for a free
        #: slot (its process starts it as soon as the reply to the one before is read).
        self.queues_batches = True
        self._problem: str | None = None
        self.model_class: ModelClass | None = None
        self.bls = bls
        host = host if host is not None else worker_process(model_file, config)
        self.worker = host.link(
            context, serve_calls=lambda channel, loop: CallServer.of_instance(channel, context, bls, loop),
        )
        self._threads = InstanceThreads(self.capacity, self.name)
        self._cost_inputs: Arena | None = None
        self._cost_generation = -1
        self._cost: Callable[[dict[str, np.ndarray]], int] | None = None

    @property
    def problem(self) -> str | None:
        """Why this instance cannot serve right now (None: it can)."""
        return self._problem or self.worker.problem

    @problem.setter
    def problem(self, problem: str | None) -> None:
        # the batcher's Instance protocol (it marks an instance stuck past the execution
        # timeout; this one enforces that timeout itself, so it is not expected to)
        self._problem = problem

    @property
    def restarts(self) -> int:
        return self.worker.restarts

    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None:
        return self._cost

    @property
    def sees_requests(self) -> bool:
        """The model gets the batch's requests one by one (a TritonPythonModel's
        ``execute``), not one batch of inputs (known once started)."""
        return self.model_class is not None and self.model_class.triton

    # -- life --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the process and wait until its Model is built. Raises ModelLoadError with
        the cause (an import error, an exception in __init__, a crash)."""
        try:
            traits = await self.worker.start()
        except ModelLoadError:
            await self._threads.stop(1.0)
            raise
        self.model_class = ModelClass(
            cls=object, module=types.ModuleType(f"nereid-worker-{self.name}"), path=self.model_file,
            infer_is_async=False, infer_is_generator=traits["infer_is_generator"],
            infer_takes_parameters=traits["infer_takes_parameters"], has_batch_size=traits["has_batch_size"],
            has_close=traits["has_close"], triton=traits.get("triton", False),
        )
        if traits["has_batch_size"]:
            self._cost = self._remote_batch_size

    async def close(self, abandoned: bool = False) -> None:
        """Ask the process to close the model and exit (killed after a grace period; at
        once when ``abandoned``: a batch is stuck in it)."""
        if abandoned:
            self.worker.kill()
        await self.worker.close()
        await self._threads.stop(1.0)

    # -- batches -----------------------------------------------------------------------

    async def run_batch(self, requests: Sequence[InferRequest], /) -> BatchOutcome:
        """Execute one batch in the process; model errors and deaths come back in the outcome.

        Driven from the event loop, with no thread in between: the batch is written into
        the slot's arena and sent, and the loop wakes when the reply arrives (a thread
        hop each way cost more than the process's own work on small batches)."""
        if self.model_class is not None and self.model_class.triton:
            return await self._run_triton(requests)
        t0 = time.monotonic_ns()
        try:
            inputs = assemble(requests, self.config)
        except NereidError as exc:
            return BatchOutcome(None, exc, time.monotonic_ns() - t0, 0, 0)
        slot = await self.worker.take_slot_on_loop()
        t1 = time.monotonic_ns()
        handed_on = False  # the slot went straight to the next batch, waiting for it
        try:
            specs = write_arrays(slot.inputs, inputs)
            slot.channel.send(("infer", specs, self._parameters(requests)), slot.inputs.take_fd_to_send())
            slot.busy = True
            reply = self._reply(slot, await self._reply_on_loop(slot))
            raw = reply_outputs(slot, reply)
        except ChannelClosed:
            return BatchOutcome(None, self._died(None), t1 - t0, time.monotonic_ns() - t1, 0)
        except NereidError as exc:
            return BatchOutcome(None, exc, t1 - t0, time.monotonic_ns() - t1, 0)
        finally:
            if slot.busy:  # cancelled while the process runs the batch: its reply is still to come
                release_after_reply(slot, self.worker)
            else:
                handed_on = self.worker.release(slot)
        t2 = time.monotonic_ns()
        if handed_on:
            await asyncio.sleep(0)  # the next batch goes to the process before this one is split
        try:
            outputs = split(raw, requests, self.config, self.context.model_name)
        except NereidError as exc:
            self._output_fault(exc)
            return BatchOutcome(None, exc, t1 - t0, t2 - t1, time.monotonic_ns() - t2)
        self.worker.succeeded()
        # the instance's own times (its turn), not the loop's: the loop may see the reply late
        began, ended = reply[2]
        return BatchOutcome(outputs, None, t1 - t0, t2 - t1, time.monotonic_ns() - t2, began_ns=began, ended_ns=ended)

    async def _run_triton(self, requests: Sequence[InferRequest]) -> BatchOutcome:
        """A TritonPythonModel's batch in the process: the requests go pickled, each comes
        back with its own answer (outputs checked here as for a thread instance, or the
        error that fails only that request)."""
        slot = await self.worker.take_slot_on_loop()
        t0 = time.monotonic_ns()
        try:
            slot.channel.send(("triton", list(requests)))
            slot.busy = True
            reply = self._reply(slot, await self._reply_on_loop(slot))
        except ChannelClosed:
            return BatchOutcome(None, self._died(None), 0, time.monotonic_ns() - t0, 0)
        except NereidError as exc:
            return BatchOutcome(None, exc, 0, time.monotonic_ns() - t0, 0)
        finally:
            if slot.busy:
                release_after_reply(slot, self.worker)
            else:
                self.worker.release(slot)
        t1 = time.monotonic_ns()
        outputs = [self._triton_answer(request, answer) for request, answer in zip(requests, reply[1])]
        self.worker.succeeded()
        return BatchOutcome(outputs, None, 0, t1 - t0, time.monotonic_ns() - t1)

    def _triton_answer(self, request: InferRequest, answer: Any) -> Any:
        """One request's answer from the process: its checked outputs, or its error."""
        if isinstance(answer, tuple) and answer and answer[0] == "error":
            kind = getattr(errors, answer[1], None)
            if isinstance(kind, type) and issubclass(kind, NereidError):
                return kind(answer[2])
            return ModelExecutionError(answer[2], model=self.context.model_name)
        try:
            return split(restore_unsendable(answer), [request], self.config, self.context.model_name)[0]
        except NereidError as exc:
            self._output_fault(exc)
            return exc

    async def _reply_on_loop(self, slot: Slot) -> tuple[Any, list[int]]:
        """The slot's next message, awaited on the loop (the execution timeout applies)."""
        try:
            return await await_reply(slot, self.worker, self.timeout_s)
        except TimeoutError:
            raise self._died(self.config.execution_timeout_ms) from None

    def _parameters(self, requests: Sequence[InferRequest]) -> tuple[Any, ...]:
        assert self.model_class is not None
        if not self.model_class.infer_takes_parameters:
            return ()
        return ([dict(request.parameters) for request in requests for _ in range(request.rows)],)

    def _exchange(self, slot: Slot, kind: str, inputs: dict[str, np.ndarray], params: Any) -> Any:
        """Send one message with its inputs and wait for the reply (the execution timeout
        applies); a dead or killed process raises InstanceDiedError."""
        specs = write_arrays(slot.inputs, inputs)
        try:
            slot.channel.send((kind, specs, params), slot.inputs.take_fd_to_send())
            return self._receive(slot)
        except ChannelClosed:
            raise self._died(None) from None

    def _receive(self, slot: Slot) -> Any:
        try:
            received = slot.channel.recv(self.timeout_s)
        except TimeoutError:
            raise self._died(self.config.execution_timeout_ms) from None
        return self._reply(slot, received)

    def _reply(self, slot: Slot, received: tuple[Any, list[int]]) -> Any:
        """A reply's message, its outputs' arena adopted; a model error raised."""
        message, fds = received
        adopt_arena(slot, fds)
        if message[0] == "error":
            _, type_name, text = message
            raise ModelExecutionError(
                f'model "{self.context.model_name}" raised in infer: {type_name}: {text}' if text
                else f'model "{self.context.model_name}" raised in infer: {type_name}',
                model=self.context.model_name,
            )
        return message

    def _output_fault(self, error: NereidError) -> None:
        """Outputs that do not match the config, in the server log (as for a thread
        instance; what model code raised is logged by the process)."""
        if isinstance(error, ModelExecutionError):
            self.faults.record_message(self.context.model_name, self.context.model_version, "outputs", error.message)

    def _died(self, timeout_ms: int | None) -> InstanceDiedError | ExecutionTimeoutError:
        """The error of the batch the process was running when it ended (killed here at
        the execution timeout): a timeout is not retried request by request (each would
        wait again); a death is."""
        cause = self.worker.died(timeout_ms)
        model = self.context.model_name
        if timeout_ms is not None:
            return ExecutionTimeoutError(
                f'model "{model}" instance {self.name}: the batch ran past execution_timeout_ms ({timeout_ms} ms); '
                "its process was killed and restarts",
                model=model,
            )
        return InstanceDiedError(
            f'model "{model}" instance {self.name}: its process {cause} while running this batch '
            "(the instance restarts)",
            model=model,
        )

    def _remote_batch_size(self, inputs: dict[str, np.ndarray]) -> int:
        """``Model.batch_size(inputs)`` in the process, on its own channel (one round
        trip per request, on the event loop: keep it cheap)."""
        if not self.worker.ready:
            raise RuntimeError(f"instance {self.name} is restarting")
        channel = self.worker.control
        arena = self._cost_arena()
        specs = write_arrays(arena, inputs)
        try:
            channel.send(("batch_size", specs, ()), arena.take_fd_to_send())
            message, _ = channel.recv(self.timeout_s)
        except ChannelClosed:
            raise self._died(None) from None
        except TimeoutError:
            raise self._died(self.config.execution_timeout_ms) from None
        if message[0] == "error":
            raise model_exception(message[1], message[2])
        return message[1]  # type: ignore[no-any-return]

    def _cost_arena(self) -> Arena:
        """The inputs arena of the control channel (a new one for each new process)."""
        arena = self._cost_inputs
        if arena is None or self._cost_generation != self.worker.generation:
            arena = self._cost_inputs = Arena()
            self._cost_generation = self.worker.generation
        return arena

    # -- streams -----------------------------------------------------------------------

    async def run_stream(
        self, requests: Sequence[InferRequest], sink: StepSink, abandoned: Callable[[], bool], /
    ) -> BatchOutcome:
        """A decoupled model's batch: each step the process sends is split and handed to
        ``sink`` on the loop; the generator is closed once ``abandoned()``."""
        loop = asyncio.get_running_loop()

        def on_loop(parts: Any, finished: list[bool]) -> None:
            self.worker.drain_calls()  # the metric updates sent before this step
            sink(parts, finished)

        def deliver(parts: Any, finished: list[bool]) -> None:
            loop.call_soon_threadsafe(on_loop, parts, finished)

        stream = self._triton_stream if self.model_class is not None and self.model_class.triton else self._stream
        outcome: BatchOutcome = await self._threads.call(stream, requests, deliver, abandoned)
        return outcome

    def _triton_stream(self, requests: Sequence[InferRequest], deliver: StepSink, abandoned: Callable[[], bool]) -> BatchOutcome:
        """A decoupled TritonPythonModel's batch in the process: its senders' responses
        arrive as ("step", index, answer, final) until every request had its final flag
        (read to the end even when nobody listens any more: the slot's next batch must
        not find them)."""
        t0 = time.monotonic_ns()
        count = len(requests)
        open_requests = set(range(count))

        def exchange(slot: Slot) -> None:
            started = False
            slot.channel.send(("triton-stream", list(requests)))
            while open_requests or not started:
                message = self._receive(slot)
                if message[0] == "started":
                    started = True
                    continue
                _, index, answer, final = message
                if index not in open_requests:
                    continue
                if answer is not None:
                    answer = self._triton_answer(requests[index], answer)
                    final = final or isinstance(answer, NereidError)
                parts: list[Any] = [None] * count
                finished = [False] * count
                parts[index], finished[index] = answer, final
                deliver(parts, finished)
                if final:
                    open_requests.discard(index)

        return self._stream_on_slot(t0, exchange)

    def _stream(self, requests: Sequence[InferRequest], deliver: StepSink, abandoned: Callable[[], bool]) -> BatchOutcome:
        t0 = time.monotonic_ns()
        try:
            inputs = assemble(requests, self.config)
        except NereidError as exc:
            return BatchOutcome(None, exc, 0, 0, 0)

        def exchange(slot: Slot) -> NereidError | None:
            message = self._exchange(slot, "stream", inputs, self._parameters(requests))
            while message[0] != "end":
                try:
                    parts = split_step(reply_outputs(slot, message), requests, self.config, self.context.model_name)
                except NereidError as exc:  # the step does not match the config: the stream ends
                    self._output_fault(exc)
                    slot.channel.send(("stop",))  # the process closes the generator and says "end"
                    self._receive(slot)  # (or what closing it raised, which then fails the stream)
                    return exc
                deliver(*parts)
                slot.channel.send(("stop",) if abandoned() else ("more",))
                message = self._receive(slot)
            return None

        return self._stream_on_slot(t0, exchange)

    def _stream_on_slot(self, t0: int, exchange: Callable[[Slot], NereidError | None]) -> BatchOutcome:
        """Run a stream's ``exchange`` with the process on a free slot (released after):
        the outcome of a stream begun at ``t0``, failed with the error ``exchange`` returns
        or raises, or with the process's death."""
        slot = self.worker.take_slot()
        error: NereidError | None
        try:
            error = exchange(slot)
        except ChannelClosed:
            error = self._died(None)
        except NereidError as exc:
            error = exc
        finally:
            self.worker.release(slot)
        return BatchOutcome([] if error is None else None, error, 0, time.monotonic_ns() - t0, 0)
