"""The process of one or more process instances (``isolation = "process"``): ``python -m
nereid.instances.worker FD...``, started by ``supervisor.WorkerProcess`` for ``process.ProcessInstance``.

It imports ``model.py`` once, builds each instance's ``Model`` with its ``ModelContext``
(on its device; on CUDA each instance gets a CUDA stream of its own, current in each of
its threads, so instances sharing the process, and so one CUDA context, overlap their
work), says "ready" on each instance's control channel with what it learnt of the class,
then serves each channel on a thread of its own: ``infer`` (inputs from the server's arena, outputs into its own),
``stream`` (a decoupled model's steps, one acknowledged message each), ``batch_size``
and ``close``. Model code's custom metrics and BLS requests go to the server on the
calls channel (``calls.py``), its queued metric updates sent before each reply. Model faults are logged here, with their traceback (the server only
reports them to the client). It ends when the server closes its channels, when told to
close (every instance in it), and when the server process dies (the kernel's
parent-death signal).
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from nereid.config.extension_parameters import INPUT_TENSORS
from nereid.tensors.device import DeviceInputs, DeviceOutputs, DispatchTurns, OutputsInFlight
from nereid.errors import ModelLoadError
from nereid.log import configure_logging
from nereid.faults import FaultLog
from nereid.repository.model_file import ModelClass, describe_exception, load_model_class
from nereid.instances.calls import MetricsProxy, ProcessBls, ServerCalls
from nereid.instances.coroutines import discard, run_on, sync_steps
from nereid.instances.channel import Arena, Channel, ChannelClosed, read_arrays, write_arrays
from nereid.instances.sendable import PICKLE_ERRORS, portable, sendable, worker_outputs
from nereid.triton_python.adapter import TritonModel

__all__ = ["run_worker"]

_log = logging.getLogger("nereid")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when the server dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the closed channels end it instead
        pass
    if os.getppid() == 1:  # the server died before the request took effect
        os._exit(1)


class _Worker:
    """One instance in this process: its Model, its channels (control first), and on a
    CUDA device its own CUDA stream, current in each of its threads."""

    def __init__(
        self, channels: list[Channel], init: dict[str, Any], calls: ServerCalls | None = None,
        model_class: ModelClass | None = None, turns: DispatchTurns | None = None,
    ) -> None:
        self.channels = channels
        #: the way to the server for model code's custom metrics and BLS requests
        self.calls = calls
        self.context = init["context"]
        if calls is not None:
            self.context = dataclasses.replace(self.context, metrics=MetricsProxy(calls))
        #: this process's own fault log (its model's failures, logged here with their tracebacks)
        self.faults = FaultLog()
        self.model_class: ModelClass = model_class or load_model_class(
            init["model_file"], self.context.model_name, self.context.model_version, self.faults
        )
        #: its CUDA stream (None: not on a CUDA device): instances sharing this process
        #: then overlap their kernels on the one CUDA context
        self.stream = _cuda_stream(self.context.device)
        #: held while ``infer`` runs: the process's instances on one CUDA device take turns
        #: queueing their kernels, and overlap while they run (``DispatchTurns``)
        self.dispatch_turn = (turns or DispatchTurns()).turn(self.context.device)
        #: on a CUDA device, a batch's outputs are copied to the host behind its kernels and
        #: waited for after its turn: the next batch queues its work meanwhile
        self.device_outputs = DeviceOutputs(self.context.device) if self.stream is not None else None
        self.loop: asyncio.AbstractEventLoop | None = None
        if self.model_class.infer_is_async:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self._run_loop, name="worker-loop", daemon=True).start()
        #: ``input_tensors = "torch"`` (the config's JSON form carries it as a parameter)
        self.device_inputs: DeviceInputs | None = None
        parameters = self.context.config.get("parameters", {})
        if parameters.get(INPUT_TENSORS, {}).get("string_value") == "torch" and not self.model_class.triton:
            self.device_inputs = DeviceInputs(self.context.device)
        cls = self.model_class.cls
        self.model: Any = None
        self.send_lock = threading.Lock()  # a decoupled Triton model's senders write from their own threads
        #: batches that may run at once (the instance's max_concurrent_batches): a batch sent
        #: ahead waits here, its inputs in (and on the device), for the one before to end
        self.turns = threading.Semaphore(init.get("concurrency") or len(channels))
        try:
            self.use_stream()  # its __init__'s work (weights to the device) on its stream too
            if self.model_class.triton:
                self.model = TritonModel(cls, self.context, ProcessBls(calls) if calls is not None else None)
            else:
                self.model = cls(self.context) if self.model_class.init_takes_context else cls()
        except BaseException as exc:
            self.faults.record(self.context.model_name, self.context.model_version, "__init__", exc)
            raise ModelLoadError(  # worded as for a thread instance
                self.context.model_name,
                f"{init['model_file']}: Model.__init__ failed for instance {self.context.instance_name}: "
                f"{describe_exception(exc)}",
            ) from exc
        self.flush()

    def use_stream(self) -> None:
        """Make the instance's CUDA stream current in the calling thread (torch keeps the
        current stream per thread)."""
        if self.stream is not None:
            import torch

            torch.cuda.set_stream(self.stream)

    def _run_loop(self) -> None:
        assert self.loop is not None
        self.use_stream()
        self.loop.run_forever()

    def outputs(self, raw: Any) -> Any:
        """What the model returned, made transferable (``worker_outputs``), its CUDA work
        finished on the instance's stream before the outputs are read."""
        outputs = worker_outputs(raw)
        self.synchronize()
        return outputs

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def flush(self) -> None:
        """Send the metric updates model code queued (before a reply: a scrape after the
        response sees them)."""
        if self.calls is not None:
            self.calls.flush()

    def traits(self) -> dict[str, Any]:
        mc = self.model_class
        return {
            "infer_takes_parameters": mc.infer_takes_parameters,
            "has_batch_size": mc.has_batch_size,
            "has_close": mc.has_close,
            "infer_is_generator": mc.infer_is_generator,
            "triton": mc.triton,
        }

    def serve(self, channel: Channel) -> None:
        """Answer one channel's messages until it closes."""
        self.use_stream()
        inputs_arena: Arena | None = None
        outputs_arena = Arena()
        while True:
            try:
                message, fds = channel.recv()
            except ChannelClosed:
                return
            kind = message[0]
            if fds:
                if inputs_arena is None:
                    inputs_arena = Arena(fd=fds[0])
                else:
                    inputs_arena.adopt(fds)
            if kind == "close":
                self._close(channel)
                return
            if kind == "triton":
                with self.turns:
                    self._triton(channel, message[1])
                continue
            if kind == "triton-stream":
                with self.turns:
                    self._triton_stream(channel, message[1])
                continue
            assert inputs_arena is not None
            inputs = read_arrays(inputs_arena, message[1], copy=False)
            if kind != "batch_size" and self.device_inputs is not None:
                try:
                    inputs = self.device_inputs(inputs)
                except BaseException as exc:  # torch's (out of memory): fails the batch
                    channel.send(self._fault("infer", exc))
                    continue
            if kind == "batch_size":
                self._reply(channel, "batch_size", lambda: self.model.batch_size(inputs))
            elif kind == "infer":
                self._infer(channel, outputs_arena, inputs, message[2])
            elif kind == "stream":
                with self.turns:
                    self._stream(channel, outputs_arena, inputs, message[2])

    def _call(self, fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if inspect.isawaitable(result):
            assert self.loop is not None
            return run_on(self.loop, result)
        return result

    def _fault(self, stage: str, exc: BaseException) -> tuple[str, str, str]:
        self.faults.record(self.context.model_name, self.context.model_version, stage, exc)
        return ("error", type(exc).__name__, str(exc))

    def _reply(self, channel: Channel, stage: str, fn: Any) -> None:
        try:
            result = fn()
        except BaseException as exc:  # model code: every exception is the model's fault
            self.flush()
            channel.send(self._fault(stage, exc))
        else:
            self.flush()
            channel.send(("ok", result))

    def _infer(self, channel: Channel, arena: Arena, inputs: dict[str, np.ndarray], params: Any) -> None:
        """One batch: its turn is held while the model's work is queued, then given to
        the next batch before these outputs are written and sent. On a GPU the device's
        dispatch turn is held only while ``infer`` queues the work and the copy of its
        CUDA outputs to the host (``DeviceOutputs``); the batch's turn ends there too,
        and the outputs are waited for after it, so the next batch (sent ahead, its
        inputs already on the device) queues its kernels while these still run and the
        device never waits for the host between batches. Outputs that are not CUDA
        tensors are waited for (the stream synchronised) inside the turn, as on the CPU."""
        outputs: Any = None
        in_flight: OutputsInFlight | None = None
        error: tuple[str, str, str] | None = None
        with self.turns:
            began = time.monotonic_ns()
            try:
                with self.dispatch_turn:
                    raw = self._call(self.model.infer, inputs, *params)
                    if self.device_outputs is not None:
                        in_flight = self.device_outputs.start(raw)
                if in_flight is None:
                    outputs = self.outputs(raw)
            except BaseException as exc:
                error = self._fault("infer", exc)
            ended = time.monotonic_ns()  # the instance is free for its next batch
        if in_flight is not None:
            try:
                outputs = worker_outputs(in_flight.wait())
            except BaseException as exc:  # what the device reported for this batch's kernels
                error = self._fault("infer", exc)
        self.flush()
        if error is not None:
            channel.send(error)
            return
        self._send_outputs(channel, arena, "ok", outputs, (began, ended))

    def _send_outputs(
        self, channel: Channel, arena: Arena, kind: str, outputs: Any, times: tuple[int, int] | None = None,
    ) -> None:
        """Numpy outputs through the arena; anything else (and object arrays of other
        than bytes and str) pickled: the server checks them as for a thread instance and
        words the error. ``times``: when the batch took its turn and gave it up, by
        ``time.monotonic_ns`` (the machine's one monotonic clock, which the server reads
        too), sent after the outputs: the instance's own busy time, and whether the next
        batch waited for it or it for the next batch."""
        tail = () if times is None else (times,)
        if isinstance(outputs, dict) and all(isinstance(v, np.ndarray) for v in outputs.values()):
            try:
                specs = write_arrays(arena, outputs)
            except (TypeError, ValueError):  # e.g. an object array of ints: pickled below
                pass
            else:
                channel.send((kind, specs, *tail), arena.take_fd_to_send())
                return
        try:
            channel.send((kind + "-raw", outputs, *tail))
            return
        except PICKLE_ERRORS:
            pass
        try:
            channel.send((kind + "-raw", sendable(outputs), *tail))
        except PICKLE_ERRORS as exc:  # e.g. a key that cannot be pickled
            channel.send(("error", "TypeError", f"infer returned a value that cannot be sent to the server: {exc}"))

    def _stream(self, channel: Channel, arena: Arena, inputs: dict[str, np.ndarray], params: Any) -> None:
        try:
            steps = self.model.infer(inputs, *params)
            if self.loop is not None:  # as a thread instance words it
                if not hasattr(steps, "__anext__"):
                    discard(steps)
                    raise TypeError(
                        f"a decoupled async model's infer must be an async generator, got {type(steps).__name__}"
                    )
                steps = sync_steps(steps, self.loop)
            elif not hasattr(steps, "__next__"):
                raise TypeError(f"a decoupled model's infer must be a generator, got {type(steps).__name__}")
            try:
                for step in steps:
                    self.flush()
                    self._send_outputs(channel, arena, "step", self.outputs(step))
                    ack, _ = channel.recv()
                    if ack[0] != "more":
                        break
            finally:
                steps.close()
        except ChannelClosed:
            raise
        except BaseException as exc:
            self.flush()
            channel.send(self._fault("infer", exc))
            return
        self.flush()
        channel.send(("end",))

    def _triton(self, channel: Channel, requests: list[Any]) -> None:
        """A TritonPythonModel's batch: the requests come and their answers go pickled,
        one per request (outputs, or an error's class name and message)."""
        try:
            answers = self.model.execute(requests)
        except BaseException as exc:
            self.flush()
            channel.send(self._fault("infer", exc))
            return
        self.flush()
        try:
            rebuilt = [portable(answer) for answer in answers]
            self.synchronize()
            channel.send(("ok-triton", rebuilt))
        except PICKLE_ERRORS as exc:
            channel.send(("error", "TypeError", f"execute returned a value that cannot be sent to the server: {exc}"))

    def _triton_stream(self, channel: Channel, requests: list[Any]) -> None:
        """A decoupled TritonPythonModel's batch: each response a sender sends goes to the
        server as ("step", index, answer, final), from the sending thread; then
        ("started",) once execute has returned (or its error)."""

        def deliver(index: int, answer: Any, final: bool) -> None:
            self.flush()
            with self.send_lock:
                channel.send(("step", index, None if answer is None else portable(answer), final))

        try:
            self.model.execute_decoupled(requests, deliver, lambda index: False)
        except BaseException as exc:
            self.flush()
            with self.send_lock:
                channel.send(self._fault("infer", exc))
            return
        with self.send_lock:
            channel.send(("started",))

    def _close(self, channel: Channel) -> None:
        """The model's close(), then the repeats of its faults still counted (as the
        server flushes a thread instance's at unload), then the reply."""
        reply: tuple[Any, ...] = ("ok", None)
        if self.model_class.has_close:
            try:
                self._call(self.model.close)
            except BaseException as exc:  # model code
                reply = self._fault("close", exc)
        self.flush()
        self.faults.flush(self.context.model_name, self.context.model_version)
        channel.send(reply)


def _cuda_stream(device: str) -> Any:
    """A new CUDA stream on ``device`` (made its current device), or None off CUDA."""
    if not device.startswith("cuda"):
        return None
    import torch

    torch.cuda.set_device(device)
    return torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]


def run_worker(argv: list[str] | None = None) -> int:
    """The process: its instances' channels are the file descriptors in ``argv`` (per
    instance: control, a channel per batch slot, calls); the first says what to build."""
    fds = [int(arg) for arg in (argv if argv is not None else sys.argv[1:])]
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    channels = [Channel(socket.socket(fileno=fd)) for fd in fds]
    init, _ = channels[0].recv()
    settings = init["log"]
    configure_logging(settings.log_verbose_level, settings.log_format, info=settings.log_info,
                      warning=settings.log_warning, error=settings.log_error)
    members: list[list[Channel]] = []
    for member in init["members"]:
        members.append(channels[: member["channels"]])
        channels = channels[member["channels"] :]
    workers: list[_Worker] = []
    turns = DispatchTurns()  # the instances of this process on one GPU take turns queueing work
    try:
        for member, own in zip(init["members"], members):
            calls = ServerCalls(own[-1])
            first = workers[0].model_class if workers else None  # model.py is imported once per process
            workers.append(_Worker(own[:-1], dict(member, model_file=init["model_file"]), calls, first, turns))
    except BaseException as exc:  # import or __init__: the server makes the model UNAVAILABLE
        # the reason, as a thread instance's load words it (load_model_class's own, the
        # __init__ one above, else the model loader's "<file>: <exception>")
        reason = exc.message if isinstance(exc, ModelLoadError) else f"{init['model_file']}: {describe_exception(exc)}"
        for own in members:
            own[0].send(("load-error", reason))
        return 1
    for worker in workers:
        worker.channels[0].send(("ready", worker.traits()))
    controls = []
    for worker in workers:
        for index, channel in enumerate(worker.channels):
            thread = threading.Thread(target=worker.serve, args=(channel,), daemon=True)
            thread.start()
            if index == 0:
                controls.append(thread)
    for thread in controls:  # every instance closed (or the server gone)
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(run_worker())
