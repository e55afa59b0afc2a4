"""TurnResults (link_results.py): the outputs a link answered over a loop turn, sent
together: joined into one arena block per model version and kind of outputs, one RESULTS
message naming each request's rows (a bundle's one after the other); a RESULT per request
for what cannot be joined or finds no room."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest

from nereid.errors import NereidError
from nereid.frontends.arena import Arena, Ring
from nereid.frontends.layout import read_arrays
from nereid.frontends.link_results import TurnResults
from nereid.frontends.messages import Kind


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena.create(64 * 1024)
    yield arena
    arena.close()


def _results(arena: Arena, capacity: int | None = None) -> tuple[TurnResults, list[tuple[Any, ...]], list[int]]:
    sent: list[tuple[Any, ...]] = []
    failed: list[int] = []

    def send_error(id: int, error: NereidError) -> None:
        failed.append(id)

    ring = Ring(capacity if capacity is not None else len(arena.answers))
    return TurnResults(arena, ring, sent.append, send_error, 0), sent, failed


def _rows(arena: Arena, message: tuple[Any, ...]) -> dict[int, list[Any]]:
    """Each request's rows of output Y in a RESULTS or RESULT message."""
    if message[0] == Kind.RESULT.value:
        outputs = message[5] if message[5] is not None else read_arrays(arena.answers, message[3], message[4])
        return {message[1]: outputs["Y"].tolist()}
    joined = read_arrays(arena.answers, message[2], message[3])["Y"]
    got, start = {}, 0
    for id, rows in message[4]:
        got[id] = joined[start:start + rows].tolist()
        start += rows
    return got


def test_a_turns_requests_and_bundles_go_in_one_block_each_with_its_rows(arena: Arena) -> None:
    results, sent, _ = _results(arena)
    assert results.add(1, 1, {"Y": np.array([[1.0, 1.0]], np.float32)})  # the turn's first
    assert not results.add(((2, 1), (3, 2)), 1, {"Y": np.array([[2, 2], [3, 3], [3.5, 3.5]], np.float32)})
    results.send()
    assert [message[0] for message in sent] == [Kind.RESULTS.value]
    assert _rows(arena, sent[0]) == {1: [[1.0, 1.0]], 2: [[2.0, 2.0]], 3: [[3.0, 3.0], [3.5, 3.5]]}
    assert results.add(4, 1, {"Y": np.zeros((1, 2), np.float32)})  # a new turn


def test_versions_and_kinds_of_outputs_apart_go_in_blocks_apart(arena: Arena) -> None:
    results, sent, _ = _results(arena)
    results.add(1, 1, {"Y": np.ones((1, 2), np.float32)})
    results.add(2, 2, {"Y": np.ones((1, 2), np.float32)})
    results.add(3, 1, {"Y": np.ones((1, 3), np.float32)})
    results.send()
    assert sorted(tuple(id for id, _ in message[4]) for message in sent) == [(1,), (2,), (3,)]


def test_a_bundles_outputs_that_cannot_be_joined_go_a_request_at_a_time(arena: Arena) -> None:
    results, sent, _ = _results(arena)
    results.add(((5, 1), (6, 1)), 1, {"Y": np.array([b"five", b"six"], dtype=object)})
    results.send()
    assert [(message[0], message[1], message[5]["Y"].tolist()) for message in sent] == [
        (Kind.RESULT.value, 5, [b"five"]), (Kind.RESULT.value, 6, [b"six"])]


def test_without_room_in_the_arena_each_request_goes_inline(arena: Arena) -> None:
    results, sent, _ = _results(arena, capacity=0)
    results.add(((7, 1), (8, 1)), 1, {"Y": np.array([[7, 7], [8, 8]], np.float32)})
    results.send()
    assert [message[0] for message in sent] == [Kind.RESULT.value] * 2
    assert {**_rows(arena, sent[0]), **_rows(arena, sent[1])} == {7: [[7.0, 7.0]], 8: [[8.0, 8.0]]}


def test_a_link_whose_worker_went_away_sends_nothing(arena: Arena) -> None:
    results, sent, _ = _results(arena)
    results.add(1, 1, {"Y": np.ones((1, 2), np.float32)})
    results.clear()
    results.send()
    assert sent == []
