"""The arena's ring: blocks handed out in order, taken back in any order, never overlapping."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, strategies as st

from nereid.frontends.arena import Arena, Ring


def test_blocks_follow_each_other_and_are_aligned() -> None:
    ring = Ring(1024)
    assert ring.allocate(10) == 0
    assert ring.allocate(100) == 64
    assert ring.allocate(1) == 192


def test_no_room_is_none_until_the_oldest_block_is_freed() -> None:
    ring = Ring(256)
    first = ring.allocate(128)
    second = ring.allocate(128)
    assert ring.allocate(64) is None
    ring.free(second)  # freed out of order: the oldest still holds the start
    assert ring.allocate(64) is None
    ring.free(first)
    assert ring.blocks == 0
    assert ring.allocate(256) == 0


def test_the_ring_wraps_to_the_start_once_the_start_is_free() -> None:
    ring = Ring(256)
    first = ring.allocate(128)
    second = ring.allocate(64)
    ring.free(first)
    assert ring.allocate(128) == 0  # no room after the newest block: wraps
    assert ring.allocate(64) is None  # wrapped: only the gap before the oldest block counts
    ring.free(second)
    assert ring.allocate(128) == 128


def test_a_block_larger_than_the_ring_is_never_given() -> None:
    assert Ring(128).allocate(129) is None


def test_freeing_an_unknown_offset_names_it() -> None:
    ring = Ring(128)
    ring.allocate(8)
    with pytest.raises(ValueError, match="no block allocated at offset 64"):
        ring.free(64)


@given(st.lists(st.tuples(st.integers(1, 300), st.booleans()), max_size=200), st.randoms())
def test_live_blocks_never_overlap_and_stay_inside(steps: list[tuple[int, bool]], rng: random.Random) -> None:
    ring = Ring(1024)
    live: dict[int, int] = {}
    for size, free_one in steps:
        if free_one and live:
            offset = rng.choice(sorted(live))
            ring.free(offset)
            del live[offset]
        offset_ = ring.allocate(size)
        if offset_ is not None:
            assert offset_ % 64 == 0 and offset_ + size <= 1024
            for start, length in live.items():
                assert offset_ + size <= start or start + length <= offset_
            live[offset_] = size
        if not live:
            assert ring.blocks == 0


def test_an_arena_is_shared_through_its_file_descriptor() -> None:
    arena = Arena.create(4096)
    other = Arena.attach(os.dup(arena.fd), arena.size)  # as the worker gets its own descriptor
    arena.requests[0:5] = b"hello"
    other.answers[0:3] = b"bye"
    assert bytes(other.requests[0:5]) == b"hello"
    assert bytes(arena.answers[0:3]) == b"bye"
    assert len(arena.requests) == len(arena.answers) == 2048
    other.close()
    arena.close()
