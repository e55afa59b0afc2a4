"""The process behind one process instance (``isolation = "process"``), and its supervisor.

``WorkerProcess`` starts ``python -m nereid.instances.worker`` (spawned, never forked: the server
has threads, and may have CUDA) with one control channel and one channel per batch slot
(and the calls channel its model code asks the server on, served by ``call_server.py``),
waits for the Model to be built, and hands out its slots. A supervisor thread waits for
the process to end: unless the instance is closing, it marks the instance as restarting
(``problem``), drops the dead process's slots (their waiting batches fail with
ChannelClosed) and starts a new process with a backoff (0.1 s doubling to 10 s, back to
0.1 s once a batch succeeds), counting ``restarts``. Nothing outlives the server: the
worker asks the kernel to kill it when the server dies (PR_SET_PDEATHSIG), and ends when
its channels close.

Knows nothing about batches or their outputs (``process.py``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from nereid.context import ModelContext
from nereid.errors import ModelLoadError
from nereid.log import log_settings
from nereid.instances.channel import Arena, Channel, ChannelClosed, socket_pair

__all__ = ["ServedCalls", "Slot", "WorkerProcess", "describe_exit"]

_log = logging.getLogger("nereid")

_START_TIMEOUT_S = 600.0  # importing torch and loading weights can take minutes
_CLOSE_TIMEOUT_S = 5.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.1, 10.0


def describe_exit(returncode: int) -> str:
    """``killed by SIGSEGV`` / ``exited with code 7``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ServedCalls(Protocol):
    """What serves a process's calls channel on the loop (``call_server.CallServer``)."""

    @property
    def holds_metrics(self) -> bool: ...
    def drain(self) -> None: ...
    def stop(self) -> None: ...


class _Process:
    """One started worker process and its channels (one per slot)."""

    def __init__(self, model_file: Path, context: ModelContext, slots: int, concurrency: int) -> None:
        pairs = [socket_pair() for _ in range(slots + 1)]  # the last one: the calls channel
        child_fds = [pair[1].fileno() for pair in pairs]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "nereid.instances.worker", *map(str, child_fds)],
            pass_fds=child_fds, env=env, stdin=subprocess.DEVNULL,
        )
        for pair in pairs:
            pair[1].close()
        self.channels = [Channel(pair[0]) for pair in pairs]
        #: the channel the process asks the server on (custom metrics, BLS: ``calls.py``);
        #: closed on the loop, which reads it (``WorkerProcess._stop_calls``)
        self.calls = self.channels.pop()
        #: what serves ``calls`` (None: not served, or stopped)
        self.served_calls: ServedCalls | None = None
        #: the slots made from these channels (all but the first, which is for control).
        self.slots: list[Slot] = []
        self.channels[0].send({"model_file": model_file, "context": context, "log": log_settings(),
                               "concurrency": concurrency, "calls": True})

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def close_channels(self) -> None:
        for channel in self.channels:
            channel.close()


class Slot:
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


class WorkerProcess:
    """The current process of one instance, its slots, and its supervisor."""

    def __init__(
        self, model_file: Path, context: ModelContext, slots: int, concurrency: int | None = None,
        serve_calls: Callable[[Channel, asyncio.AbstractEventLoop], ServedCalls] | None = None,
    ) -> None:
        """``slots`` channels (the first for control); at most ``concurrency`` batches run
        at once in the process (None: one per batch slot), the others wait there for
        their turn, their inputs already in. ``serve_calls(channel, loop)``, on the loop,
        starts answering a new process's calls channel (from before its Model is built:
        its ``__init__`` may call): ``call_server.CallServer``."""
        self.serve_calls = serve_calls
        self.model_file = model_file
        self.context = context
        self.name = context.instance_name
        self.slot_count = slots
        self.concurrency = concurrency if concurrency is not None else slots - 1
        self.restarts = 0
        #: why the instance cannot serve right now (None: it can).
        self.problem: str | None = "starting"
        #: bumped when a process starts or dies: a slot of another generation is stale.
        self.generation = 0
        self.process: _Process | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._slots: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._ready_on_loop: asyncio.Event | None = None  # _ready, for batches driven from the loop
        self._loop_thread = 0  # the loop's thread (release() is called from instance threads too)
        #: batches on the loop waiting for a slot, first come first served
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lock = threading.Lock()
        self._closing = False
        self._backoff_s = _BACKOFF_FIRST_S

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def start(self) -> dict[str, Any]:
        """Start the process; once its Model is built, what it learnt of the class (and
        the supervisor watches it). Raises ModelLoadError with the cause."""
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._ready_on_loop = asyncio.Event()
        traits = await asyncio.to_thread(self._spawn)
        threading.Thread(target=self._supervise, name=f"{self.name}-supervisor", daemon=True).start()
        return traits

    def succeeded(self) -> None:
        """A batch ran: the next restart waits the shortest backoff again."""
        self._backoff_s = _BACKOFF_FIRST_S

    def _spawn(self) -> dict[str, Any]:
        """Start a process and wait for its "ready" (runs on a thread)."""
        process = _Process(self.model_file, self.context, self.slot_count, self.concurrency)  # + one channel for batch_size
        self._on_loop(lambda: self._start_calls(process))
        try:
            message, _ = process.channels[0].recv(_START_TIMEOUT_S)
        except (ChannelClosed, TimeoutError) as exc:
            process.kill()
            returncode = process.popen.wait()
            process.close_channels()
            self._on_loop(lambda: self._stop_calls(process))
            cause = describe_exit(returncode) if not isinstance(exc, TimeoutError) else "timed out starting"
            raise ModelLoadError(
                self.context.model_name, f"{self.model_file}: instance {self.name}'s process {cause} while loading"
            ) from None
        if message[0] != "ready":  # ("load-error", reason): worded as for a thread instance
            process.popen.wait()
            process.close_channels()
            self._on_loop(lambda: self._stop_calls(process))
            raise ModelLoadError(self.context.model_name, message[1], str(self.model_file))
        with self._lock:
            self.generation += 1
            self.process = process
            while not self._slots.empty():
                self._slots.get()
            for channel in process.channels[1:]:
                slot = Slot(channel, self.generation)
                process.slots.append(slot)
                self._slots.put(slot)
            self.problem = None
        self._ready.set()
        self._on_loop(self._ready_on_loop.set if self._ready_on_loop is not None else None)
        return message[1]  # type: ignore[no-any-return]

    def _start_calls(self, process: _Process) -> None:
        if self.serve_calls is not None and self.loop is not None:
            process.served_calls = self.serve_calls(process.calls, self.loop)

    def _stop_calls(self, process: _Process) -> None:
        """On the loop: stop reading a process's calls channel, then close it."""
        served, process.served_calls = process.served_calls, None
        if served is not None:
            served.stop()
        process.calls.close()

    def drain_calls(self) -> None:
        """On the loop: handle what the current process sent on its calls channel before
        the reply just read (its metric updates; nothing to do when it holds none)."""
        process = self.process
        served = process.served_calls if process is not None else None
        if served is not None and served.holds_metrics:
            served.drain()

    def _on_loop(self, fn: Callable[[], object] | None) -> None:
        loop = self.loop
        if fn is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def _supervise(self) -> None:
        """Wait for the process to end; restart it (with a backoff) unless closing."""
        while True:
            process = self.process
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

    def kill(self) -> None:
        """Kill the process now, for good (shutdown gave up on a batch stuck in it)."""
        with self._lock:
            self._closing = True
            process = self.process
        if process is not None:
            process.kill()

    async def close(self) -> None:
        """Ask the process to close the model and exit (killed after a grace period)."""
        with self._lock:
            self._closing = True
            process = self.process
        if process is not None:
            await asyncio.to_thread(self._close_process, process)
            self._stop_calls(process)

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

    async def take_slot_on_loop(self) -> Slot:
        """A free slot, awaited on the loop: a batch handed over while the slots are busy
        gets one the moment one is released (a release wakes the first waiter)."""
        assert self._ready_on_loop is not None and self.loop is not None
        while True:
            await self._ready_on_loop.wait()
            try:
                slot = self._slots.get_nowait()
            except queue.Empty:
                freed: asyncio.Future[None] = self.loop.create_future()
                self._slot_waiters.append(freed)
                try:
                    # released, or (between a restart's slots and its ready) look again shortly
                    await asyncio.wait((freed,), timeout=0.05)
                finally:
                    if freed in self._slot_waiters:
                        self._slot_waiters.remove(freed)
                continue
            if slot.generation == self.generation:
                return slot

    def take_slot(self) -> Slot:
        while True:
            self._ready.wait()
            slot = self._slots.get()
            if slot.generation == self.generation:
                return slot

    def release(self, slot: Slot) -> bool:
        """Put ``slot`` back (from the loop or an instance thread) and wake a batch waiting
        for one on the loop: True if one was waiting."""
        if slot.generation != self.generation:
            return False
        self._slots.put(slot)
        if not self._slot_waiters:
            return False
        if self._loop_thread == threading.get_ident():
            self._wake_slot_waiter()
        else:
            self._on_loop(self._wake_slot_waiter)
        return True

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            freed = self._slot_waiters.popleft()
            if not freed.done():
                freed.set_result(None)
                return

    def _mark_dead(self, process: _Process) -> None:
        """No batch goes to ``process`` any more: its slots are dropped, new batches wait
        for the restart."""
        with self._lock:
            if self.process is process and self._ready.is_set():
                self._ready.clear()
                self._on_loop(self._ready_on_loop.clear if self._ready_on_loop is not None else None)
                self.generation += 1
                while not self._slots.empty():
                    self._slots.get()

    def _drop(self, process: _Process) -> None:
        """On the loop: stop watching a dead process's channels, then close them."""
        assert self.loop is not None
        for channel in process.channels:
            self.loop.remove_reader(channel.sock.fileno())
        for slot in process.slots:
            if slot.waiting is not None and not slot.waiting.done():
                slot.waiting.set_exception(ChannelClosed("the instance's process ended"))
        process.close_channels()
        self._stop_calls(process)

    def died(self, timeout_ms: int | None) -> str:
        """The process's end, as the cause of the batch it was running: killed here at
        its execution timeout, or waited for (it is exiting: its channel closed)."""
        process = self.process
        assert process is not None
        if timeout_ms is not None:
            process.kill()
            process.popen.wait()
            cause = f"ran past execution_timeout_ms ({timeout_ms} ms) and was killed"
        else:
            cause = describe_exit(process.popen.wait())
        self._mark_dead(process)
        return cause
