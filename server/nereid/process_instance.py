"""ProcessInstance: a model instance that is an OS process of its own (``isolation =
"process"``), and its supervisor.

The server side of ``worker.py``. It has the surface of ``instance.ModelInstance`` (the
batcher, warmup and loader cannot tell them apart): ``start``, ``run_batch``,
``run_stream``, ``cost_function``, ``close``. A batch is assembled here, on one of the
instance's threads, written into that thread's shared-memory arena, run in the process,
and its outputs are read back and split here, so the model's outputs are checked exactly
as for a thread instance.

The supervisor: a thread per instance waits for the process to end. A process that dies
(a signal, ``os._exit``, a crash in a C extension) or runs a batch past
``execution_timeout_ms`` (it is killed) fails the batch it was running with an error
naming the model, the instance and the cause; the batcher then reruns the batch-mates
one at a time, so only the request that crashes it fails. The process is restarted with a
backoff (0.1 s doubling to 10 s, back to 0.1 s after a batch succeeds); meanwhile
``problem`` says why the instance cannot serve and batches wait for the restart. Nothing
outlives the server: the process is killed when the server process dies
(PR_SET_PDEATHSIG) and when its channels close.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from nereid.batch_arrays import assemble, split, split_step
from nereid.config.schema import ModelConfig
from nereid.context import ModelContext
from nereid.errors import ExecutionTimeoutError, ModelExecutionError, ModelLoadError, NereidError
from nereid.inference import InferRequest
from nereid.instance import BatchOutcome, StepSink, _InstanceThreads
from nereid.log import log_settings
from nereid.model_faults import MODEL_FAULTS
from nereid.model_file import ModelClass
from nereid.process_channel import (
    Arena, Channel, ChannelClosed, Unsendable, read_arrays, socket_pair, write_arrays,
)

__all__ = ["InstanceDiedError", "ProcessInstance"]

_log = logging.getLogger("nereid")

_START_TIMEOUT_S = 600.0  # importing torch and loading weights can take minutes
_CLOSE_TIMEOUT_S = 5.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.1, 10.0


class InstanceDiedError(ModelExecutionError):
    """The process of an instance died (or was killed at its execution timeout) while
    running a batch."""


#: The Exception class standing for each exception type met in a process (a few at most).
_CARRIERS: dict[str, type[Exception]] = {}


def _model_exception(type_name: str, text: str) -> Exception:
    """An Exception standing for what model code raised in the process: its class is named
    like the original's, so that a message built of type name and text reads as for a
    thread instance (``Model.batch_size(inputs) raised SystemExit: 9``)."""
    carrier = _CARRIERS.get(type_name)
    if carrier is None:
        carrier = _CARRIERS[type_name] = type(type_name, (Exception,), {"__module__": "nereid.worker"})
    return carrier(text)


def _restore(outputs: Any) -> Any:
    """Raw outputs with each Unsendable (a value the process could not pickle) replaced
    by an object of a class named like the value's type: split's errors then name it as
    for a thread instance."""
    if isinstance(outputs, Unsendable):
        return _stand_in(outputs.type_name)
    if isinstance(outputs, dict) and any(isinstance(value, Unsendable) for value in outputs.values()):
        return {k: _stand_in(v.type_name) if isinstance(v, Unsendable) else v for k, v in outputs.items()}
    return outputs


_STAND_INS: dict[str, type] = {}


def _stand_in(type_name: str) -> object:
    cls = _STAND_INS.get(type_name)
    if cls is None:
        cls = _STAND_INS[type_name] = type(type_name, (), {"__module__": "nereid.worker", "__slots__": ()})
    return cls()


def describe_exit(returncode: int) -> str:
    """``killed by SIGSEGV`` / ``exited with code 7``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class _Process:
    """One started worker process and its channels (one per slot)."""

    def __init__(self, model_file: Path, context: ModelContext, slots: int) -> None:
        pairs = [socket_pair() for _ in range(slots)]
        child_fds = [pair[1].fileno() for pair in pairs]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "nereid.worker", *map(str, child_fds)],
            pass_fds=child_fds, env=env, stdin=subprocess.DEVNULL,
        )
        for pair in pairs:
            pair[1].close()
        self.channels = [Channel(pair[0]) for pair in pairs]
        #: the slots made from these channels (all but the first, which is for control).
        self.slots: list[_Slot] = []
        self.channels[0].send({"model_file": model_file, "context": context, "log": log_settings()})

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def close_channels(self) -> None:
        for channel in self.channels:
            channel.close()


class _Slot:
    """What one instance thread uses to talk to the process: a channel and its arenas."""

    __slots__ = ("channel", "inputs", "outputs", "generation", "waiting", "busy")

    def __init__(self, channel: Channel, generation: int) -> None:
        self.channel = channel
        self.inputs = Arena()
        self.outputs: Arena | None = None
        self.generation = generation
        #: the loop's future for the reply being waited for (run_batch), if any.
        self.waiting: asyncio.Future[tuple[Any, list[int]]] | None = None
        #: a batch was sent (run_batch) and its reply is not read yet.
        self.busy = False


class ProcessInstance:
    """One instance in a process of its own (see the module docstring)."""

    def __init__(self, model_file: Path, context: ModelContext, config: ModelConfig) -> None:
        self.model_file = model_file
        self.context = context
        self.config = config
        self.name = context.instance_name
        batching = config.dynamic_batching
        self.capacity = batching.max_concurrent_batches if batching is not None else 1
        self.timeout_s = config.execution_timeout_ms / 1000 if getattr(config, "execution_timeout_ms", 0) else None
        self.restarts = 0
        #: the batcher leaves the execution timeout to this instance (it kills its process).
        self.enforces_timeout = True
        #: why this instance cannot serve right now (None: it can).
        self.problem: str | None = "starting"
        self.model_class: ModelClass | None = None
        self._threads = _InstanceThreads(self.capacity, self.name)
        self._slots: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._process: _Process | None = None
        self._generation = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready_on_loop: asyncio.Event | None = None  # _ready, for run_batch on the loop
        self._lock = threading.Lock()
        self._closing = False
        self._backoff_s = _BACKOFF_FIRST_S
        self._cost: Callable[[dict[str, np.ndarray]], int] | None = None

    @property
    def cost_function(self) -> Callable[[dict[str, np.ndarray]], int] | None:
        return self._cost

    # -- life --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the process and wait until its Model is built. Raises ModelLoadError with
        the cause (an import error, an exception in __init__, a crash)."""
        self._loop = asyncio.get_running_loop()
        self._ready_on_loop = asyncio.Event()
        try:
            traits = await asyncio.to_thread(self._spawn)
        except ModelLoadError:
            await self._threads.stop(1.0)
            raise
        self.model_class = ModelClass(
            cls=object, module=types.ModuleType(f"nereid-worker-{self.name}"), path=self.model_file,
            infer_is_async=False, infer_is_generator=traits["infer_is_generator"],
            infer_takes_parameters=traits["infer_takes_parameters"], has_batch_size=traits["has_batch_size"],
            has_close=traits["has_close"],
        )
        if traits["has_batch_size"]:
            self._cost = self._remote_batch_size
        threading.Thread(target=self._supervise, name=f"{self.name}-supervisor", daemon=True).start()

    def _spawn(self) -> dict[str, Any]:
        """Start a process and wait for its "ready" (runs on a thread)."""
        process = _Process(self.model_file, self.context, self.capacity + 1)  # + one channel for batch_size
        try:
            message, _ = process.channels[0].recv(_START_TIMEOUT_S)
        except (ChannelClosed, TimeoutError) as exc:
            process.kill()
            returncode = process.popen.wait()
            process.close_channels()
            cause = describe_exit(returncode) if not isinstance(exc, TimeoutError) else "timed out starting"
            raise ModelLoadError(
                self.context.model_name, f"{self.model_file}: instance {self.name}'s process {cause} while loading"
            ) from None
        if message[0] != "ready":  # ("load-error", reason): worded as for a thread instance
            process.popen.wait()
            process.close_channels()
            raise ModelLoadError(self.context.model_name, message[1], str(self.model_file))
        with self._lock:
            self._generation += 1
            self._process = process
            while not self._slots.empty():
                self._slots.get()
            for channel in process.channels[1:]:
                slot = _Slot(channel, self._generation)
                process.slots.append(slot)
                self._slots.put(slot)
            self.problem = None
        self._ready.set()
        self._on_loop(self._ready_on_loop.set if self._ready_on_loop is not None else None)
        return message[1]  # type: ignore[no-any-return]

    def _on_loop(self, fn: Callable[[], object] | None) -> None:
        loop = self._loop
        if fn is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def _supervise(self) -> None:
        """Wait for the process to end; restart it (with a backoff) unless closing."""
        while True:
            process = self._process
            assert process is not None
            returncode = process.popen.wait()
            with self._lock:
                if self._closing:
                    return
                self.problem = f"instance {self.name} restarting: its process {describe_exit(returncode)}"
            self._mark_dead(process)
            self._on_loop(lambda: self._drop(process))
            _log.error("model '%s' instance %s: process %s; restarting in %.1f s (restart %d)",
                       self.context.model_name, self.name, describe_exit(returncode), self._backoff_s, self.restarts + 1)
            while not self._closing:
                time.sleep(self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, _BACKOFF_MAX_S)
                self.restarts += 1
                try:
                    self._spawn()
                    break
                except ModelLoadError as exc:
                    self.problem = f"instance {self.name} restarting: {exc.message}"
                    _log.error("model '%s' instance %s: restart failed: %s", self.context.model_name, self.name,
                               exc.message)
            if self._closing:
                return

    async def close(self) -> None:
        """Ask the process to close the model and exit (killed after a grace period)."""
        with self._lock:
            self._closing = True
            process = self._process
        if process is not None:
            await asyncio.to_thread(self._close_process, process)
        await self._threads.stop(1.0)

    def _close_process(self, process: _Process) -> None:
        channel = process.channels[0]
        try:
            channel.send(("close",))
            channel.recv(_CLOSE_TIMEOUT_S)  # "ok", or "error": close() raised (the process logged it)
        except (ChannelClosed, TimeoutError):
            pass
        try:
            process.popen.wait(_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _log.warning("model '%s' instance %s: process still running %.0f s after close; killed",
                         self.context.model_name, self.name, _CLOSE_TIMEOUT_S)
            process.kill()
            process.popen.wait()
        process.close_channels()

    # -- batches -----------------------------------------------------------------------

    async def run_batch(self, requests: Sequence[InferRequest], /) -> BatchOutcome:
        """Execute one batch in the process; model errors and deaths come back in the outcome.

        Driven from the event loop, with no thread in between: the batch is written into
        the slot's arena and sent, and the loop wakes when the reply arrives (a thread
        hop each way cost more than the process's own work on small batches)."""
        t0 = time.monotonic_ns()
        try:
            inputs = assemble(requests, self.config)
        except NereidError as exc:
            return BatchOutcome(None, exc, time.monotonic_ns() - t0, 0, 0)
        slot = await self._take_slot_on_loop()
        t1 = time.monotonic_ns()
        try:
            specs = write_arrays(slot.inputs, inputs)
            slot.channel.send(("infer", specs, self._parameters(requests)), slot.inputs.take_fd_to_send())
            slot.busy = True
            reply = self._reply(slot, await self._reply_on_loop(slot))
            raw = self._outputs(slot, reply)
        except ChannelClosed:
            return BatchOutcome(None, self._died(None), t1 - t0, time.monotonic_ns() - t1, 0)
        except NereidError as exc:
            return BatchOutcome(None, exc, t1 - t0, time.monotonic_ns() - t1, 0)
        finally:
            if slot.busy:  # cancelled while the process runs the batch: its reply is still to come
                self._release_after_reply(slot)
            else:
                self._release(slot)
        t2 = time.monotonic_ns()
        try:
            outputs = split(raw, requests, self.config, self.context.model_name)
        except NereidError as exc:
            self._output_fault(exc)
            return BatchOutcome(None, exc, t1 - t0, t2 - t1, time.monotonic_ns() - t2)
        self._backoff_s = _BACKOFF_FIRST_S
        return BatchOutcome(outputs, None, t1 - t0, t2 - t1, time.monotonic_ns() - t2)

    async def _take_slot_on_loop(self) -> _Slot:
        assert self._ready_on_loop is not None
        while True:
            await self._ready_on_loop.wait()
            try:
                slot = self._slots.get_nowait()
            except queue.Empty:  # between a restart's slots and its ready: look again shortly
                await asyncio.sleep(0.001)
                continue
            if slot.generation == self._generation:
                return slot

    async def _reply_on_loop(self, slot: _Slot) -> tuple[Any, list[int]]:
        """The slot's next message, awaited on the loop (the execution timeout applies)."""
        loop = asyncio.get_running_loop()
        fd = slot.channel.sock.fileno()
        waiting: asyncio.Future[tuple[Any, list[int]]] = loop.create_future()
        slot.waiting = waiting

        def readable() -> None:
            loop.remove_reader(fd)
            if not waiting.done():
                try:
                    message, fds = slot.channel.recv_ready()
                except BlockingIOError:  # spurious: wait on
                    loop.add_reader(fd, readable)
                except (ChannelClosed, OSError) as exc:
                    waiting.set_exception(ChannelClosed(str(exc)))
                else:
                    # read: whatever becomes of the awaiting task, the slot is free and
                    # its outputs arena is the one this reply's arrays lie in
                    slot.busy = False
                    self._adopt(slot, fds)
                    waiting.set_result((message, []))

        loop.add_reader(fd, readable)
        try:
            if self.timeout_s is None:
                return await waiting
            try:
                received: tuple[Any, list[int]] = await asyncio.wait_for(waiting, self.timeout_s)
                return received
            except TimeoutError:
                raise self._died(self.config.execution_timeout_ms) from None
        finally:
            loop.remove_reader(fd)
            slot.waiting = None

    def _release_after_reply(self, slot: _Slot) -> None:
        """Put ``slot`` back once the reply to the batch it was sent arrives (read and
        dropped, its arena adopted): the next batch on it must not take that reply for
        its own. A slot whose process dies meanwhile is dropped with it."""
        assert self._loop is not None
        loop, fd = self._loop, slot.channel.sock.fileno()

        def readable() -> None:
            loop.remove_reader(fd)
            try:
                _, fds = slot.channel.recv_ready()
            except BlockingIOError:  # spurious: wait on
                loop.add_reader(fd, readable)
                return
            except (ChannelClosed, OSError):  # the process is gone: so is the slot
                return
            slot.busy = False
            self._adopt(slot, fds)
            self._release(slot)

        if slot.generation == self._generation:
            loop.add_reader(fd, readable)

    def _take_slot(self) -> _Slot:
        while True:
            self._ready.wait()
            slot = self._slots.get()
            if slot.generation == self._generation:
                return slot

    def _parameters(self, requests: Sequence[InferRequest]) -> tuple[Any, ...]:
        assert self.model_class is not None
        if not self.model_class.infer_takes_parameters:
            return ()
        return ([dict(request.parameters) for request in requests for _ in range(request.rows)],)

    def _release(self, slot: _Slot) -> None:
        if slot.generation == self._generation:
            self._slots.put(slot)

    def _exchange(self, slot: _Slot, kind: str, inputs: dict[str, np.ndarray], params: Any) -> Any:
        """Send one message with its inputs and wait for the reply (the execution timeout
        applies); a dead or killed process raises InstanceDiedError."""
        specs = write_arrays(slot.inputs, inputs)
        try:
            slot.channel.send((kind, specs, params), slot.inputs.take_fd_to_send())
            return self._receive(slot)
        except ChannelClosed:
            raise self._died(None) from None

    def _receive(self, slot: _Slot) -> Any:
        try:
            received = slot.channel.recv(self.timeout_s)
        except TimeoutError:
            raise self._died(self.config.execution_timeout_ms) from None
        return self._reply(slot, received)

    def _reply(self, slot: _Slot, received: tuple[Any, list[int]]) -> Any:
        """A reply's message, its outputs' arena adopted; a model error raised."""
        message, fds = received
        self._adopt(slot, fds)
        if message[0] == "error":
            _, type_name, text = message
            raise ModelExecutionError(
                f'model "{self.context.model_name}" raised in infer: {type_name}: {text}' if text
                else f'model "{self.context.model_name}" raised in infer: {type_name}',
                model=self.context.model_name,
            )
        return message

    @staticmethod
    def _adopt(slot: _Slot, fds: list[int]) -> None:
        """The process replaced its outputs arena (the descriptor came with a reply)."""
        if fds:
            if slot.outputs is None:
                slot.outputs = Arena(fd=fds[0])
            else:
                slot.outputs.adopt(fds)

    def _outputs(self, slot: _Slot, message: Any) -> Any:
        if message[0].endswith("-raw"):  # what infer returned, pickled: split checks it
            return _restore(message[1])
        assert slot.outputs is not None
        return read_arrays(slot.outputs, message[1], copy=True)

    def _output_fault(self, error: NereidError) -> None:
        """Outputs that do not match the config, in the server log (as for a thread
        instance; what model code raised is logged by the process)."""
        if isinstance(error, ModelExecutionError):
            MODEL_FAULTS.record_message(self.context.model_name, self.context.model_version, "outputs", error.message)

    def _mark_dead(self, process: _Process) -> None:
        """No batch goes to ``process`` any more: its slots are dropped, new batches wait
        for the restart."""
        with self._lock:
            if self._process is process and self._ready.is_set():
                self._ready.clear()
                self._on_loop(self._ready_on_loop.clear if self._ready_on_loop is not None else None)
                self._generation += 1
                while not self._slots.empty():
                    self._slots.get()

    def _drop(self, process: _Process) -> None:
        """On the loop: stop watching a dead process's channels, then close them."""
        assert self._loop is not None
        for channel in process.channels:
            self._loop.remove_reader(channel.sock.fileno())
        for slot in process.slots:
            if slot.waiting is not None and not slot.waiting.done():
                slot.waiting.set_exception(ChannelClosed("the instance's process ended"))
        process.close_channels()

    def _died(self, timeout_ms: int | None) -> InstanceDiedError | ExecutionTimeoutError:
        """Kill the process (at its execution timeout) and wait for its end: the error of
        its batch (a timeout is not retried request by request: each would wait again)."""
        process = self._process
        assert process is not None
        model = self.context.model_name
        if timeout_ms is not None:
            process.kill()
            process.popen.wait()
            cause = f"ran past execution_timeout_ms ({timeout_ms} ms) and was killed"
        else:
            cause = describe_exit(process.popen.wait())
        self._mark_dead(process)
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
        if not self._ready.is_set():
            raise RuntimeError(f"instance {self.name} is restarting")
        process = self._process
        assert process is not None
        channel = process.channels[0]
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
            raise _model_exception(message[1], message[2])
        return message[1]  # type: ignore[no-any-return]

    def _cost_arena(self) -> Arena:
        arena = getattr(self, "_cost_inputs", None)
        if arena is None or getattr(self, "_cost_generation", -1) != self._generation:
            arena = self._cost_inputs = Arena()
            self._cost_generation = self._generation
        return arena

    # -- streams -----------------------------------------------------------------------

    async def run_stream(
        self, requests: Sequence[InferRequest], sink: StepSink, abandoned: Callable[[], bool], /
    ) -> BatchOutcome:
        """A decoupled model's batch: each step the process sends is split and handed to
        ``sink`` on the loop; the generator is closed once ``abandoned()``."""
        loop = asyncio.get_running_loop()

        def deliver(parts: Any, finished: list[bool]) -> None:
            loop.call_soon_threadsafe(sink, parts, finished)

        outcome: BatchOutcome = await self._threads.call(self._stream, requests, deliver, abandoned)
        return outcome

    def _stream(self, requests: Sequence[InferRequest], deliver: StepSink, abandoned: Callable[[], bool]) -> BatchOutcome:
        t0 = time.monotonic_ns()
        try:
            inputs = assemble(requests, self.config)
        except NereidError as exc:
            return BatchOutcome(None, exc, 0, 0, 0)
        slot = self._take_slot()
        try:
            message = self._exchange(slot, "stream", inputs, self._parameters(requests))
            while message[0] != "end":
                try:
                    parts = split_step(self._outputs(slot, message), requests, self.config, self.context.model_name)
                except NereidError as exc:  # the step does not match the config: the stream ends
                    self._output_fault(exc)
                    slot.channel.send(("stop",))  # the process closes the generator and says "end"
                    self._receive(slot)  # (or what closing it raised, which then fails the stream)
                    return BatchOutcome(None, exc, 0, time.monotonic_ns() - t0, 0)
                deliver(*parts)
                slot.channel.send(("stop",) if abandoned() else ("more",))
                message = self._receive(slot)
        except ChannelClosed:
            return BatchOutcome(None, self._died(None), 0, time.monotonic_ns() - t0, 0)
        except NereidError as exc:
            return BatchOutcome(None, exc, 0, time.monotonic_ns() - t0, 0)
        finally:
            self._release(slot)
        return BatchOutcome([], None, 0, time.monotonic_ns() - t0, 0)
