"""nereid.instances.channel: messages over a socket pair (whole, long ones too, with file
descriptors) and arrays through a shared-memory arena the peer maps."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from nereid.instances.channel import Arena, Channel, ChannelClosed, read_arrays, socket_pair, write_arrays


@pytest.fixture
def channels() -> Iterator[tuple[Channel, Channel]]:
    left, right = socket_pair()
    ends = Channel(left), Channel(right)
    yield ends
    for end in ends:
        end.close()


def peer_of(arena: Arena) -> Arena:
    """The other process's mapping of ``arena`` (its descriptor, as a message brings it)."""
    return Arena(fd=os.dup(arena.fd))


def test_arrays_written_by_one_side_are_read_by_the_other() -> None:
    arena = Arena()
    arrays = {
        "numbers": np.arange(12, dtype=np.float32).reshape(3, 4),
        "texts": np.array([[b"ab", "c\u00e9"], [b"", b"xyz"]], dtype=object),
        "empty": np.zeros((0, 4), dtype=np.int64),
    }
    specs = write_arrays(arena, arrays)
    read = read_arrays(peer_of(arena), specs, copy=True)
    np.testing.assert_array_equal(read["numbers"], arrays["numbers"])
    assert read["numbers"].dtype == np.float32
    assert read["texts"].tolist() == [[b"ab", "c\u00e9".encode()], [b"", b"xyz"]]
    assert read["empty"].shape == (0, 4)


def test_a_view_sees_the_next_write_and_a_copy_does_not() -> None:
    arena = Arena()
    specs = write_arrays(arena, {"x": np.array([1, 2], dtype=np.int32)})
    view = read_arrays(arena, specs, copy=False)["x"]
    copy = read_arrays(arena, specs, copy=True)["x"]
    write_arrays(arena, {"x": np.array([7, 8], dtype=np.int32)})
    assert view.tolist() == [7, 8] and copy.tolist() == [1, 2]


def test_an_arena_that_grows_has_a_new_descriptor_to_send_once() -> None:
    arena = Arena(size=64)
    assert arena.take_fd_to_send() == (arena.fd,) and arena.take_fd_to_send() == ()
    write_arrays(arena, {"big": np.zeros(1000, dtype=np.float64)})
    assert arena.size >= 8000
    fds = arena.take_fd_to_send()
    assert fds == (arena.fd,) and arena.take_fd_to_send() == ()


def test_the_reader_adopts_the_grown_arena() -> None:
    arena = Arena(size=64)
    reader = peer_of(arena)
    specs = write_arrays(arena, {"big": np.arange(1000, dtype=np.float64)})
    reader.adopt([os.dup(fd) for fd in arena.take_fd_to_send()])
    assert read_arrays(reader, specs, copy=True)["big"][-1] == 999.0


def test_an_object_element_that_is_not_bytes_or_str_is_refused() -> None:
    with pytest.raises(TypeError, match="not bytes or str: int"):
        write_arrays(Arena(), {"x": np.array([b"a", 3], dtype=object)})


def test_a_message_arrives_whole_with_its_descriptors(channels: tuple[Channel, Channel]) -> None:
    left, right = channels
    arena = Arena()
    left.send(("infer", {"rows": 2}), arena.take_fd_to_send())
    message, fds = right.recv(timeout=10)
    assert message == ("infer", {"rows": 2}) and len(fds) == 1
    os.close(fds[0])


def test_a_message_longer_than_a_datagram_arrives_whole(channels: tuple[Channel, Channel]) -> None:
    left, right = channels
    text = "x" * 300_000
    sender = threading.Thread(target=left.send, args=(("error", "ValueError", text),))  # the socket buffers less
    sender.start()
    assert right.recv(timeout=30)[0] == ("error", "ValueError", text)
    sender.join()


def test_a_receive_that_waits_too_long_times_out(channels: tuple[Channel, Channel]) -> None:
    with pytest.raises(TimeoutError):
        channels[1].recv(timeout=0.01)


def test_the_other_end_closing_is_channel_closed() -> None:
    left, right = socket_pair()
    Channel(left).close()
    channel = Channel(right)
    with pytest.raises(ChannelClosed):
        channel.recv(timeout=10)
    with pytest.raises(ChannelClosed):
        channel.send(("more",))
    channel.close()
