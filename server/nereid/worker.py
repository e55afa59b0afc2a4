"""The process of one process instance (``isolation = "process"``): ``python -m
nereid.worker FD...``, started by ``process_instance.ProcessInstance``.

It imports ``model.py``, builds the ``Model`` with its ``ModelContext`` (on its device),
says "ready" with what it learnt of the class, then serves each of its channels on a
thread of its own: ``infer`` (inputs from the server's arena, outputs into its own),
``stream`` (a decoupled model's steps, one acknowledged message each), ``batch_size``
and ``close``. Model faults are logged here, with their traceback (the server only
reports them to the client). It ends when the server closes its channels, when told to
close, and when the server process dies (the kernel's parent-death signal).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from typing import Any

import numpy as np

from nereid.batch_arrays import tensor_to_numpy
from nereid.log import configure_logging
from nereid.model_faults import MODEL_FAULTS
from nereid.model_file import ModelClass, load_model_class
from nereid.process_channel import Arena, Channel, ChannelClosed, read_arrays, write_arrays

__all__ = ["main", "worker_outputs"]

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


def worker_outputs(raw: Any) -> Any:
    """What the model returned, made transferable: torch tensors (any device) become
    numpy, STRING sequences object arrays; anything unexpected is left as is (the server
    checks outputs against the config and words the error)."""
    if not isinstance(raw, dict):
        return raw
    if all(type(value) is np.ndarray for value in raw.values()):
        return raw  # the common case: nothing to convert
    converted: dict[Any, Any] = {}
    for name, value in raw.items():
        if type(value).__module__.startswith("torch"):
            value = tensor_to_numpy(value)
        elif isinstance(value, (list, tuple)):
            try:
                value = np.array(value, dtype=object) if _is_text(value) else np.asarray(value)
            except (ValueError, TypeError):
                pass
        converted[name] = value
    return converted


def _is_text(value: Any) -> bool:
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return isinstance(value, (str, bytes))


class _Worker:
    def __init__(self, channels: list[Channel], init: dict[str, Any]) -> None:
        self.channels = channels
        self.context = init["context"]
        self.model_class: ModelClass = load_model_class(
            init["model_file"], self.context.model_name, self.context.model_version
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        if self.model_class.infer_is_async:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="worker-loop", daemon=True).start()
        if self.context.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(self.context.device)
        cls = self.model_class.cls
        try:
            self.model = cls(self.context) if self.model_class.init_takes_context else cls()
        except BaseException as exc:
            MODEL_FAULTS.record(self.context.model_name, self.context.model_version, "__init__", exc)
            raise

    def traits(self) -> dict[str, Any]:
        mc = self.model_class
        return {
            "infer_takes_parameters": mc.infer_takes_parameters,
            "has_batch_size": mc.has_batch_size,
            "has_close": mc.has_close,
            "infer_is_generator": mc.infer_is_generator,
        }

    def serve(self, channel: Channel) -> None:
        """Answer one channel's messages until it closes."""
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
            assert inputs_arena is not None
            inputs = read_arrays(inputs_arena, message[1], copy=False)
            if kind == "batch_size":
                self._reply(channel, "batch_size", lambda: self.model.batch_size(inputs))
            elif kind == "infer":
                self._infer(channel, outputs_arena, inputs, message[2])
            elif kind == "stream":
                self._stream(channel, outputs_arena, inputs, message[2])

    def _call(self, fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if inspect.isawaitable(result):
            assert self.loop is not None
            return asyncio.run_coroutine_threadsafe(_await(result), self.loop).result()
        return result

    def _fault(self, stage: str, exc: BaseException) -> tuple[str, str, str]:
        MODEL_FAULTS.record(self.context.model_name, self.context.model_version, stage, exc)
        return ("error", type(exc).__name__, str(exc))

    def _reply(self, channel: Channel, stage: str, fn: Any) -> None:
        try:
            channel.send(("ok", fn()))
        except BaseException as exc:  # model code: every exception is the model's fault
            channel.send(self._fault(stage, exc))

    def _infer(self, channel: Channel, arena: Arena, inputs: dict[str, np.ndarray], params: Any) -> None:
        try:
            raw = self._call(self.model.infer, inputs, *params)
        except BaseException as exc:
            channel.send(self._fault("infer", exc))
            return
        self._send_outputs(channel, arena, "ok", worker_outputs(raw))

    def _send_outputs(self, channel: Channel, arena: Arena, kind: str, outputs: Any) -> None:
        """Numpy outputs through the arena; anything else pickled (the server words the
        error about it)."""
        if isinstance(outputs, dict) and all(isinstance(v, np.ndarray) for v in outputs.values()):
            try:
                specs = write_arrays(arena, outputs)
            except (TypeError, ValueError) as exc:  # e.g. an object array of non-bytes
                channel.send(("error", "TypeError", f"an output cannot be sent to the server: {exc}"))
                return
            channel.send((kind, specs), arena.take_fd_to_send())
            return
        try:
            channel.send((kind + "-raw", outputs))
        except _PICKLE_ERRORS as exc:
            channel.send(("error", "TypeError", f"infer returned a value that cannot be sent to the server: {exc}"))

    def _stream(self, channel: Channel, arena: Arena, inputs: dict[str, np.ndarray], params: Any) -> None:
        try:
            steps = self.model.infer(inputs, *params)
            if self.loop is not None and hasattr(steps, "__anext__"):
                steps = _sync_steps(steps, self.loop)
            if not hasattr(steps, "__next__"):
                raise TypeError(f"a decoupled model's infer must be a generator, got {type(steps).__name__}")
            try:
                for step in steps:
                    self._send_outputs(channel, arena, "step", worker_outputs(step))
                    ack, _ = channel.recv()
                    if ack[0] != "more":
                        break
            finally:
                steps.close()
        except ChannelClosed:
            raise
        except BaseException as exc:
            channel.send(self._fault("infer", exc))
            return
        channel.send(("end",))

    def _close(self, channel: Channel) -> None:
        if self.model_class.has_close:
            self._reply(channel, "close", lambda: self._call(self.model.close))
        else:
            channel.send(("ok", None))


_PICKLE_ERRORS = (pickle.PicklingError, TypeError, AttributeError, ValueError)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _sync_steps(steps: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """An async generator iterated from this thread through the worker's loop."""

    class _Steps:
        def __iter__(self) -> Any:
            return self

        def __next__(self) -> Any:
            try:
                return asyncio.run_coroutine_threadsafe(steps.__anext__(), loop).result()
            except StopAsyncIteration:
                raise StopIteration from None

        def close(self) -> None:
            asyncio.run_coroutine_threadsafe(steps.aclose(), loop).result()

    return _Steps()


def main(argv: list[str] | None = None) -> int:
    fds = [int(arg) for arg in (argv if argv is not None else sys.argv[1:])]
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server decides
    channels = [Channel(socket.socket(fileno=fd)) for fd in fds]
    init, _ = channels[0].recv()
    settings = init["log"]
    configure_logging(settings.log_verbose_level, settings.log_format, info=settings.log_info,
                      warning=settings.log_warning, error=settings.log_error)
    try:
        worker = _Worker(channels, init)
    except BaseException as exc:  # import or __init__: the server makes the model UNAVAILABLE
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        channels[0].send(("load-error", type(exc).__name__, str(exc), detail))
        return 1
    channels[0].send(("ready", worker.traits()))
    threads = [threading.Thread(target=worker.serve, args=(ch,), daemon=True) for ch in channels[1:]]
    for thread in threads:
        thread.start()
    worker.serve(channels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
