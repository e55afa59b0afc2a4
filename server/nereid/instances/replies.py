"""A process instance's replies, read on the server's side: awaited on the event loop with
no thread in between (``await_reply``; a reply nobody waits for any more read and dropped
before its slot is reused: ``release_after_reply``), and what they carry: outputs in the
slot's shared-memory arena (``reply_outputs``; a new arena adopted when the process
replaced it: ``adopt_arena``), or what ``infer`` returned, pickled, with stand-ins for
the values the process could not pickle (``restore_unsendable``), so that ``split``
checks and words them as for a thread instance.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Protocol

from nereid.instances.channel import Arena, ChannelClosed, Unsendable, read_arrays
from nereid.instances.link import Slot

__all__ = ["SlotOwner", "adopt_arena", "await_reply", "release_after_reply", "reply_outputs", "restore_unsendable"]


class SlotOwner(Protocol):
    """What reading a slot's reply needs of the instance's link (``link.InstanceLink``)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def generation(self) -> int: ...
    def drain_calls(self) -> None: ...
    def release(self, slot: Slot) -> bool: ...


async def await_reply(slot: Slot, owner: SlotOwner, timeout_s: float | None) -> tuple[Any, list[int]]:
    """The slot's next message, awaited on the running loop (woken by the socket, no
    thread hop). The moment it is read, whatever becomes of the awaiting task, the slot is
    free (``busy`` cleared) and its outputs arena is the one the reply's arrays lie in;
    the calls the process sent before it (metric updates) are handled first. Raises
    ChannelClosed when the process is gone, TimeoutError past ``timeout_s``."""
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
                owner.drain_calls()
                slot.busy = False
                adopt_arena(slot, fds)
                waiting.set_result((message, []))

    loop.add_reader(fd, readable)
    try:
        if timeout_s is None:
            return await waiting
        received: tuple[Any, list[int]] = await asyncio.wait_for(waiting, timeout_s)
        return received
    finally:
        loop.remove_reader(fd)
        slot.waiting = None


def release_after_reply(slot: Slot, owner: SlotOwner) -> None:
    """Put ``slot`` back once the reply to the batch it was sent arrives (read and
    dropped, its arena adopted): the next batch on it must not take that reply for its
    own. A slot whose process dies meanwhile (or has died: another generation) is
    dropped with it."""
    loop = owner.loop
    assert loop is not None
    fd = slot.channel.sock.fileno()

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
        adopt_arena(slot, fds)
        owner.release(slot)

    if slot.generation == owner.generation:
        loop.add_reader(fd, readable)


def adopt_arena(slot: Slot, fds: list[int]) -> None:
    """The process replaced its outputs arena (the descriptor came with a reply)."""
    if fds:
        if slot.outputs is None:
            slot.outputs = Arena(fd=fds[0])
        else:
            slot.outputs.adopt(fds)


def reply_outputs(slot: Slot, message: Any) -> Any:
    """The raw outputs an ``infer`` / ``stream`` reply carries (arrays copied out of the arena)."""
    if message[0].endswith("-raw"):  # what infer returned, pickled: split checks it
        return restore_unsendable(message[1])
    assert slot.outputs is not None
    return read_arrays(slot.outputs, message[1], copy=True)


def restore_unsendable(outputs: Any) -> Any:
    """Raw outputs with each Unsendable (a value the process could not pickle) replaced
    by an object of a class named like the value's type: split's errors then name it as
    for a thread instance."""
    if isinstance(outputs, Unsendable):
        return _stand_in(outputs.type_name)
    if isinstance(outputs, dict) and any(isinstance(value, Unsendable) for value in outputs.values()):
        return {k: _stand_in(v.type_name) if isinstance(v, Unsendable) else v for k, v in outputs.items()}
    return outputs


def _stand_in(type_name: str) -> object:
    return _stand_in_class(type_name)()


@functools.cache  # one class per type name met (a few at most)
def _stand_in_class(type_name: str) -> type:
    return type(type_name, (), {"__module__": "nereid.instances.worker", "__slots__": ()})
