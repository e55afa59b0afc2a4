"""nereid.instances.replies: a process instance's reply awaited on the loop (or read and
dropped before its slot is reused) and read on the server's side, its arena adopted,
values the process could not pickle stood for by objects named like them."""

from __future__ import annotations

import asyncio
import os
import socket

import numpy as np
import pytest

from nereid.instances.channel import Arena, Channel, ChannelClosed, Unsendable, socket_pair, write_arrays
from nereid.instances.replies import (
    adopt_arena,
    await_reply,
    release_after_reply,
    reply_outputs,
    restore_unsendable,
)
from nereid.instances.link import Slot
from tests.unit.manual_clock import until


class RecordingOwner:
    """An instance link that records what the reply readers ask of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, generation: int = 0) -> None:
        self.loop = loop
        self.generation = generation
        self.drained = 0
        self.released: list[Slot] = []

    def drain_calls(self) -> None:
        self.drained += 1

    def release(self, slot: Slot) -> bool:
        self.released.append(slot)
        return False


def slot() -> Slot:
    return Slot(Channel(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)), generation=0)


def test_a_reply_brings_the_outputs_arena_once_and_its_arrays_are_copied_out() -> None:
    process_arena = Arena()
    specs = write_arrays(process_arena, {"OUT": np.array([[1.5, 2.5]], dtype=np.float32)})
    server_slot = slot()
    adopt_arena(server_slot, [os.dup(fd) for fd in process_arena.take_fd_to_send()])
    outputs = reply_outputs(server_slot, ("outputs", specs))
    write_arrays(process_arena, {"OUT": np.zeros((1, 2), dtype=np.float32)})  # the next batch
    assert outputs["OUT"].tolist() == [[1.5, 2.5]]
    server_slot.channel.close()


def test_a_raw_reply_is_what_infer_returned_with_stand_ins() -> None:
    server_slot = slot()
    restored = reply_outputs(server_slot, ("infer-raw", {"OUT": Unsendable("generator"), "OK": 3}))
    assert type(restored["OUT"]).__name__ == "generator" and restored["OK"] == 3
    server_slot.channel.close()


def test_an_unsendable_value_is_stood_for_by_an_object_of_its_type_name() -> None:
    first, second = restore_unsendable(Unsendable("function")), restore_unsendable(Unsendable("function"))
    assert type(first).__name__ == "function" and type(first) is type(second)


def test_outputs_with_nothing_unsendable_are_returned_as_they_are() -> None:
    outputs = {"OUT": np.zeros(2)}
    assert restore_unsendable(outputs) is outputs


def test_an_awaited_reply_frees_its_slot_and_drains_the_calls_sent_before_it() -> None:
    async def main() -> None:
        server_end, process_end = socket_pair()
        owner = RecordingOwner(asyncio.get_running_loop())
        busy = Slot(Channel(server_end), generation=0)
        busy.busy = True
        Channel(process_end).send(("outputs", []))
        message, fds = await await_reply(busy, owner, timeout_s=None)
        assert (message, fds, busy.busy, busy.waiting, owner.drained) == (("outputs", []), [], False, None, 1)
        server_end.close()
        process_end.close()

    asyncio.run(main())


def test_a_reply_that_does_not_come_in_time_is_a_timeout_and_the_slot_stays_busy() -> None:
    async def main() -> None:
        server_end, process_end = socket_pair()
        owner = RecordingOwner(asyncio.get_running_loop())
        busy = Slot(Channel(server_end), generation=0)
        busy.busy = True
        with pytest.raises(TimeoutError):
            await await_reply(busy, owner, timeout_s=0.001)  # nothing is ever sent
        assert busy.busy and busy.waiting is None and owner.drained == 0
        server_end.close()
        process_end.close()

    asyncio.run(main())


def test_a_process_gone_while_awaited_is_a_closed_channel() -> None:
    async def main() -> None:
        server_end, process_end = socket_pair()
        owner = RecordingOwner(asyncio.get_running_loop())
        process_end.close()
        with pytest.raises(ChannelClosed):
            await await_reply(Slot(Channel(server_end), generation=0), owner, timeout_s=None)
        server_end.close()

    asyncio.run(main())


def test_a_slot_left_busy_is_released_only_once_its_late_reply_is_read() -> None:
    async def main() -> None:
        server_end, process_end = socket_pair()
        owner = RecordingOwner(asyncio.get_running_loop())
        busy = Slot(Channel(server_end), generation=0)
        busy.busy = True
        release_after_reply(busy, owner)
        assert owner.released == []
        Channel(process_end).send(("outputs", []))
        await until(lambda: owner.released)
        assert owner.released == [busy] and not busy.busy
        # the reply was consumed: the next batch's reply is the next message on the channel
        Channel(process_end).send(("next", []))
        assert Channel(server_end).recv(timeout=5.0)[0] == ("next", [])
        server_end.close()
        process_end.close()

    asyncio.run(main())


def test_a_slot_of_a_process_that_has_died_is_dropped_not_released() -> None:
    async def main() -> None:
        server_end, process_end = socket_pair()
        owner = RecordingOwner(asyncio.get_running_loop(), generation=1)
        stale = Slot(Channel(server_end), generation=0)
        stale.busy = True
        release_after_reply(stale, owner)
        Channel(process_end).send(("outputs", []))
        assert Channel(server_end).recv(timeout=5.0)[0] == ("outputs", [])  # nobody read it for the slot
        assert owner.released == []
        server_end.close()
        process_end.close()

    asyncio.run(main())
