"""nereid.instances.replies: a process instance's reply read on the server's side, its
arena adopted, values the process could not pickle stood for by objects named like them."""

from __future__ import annotations

import os
import socket

import numpy as np

from nereid.instances.channel import Arena, Channel, Unsendable, write_arrays
from nereid.instances.replies import adopt_arena, reply_outputs, restore_unsendable
from nereid.instances.link import Slot


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
