"""The main process's end of a worker's link (WorkerLink) with a real model behind it: the
DECODED requests of one frame are queued together and answered in one RESULTS block,
each with its own rows; what cannot be served is answered per request."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import numpy as np
import pytest

from nereid.frontends.arena import Arena
from nereid.frontends.layout import read_arrays, write_arrays
from nereid.frontends.link import WorkerLink
from nereid.frontends.messages import FrameReader, Kind, frame
from nereid.local import InProcessServer

CONFIG = """\
name = "double"
max_batch_size = 8

[[input]]
name = "X"
data_type = "TYPE_FP32"
dims = [2]

[[output]]
name = "Y"
data_type = "TYPE_FP32"
dims = [2]

[dynamic_batching]
max_queue_delay_microseconds = {delay_us}
{policy}
"""

MODEL = """\
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        return {"Y": inputs["X"] * 2}
"""

_LAYOUT = (("X", 0, "<f4", (1, 2)),)
_TEMPLATE = (1, None, (), 0, None, True, _LAYOUT)


class Worker:
    """The worker's end, played by the test: what the link sends, read back."""

    def __init__(self) -> None:
        self.reader = FrameReader()
        self.messages: list[tuple[Any, ...]] = []
        self.arrived = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.messages += self.reader.feed(data)
        self.arrived.set()

    def close(self) -> None:
        pass

    def of(self, kind: Kind) -> list[tuple[Any, ...]]:
        return [message for message in self.messages if message[0] == kind.value]

    async def wait_for(self, kind: Kind, count: int = 1) -> list[tuple[Any, ...]]:
        async with asyncio.timeout(30):
            while len(self.of(kind)) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.of(kind)


@contextlib.asynccontextmanager
async def served_double(tmp_path: Path, delay_us: int = 0, policy: str = "") -> AsyncIterator[tuple[InProcessServer, Any]]:
    """The ``double`` model served in this process, and the main app a link needs of it
    (its manager; raw infer requests answered by nobody)."""
    folder = tmp_path / "double"
    folder.mkdir()
    (folder / "config.toml").write_text(CONFIG.format(delay_us=delay_us, policy=policy))
    (folder / "model.py").write_text(MODEL)
    async with InProcessServer(str(tmp_path)) as server:
        yield server, SimpleNamespace(endpoints=SimpleNamespace(
            infer_endpoint=SimpleNamespace(manager=server.manager), start_infer=lambda *args: None))


async def _linked(tmp_path: Path, delay_us: int = 0, policy: str = "") -> AsyncIterator[tuple[WorkerLink, Worker, Arena, int]]:
    async with served_double(tmp_path, delay_us, policy) as (server, app):
        arena = Arena.create(64 * 1024)
        worker = Worker()
        link = WorkerLink(app, arena, {}, 0)  # type: ignore[arg-type]
        link.connection_made(worker)
        # a raw request first (its answer is the app's, here none): the link announces the model
        link.data_received(frame((Kind.INFER.value, 0, "double", None, (None, None, None), 0, -1, 0, b"")))
        token = (await worker.wait_for(Kind.MODEL))[0][2]
        try:
            yield link, worker, arena, token
        finally:
            link.close()


def _decoded(arena: Arena, token: int, ids: range, first_number: bool = True) -> list[tuple[Any, ...]]:
    """DECODED messages for requests ``ids``, X = [id, -id], in blocks one after another."""
    messages = []
    for index, id in enumerate(ids):
        offset = 64 * id
        write_arrays(arena.requests[offset:offset + 64], {"X": np.array([[id, -id]], np.float32)})
        template = _TEMPLATE if first_number and index == 0 else None
        messages.append((Kind.DECODED.value, id, token, 0, template, offset, f"r{id}", 0))
    return messages


def run(scenario: Any) -> None:
    asyncio.run(scenario)


def test_a_frames_decoded_requests_are_answered_together_each_with_its_rows(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path):
            link.data_received(frame(*_decoded(arena, token, range(1, 6))))
            results = await worker.wait_for(Kind.RESULTS)
            answered: dict[int, list[float]] = {}
            for _, version, offset, layout, entries in worker.of(Kind.RESULTS):
                assert version == 1
                joined = read_arrays(arena.answers, offset, layout)["Y"]
                start = 0
                for id, rows in entries:
                    answered[id] = joined[start:start + rows].ravel().tolist()
                    start += rows
                link.data_received(frame((Kind.FREED.value, [offset])))
            assert answered == {id: [2.0 * id, -2.0 * id] for id in range(1, 6)}
            assert len(results) <= 2  # one block per batch, not one per request
            assert link.decoded == 5 and not link.tickets and link.ring.blocks == 0

    run(scenario())


def test_requests_decoded_for_a_version_no_longer_served_are_sent_again_raw(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path):
            link.data_received(frame(*_decoded(arena, token + 1, range(1, 3))))
            retried = await worker.wait_for(Kind.RETRY, 2)
            assert [message[1] for message in retried] == [1, 2]

    run(scenario())


def test_a_request_the_queue_has_no_room_for_fails_alone(tmp_path: Path) -> None:
    policy = "\n[dynamic_batching.default_queue_policy]\nmax_queue_size = 2\n"
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=10_000_000, policy=policy):
            link.data_received(frame(*_decoded(arena, token, range(1, 4))))
            (answer,) = await worker.wait_for(Kind.ANSWER)
            _, id, status, _, _, _, body, _ = answer
            assert (id, status) == (3, 503) and b"Exceeds maximum queue size" in body
            assert sorted(link.tickets) == [1, 2]  # still queued, waiting out the delay
            link.data_received(frame((Kind.WITHDRAW.value, 1)))
            done = await worker.wait_for(Kind.DONE)
            assert done[0][1] == 1 and sorted(link.tickets) == [2]

    run(scenario())


@pytest.mark.parametrize("spaced", [True, False], ids=["blocks-one-after-another", "blocks-apart"])
def test_inputs_are_read_right_whether_or_not_the_blocks_follow_each_other(tmp_path: Path, spaced: bool) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path):
            messages = _decoded(arena, token, range(1, 4))
            if not spaced:  # the second request's block moved further on
                write_arrays(arena.requests[64 * 9:64 * 10], {"X": np.array([[2, -2]], np.float32)})
                messages[1] = messages[1][:5] + (64 * 9,) + messages[1][6:]
            link.data_received(frame(*messages))
            await worker.wait_for(Kind.RESULTS)
            got: dict[int, list[float]] = {}
            while sum(len(message[4]) for message in worker.of(Kind.RESULTS)) < 3:
                await worker.wait_for(Kind.RESULTS, len(worker.of(Kind.RESULTS)) + 1)
            for _, _, offset, layout, entries in worker.of(Kind.RESULTS):
                joined = read_arrays(arena.answers, offset, layout)["Y"]
                for index, (id, _) in enumerate(entries):
                    got[id] = joined[index].tolist()
            assert got == {id: [2.0 * id, -2.0 * id] for id in range(1, 4)}

    run(scenario())


def test_armed_says_the_worker_handles_its_signals_and_tells_whoever_waits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, _, _, _ in _linked(tmp_path):
            told: list[bool] = []
            link.on_armed = lambda: told.append(link.armed)
            assert not link.armed
            link.data_received(frame((Kind.ARMED.value,)))
            assert link.armed and told == [True]

    run(scenario())
