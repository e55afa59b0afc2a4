"""InstanceLink: one process instance's way into its worker process (``supervisor.py``),
a process of its own or one it shares with the model's other instances on its device.

It holds what is the instance's alone: its control channel, its batch slots (a channel
and its arenas each) handed out first come first served, and what serves its calls
channel (custom metrics, BLS). Whatever concerns the process (starting it, watching it,
restarting it, its end) it asks of its ``WorkerProcess``. Knows nothing about batches or
their outputs (``process.py``).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from nereid.context import ModelContext
from nereid.instances.channel import Arena, Channel

if TYPE_CHECKING:
    from nereid.instances.supervisor import WorkerProcess

__all__ = ["InstanceLink", "MemberChannels", "ServedCalls", "Slot"]


class ServedCalls(Protocol):
    """What serves a process's calls channel on the loop (``call_server.CallServer``)."""

    @property
    def holds_metrics(self) -> bool: ...
    def drain(self) -> None: ...
    def stop(self) -> None: ...


class Slot:
    """What one batch uses to talk to the process: a channel and its arenas."""

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


class MemberChannels:
    """One instance's channels into one started process: control first, then one per
    slot, and the calls channel its model code asks the server on."""

    def __init__(self, channels: list[Channel], calls: Channel) -> None:
        self.channels = channels
        self.calls = calls
        #: what serves ``calls`` (None: not served, or stopped)
        self.served_calls: ServedCalls | None = None
        #: the slots made from these channels (all but the first, which is for control)
        self.slots: list[Slot] = []

    def stop_calls(self) -> None:
        """On the loop: stop reading the calls channel, then close it."""
        served, self.served_calls = self.served_calls, None
        if served is not None:
            served.stop()
        self.calls.close()


class InstanceLink:
    """One instance in a worker process (see the module docstring)."""

    def __init__(
        self, host: WorkerProcess, context: ModelContext,
        serve_calls: Callable[[Channel, asyncio.AbstractEventLoop], ServedCalls] | None,
    ) -> None:
        """``serve_calls(channel, loop)``, on the loop, starts answering the instance's
        calls channel of a new process (from before its Model is built: its ``__init__``
        may call): ``call_server.CallServer``."""
        self.host = host
        self.context = context
        self.name = context.instance_name
        self.serve_calls = serve_calls
        #: its channels into the current process (None before the first start)
        self.member: MemberChannels | None = None
        self.closed = False
        self._slots: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._ready = threading.Event()
        self.ready_on_loop: asyncio.Event | None = None  # _ready, for batches driven from the loop
        #: batches on the loop waiting for a slot, first come first served
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    # -- what the process decides ------------------------------------------------------

    @property
    def problem(self) -> str | None:
        """Why the instance cannot serve right now (None: it can)."""
        problem = self.host.problem
        if problem is None or problem == "starting":
            return problem
        return f"instance {self.name} {problem}"

    @property
    def restarts(self) -> int:
        return self.host.restarts

    @property
    def generation(self) -> int:
        """Bumped when the process starts or dies: a slot of another generation is stale."""
        return self.host.generation

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.host.loop

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def pid(self) -> int | None:
        """The OS process id of the worker process it runs in (None: none running)."""
        return self.host.pid

    @property
    def control(self) -> Channel:
        """Its control channel into the current process (``batch_size``, ``close``)."""
        assert self.member is not None
        return self.member.channels[0]

    async def start(self) -> dict[str, Any]:
        """Start the process (the first of its instances to ask does) and wait until every
        Model in it is built: what the process learnt of this one's class. Raises
        ModelLoadError with the cause."""
        return await self.host.start_link(self)

    def succeeded(self) -> None:
        self.host.succeeded()

    def died(self, timeout_ms: int | None) -> str:
        return self.host.died(timeout_ms)

    def kill(self) -> None:
        self.host.kill()

    async def close(self) -> None:
        await self.host.close_link(self)

    # -- called by the WorkerProcess ---------------------------------------------------

    def adopt(self, member: MemberChannels, generation: int) -> None:
        """A new process is ready: its slots replace those of the one before (under the
        host's lock)."""
        self.member = member
        self.clear_slots()
        for channel in member.channels[1:]:
            slot = Slot(channel, generation)
            member.slots.append(slot)
            self._slots.put(slot)

    def clear_slots(self) -> None:
        while not self._slots.empty():
            self._slots.get()

    def set_ready(self, ready: bool) -> None:
        """From any thread: batches may go to the process (or must wait for it)."""
        if ready:
            self._ready.set()
        else:
            self._ready.clear()
        event = self.ready_on_loop
        if event is not None:
            self.host.on_loop(event.set if ready else event.clear)

    # -- slots -------------------------------------------------------------------------

    def drain_calls(self) -> None:
        """On the loop: handle what the process sent on the calls channel before the reply
        just read (its metric updates; nothing to do when it holds none)."""
        member = self.member
        served = member.served_calls if member is not None else None
        if served is not None and served.holds_metrics:
            served.drain()

    async def take_slot_on_loop(self) -> Slot:
        """A free slot, awaited on the loop: a batch handed over while the slots are busy
        gets one the moment one is released (a release wakes the first waiter)."""
        assert self.ready_on_loop is not None and self.loop is not None
        while True:
            await self.ready_on_loop.wait()
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
        if self.host.on_loop_thread():
            self._wake_slot_waiter()
        else:
            self.host.on_loop(self._wake_slot_waiter)
        return True

    def _wake_slot_waiter(self) -> None:
        while self._slot_waiters:
            freed = self._slot_waiters.popleft()
            if not freed.done():
                freed.set_result(None)
                return
