"""The process behind process instances (``isolation = "process"``), and its supervisor.

``WorkerProcess`` starts ``python -m nereid.instances.worker`` (spawned, never forked: the
server has threads, and may have CUDA) for one or several instances of one model version
(``processes = "per_device"``: all of them on one device, so one CUDA context), each
joined as an ``InstanceLink`` (``link.py``) with its own control channel, one channel per
batch slot, and the calls channel its model code asks the server on (served by
``call_server.py``). It waits for every Model to be built and hands each link its slots.
A supervisor thread waits for the process to end: unless it is closing, it marks its
instances as restarting (``problem``), drops the dead process's slots (their waiting
batches, every instance's, fail with ChannelClosed) and starts a new process with a
backoff (0.1 s doubling to 10 s, back to 0.1 s once a batch succeeds), counting
``restarts``. Nothing outlives the server: the worker asks the kernel to kill it when the
server dies (PR_SET_PDEATHSIG), and ends when its channels close.

Knows nothing about batches or their outputs (``process.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from nereid.context import ModelContext
from nereid.errors import ModelLoadError
from nereid.log import log_settings
from nereid.instances.channel import Channel, ChannelClosed, socket_pair
from nereid.instances.link import InstanceLink, MemberChannels, ServedCalls, Slot

__all__ = ["ServedCalls", "Slot", "WorkerProcess", "describe_exit"]  # Slot, ServedCalls: link.py's

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



class _Process:
    """One started worker process and each of its instances' channels."""

    def __init__(self, model_file: Path, contexts: Sequence[ModelContext], slots: int, concurrency: int) -> None:
        # per instance: control, a channel per slot, then the calls channel
        per_member = slots + 1
        pairs = [socket_pair() for _ in range(len(contexts) * per_member)]
        child_fds = [pair[1].fileno() for pair in pairs]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "nereid.instances.worker", *map(str, child_fds)],
            pass_fds=child_fds, env=env, stdin=subprocess.DEVNULL,
        )
        for pair in pairs:
            pair[1].close()
        channels = [Channel(pair[0]) for pair in pairs]
        self.members = [
            MemberChannels(channels[start : start + slots], channels[start + slots])
            for start in range(0, len(channels), per_member)
        ]
        members = [{"context": context, "concurrency": concurrency, "channels": per_member} for context in contexts]
        self.members[0].channels[0].send({"model_file": model_file, "log": log_settings(), "members": members})

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def close_channels(self) -> None:
        for member in self.members:
            for channel in member.channels:
                channel.close()


class WorkerProcess:
    """The current process of one or more instances, and its supervisor."""

    def __init__(self, model_file: Path, model_name: str, slots: int, concurrency: int | None = None) -> None:
        """``slots`` channels per instance (the first for control); at most
        ``concurrency`` batches of an instance run at once in the process (None: one per
        batch slot), the others wait there for their turn, their inputs already in.
        Instances join with ``link()`` before the first starts it."""
        self.model_file = model_file
        self.model_name = model_name
        self.slot_count = slots
        self.concurrency = concurrency if concurrency is not None else slots - 1
        self.links: list[InstanceLink] = []
        self.restarts = 0
        #: why its instances cannot serve right now (None: they can): "starting", or
        #: "restarting: ..." (each link words it with its own name).
        self.problem: str | None = "starting"
        #: bumped when a process starts or dies: a slot of another generation is stale.
        self.generation = 0
        self.process: _Process | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future[list[dict[str, Any]]] | None = None
        self._loop_thread = 0  # the loop's thread (release() is called from instance threads too)
        self._lock = threading.Lock()
        self._closing = False
        self._backoff_s = _BACKOFF_FIRST_S

    @property
    def names(self) -> str:
        return ", ".join(link.name for link in self.links)

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.popen.pid if process is not None else None

    def link(
        self, context: ModelContext,
        serve_calls: Callable[[Channel, asyncio.AbstractEventLoop], ServedCalls] | None = None,
    ) -> InstanceLink:
        """Join an instance (before the process starts)."""
        assert self._started is None, "instances join a worker process before it starts"
        link = InstanceLink(self, context, serve_calls)
        self.links.append(link)
        return link

    async def start_link(self, link: InstanceLink) -> dict[str, Any]:
        """Start the process once, for all its links; what it learnt of ``link``'s class."""
        if self._started is None:
            self.loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            for member in self.links:
                member.ready_on_loop = asyncio.Event()
            self._started = asyncio.ensure_future(self._start())
        traits = await asyncio.shield(self._started)
        return traits[self.links.index(link)]

    async def _start(self) -> list[dict[str, Any]]:
        traits = await asyncio.to_thread(self._spawn)
        threading.Thread(target=self._supervise, name=f"{self.links[0].name}-supervisor", daemon=True).start()
        return traits

    def succeeded(self) -> None:
        """A batch ran: the next restart waits the shortest backoff again."""
        self._backoff_s = _BACKOFF_FIRST_S

    def on_loop(self, fn: Callable[[], object] | None) -> None:
        loop = self.loop
        if fn is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def on_loop_thread(self) -> bool:
        return self._loop_thread == threading.get_ident()

    def _spawn(self) -> list[dict[str, Any]]:
        """Start a process and wait for every instance's "ready" (runs on a thread)."""
        contexts = [link.context for link in self.links]
        process = _Process(self.model_file, contexts, self.slot_count, self.concurrency)
        for link, member in zip(self.links, process.members):
            self.on_loop(functools.partial(self._start_calls, link, member))
        traits: list[dict[str, Any]] = []
        for link, member in zip(self.links, process.members):
            try:
                message, _ = member.channels[0].recv(_START_TIMEOUT_S)
            except (ChannelClosed, TimeoutError) as exc:
                process.kill()
                cause = describe_exit(process.popen.wait()) if not isinstance(exc, TimeoutError) else "timed out starting"
                self._discard(process)
                raise ModelLoadError(
                    self.model_name, f"{self.model_file}: instance {link.name}'s process {cause} while loading"
                ) from None
            if message[0] != "ready":  # ("load-error", reason): worded as for a thread instance
                process.kill()
                process.popen.wait()
                self._discard(process)
                raise ModelLoadError(self.model_name, message[1], str(self.model_file))
            traits.append(message[1])
        with self._lock:
            self.generation += 1
            self.process = process
            for link, member in zip(self.links, process.members):
                link.adopt(member, self.generation)
            self.problem = None
        for link in self.links:
            link.set_ready(True)
        return traits

    def _discard(self, process: _Process) -> None:
        """A process that failed to start: its channels closed (calls on the loop)."""
        process.close_channels()
        for member in process.members:
            self.on_loop(member.stop_calls)

    @staticmethod
    def _start_calls(link: InstanceLink, member: MemberChannels) -> None:
        if link.serve_calls is not None and link.loop is not None:
            member.served_calls = link.serve_calls(member.calls, link.loop)

    def _supervise(self) -> None:
        """Wait for the process to end; restart it (with a backoff) unless closing."""
        while True:
            process = self.process
            assert process is not None
            returncode = process.popen.wait()
            with self._lock:
                if self._closing:
                    return
                self.problem = f"restarting: its process {describe_exit(returncode)}"
            self._mark_dead(process)
            self.on_loop(lambda: self._drop(process))
            _log.error("model '%s' instance %s: process %s; restarting in %.1f s (restart %d)",
                       self.model_name, self.names, describe_exit(returncode), self._backoff_s, self.restarts + 1)
            while not self._closing:
                time.sleep(self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, _BACKOFF_MAX_S)
                self.restarts += 1
                try:
                    self._spawn()
                    break
                except ModelLoadError as exc:
                    self.problem = f"restarting: {exc.message}"
                    _log.error("model '%s' instance %s: restart failed: %s", self.model_name, self.names,
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

    async def close_link(self, link: InstanceLink) -> None:
        """Ask the process to close ``link``'s model; once every instance in it is closed,
        wait for it to exit (killed after a grace period). Closing one instance ends the
        restarts (a model's instances close together, at unload)."""
        with self._lock:
            self._closing = True
            process = self.process
            link.closed = True
            last = all(member.closed for member in self.links)
        if process is None or link.member is None:
            return
        member = link.member
        await asyncio.to_thread(self._close_member, member)
        member.stop_calls()
        if last:
            await asyncio.to_thread(self._end, process)

    def _close_member(self, member: MemberChannels) -> None:
        channel = member.channels[0]
        try:
            channel.send(("close",))
            channel.recv(_CLOSE_TIMEOUT_S)  # "ok", or "error": close() raised (the process logged it)
        except (ChannelClosed, TimeoutError):
            pass

    def _end(self, process: _Process) -> None:
        try:
            process.popen.wait(_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _log.warning("model '%s' instance %s: process still running %.0f s after close; killed",
                         self.model_name, self.names, _CLOSE_TIMEOUT_S)
            process.kill()
            process.popen.wait()
        process.close_channels()

    def _mark_dead(self, process: _Process) -> None:
        """No batch goes to ``process`` any more: its slots are dropped, new batches wait
        for the restart."""
        with self._lock:
            if self.process is process and self.links[0].ready:
                self.generation += 1
                for link in self.links:
                    link.set_ready(False)
                    link.clear_slots()

    def _drop(self, process: _Process) -> None:
        """On the loop: stop watching a dead process's channels, then close them (every
        instance's batches waiting on it fail)."""
        assert self.loop is not None
        for member in process.members:
            for channel in member.channels:
                self.loop.remove_reader(channel.sock.fileno())
            for slot in member.slots:
                if slot.waiting is not None and not slot.waiting.done():
                    slot.waiting.set_exception(ChannelClosed("the instance's process ended"))
        process.close_channels()
        for member in process.members:
            member.stop_calls()

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
