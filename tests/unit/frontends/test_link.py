"""The main process's end of a worker's link (WorkerLink) with a real model behind it: the
DECODED requests of one frame are queued together and answered in one RESULTS block,
each with its own rows; what cannot be served is answered per request."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereid.frontends.arena import Arena
from nereid.frontends.layout import read_arrays, write_arrays
from nereid.frontends.link import WorkerLink
from nereid.frontends.messages import FrameReader, Kind, frame
from nereid.local import InProcessServer
from tests.waiting import MODEL_GATE, wait_until_async

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
async def served_double(tmp_path: Path, delay_us: int = 0, policy: str = "",
                        model: str = MODEL) -> AsyncIterator[tuple[InProcessServer, Any]]:
    """The ``double`` model (``model``: its model.py) served in this process, and the main
    app a link needs of it (its manager; raw infer requests answered by nobody)."""
    folder = tmp_path / "double"
    folder.mkdir()
    (folder / "config.toml").write_text(CONFIG.format(delay_us=delay_us, policy=policy))
    (folder / "model.py").write_text(model)
    async with InProcessServer(str(tmp_path)) as server:
        yield server, SimpleNamespace(endpoints=SimpleNamespace(
            infer_endpoint=SimpleNamespace(manager=server.manager), start_infer=lambda *args: None))


async def _linked(tmp_path: Path, delay_us: int = 0, policy: str = "",
                  model: str = MODEL) -> AsyncIterator[tuple[WorkerLink, Worker, Arena, int]]:
    async with served_double(tmp_path, delay_us, policy, model) as (server, app):
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


# -- bundles: a frame's requests of one template queued as one entry ------------------------

PICKY = """\
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        if (inputs["X"][:, 0] == 13).any():
            raise ValueError("13 is not served")
        return {"Y": inputs["X"] * 2}
"""

_LAYOUT_2 = (("X", 0, "<f4", (2, 2)),)
_TEMPLATE_2 = (2, None, (), 0, None, True, _LAYOUT_2)


def _serving(link: WorkerLink) -> Any:
    return link.app.endpoints.infer_endpoint.manager.latest["double"]


def _answers(worker: Worker, arena: Arena) -> dict[int, Any]:
    """Each answered request's output rows (RESULTS, RESULT) or its error's status (ANSWER)."""
    got: dict[int, Any] = {}
    for _, _, offset, layout, entries in worker.of(Kind.RESULTS):
        joined = read_arrays(arena.answers, offset, layout)["Y"]
        start = 0
        for id, rows in entries:
            got[id] = joined[start:start + rows].tolist()
            start += rows
    for message in worker.of(Kind.RESULT):
        got[message[1]] = (message[5] or read_arrays(arena.answers, message[3], message[4]))["Y"].tolist()
    for message in worker.of(Kind.ANSWER):
        got[message[1]] = message[2]
    return got


async def _answered(worker: Worker, arena: Arena, ids: set[int]) -> dict[int, Any]:
    async with asyncio.timeout(30):
        while not ids <= set(_answers(worker, arena)) - {id for message in worker.of(Kind.DONE) for id in message[1:2]}:
            worker.arrived.clear()
            await worker.arrived.wait()
    return _answers(worker, arena)


def _counting_bundles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The count of every bundle queued from now on (ServingModel.submit_bundle's)."""
    from nereid.models.serving import ServingModel

    counts: list[int] = []
    submit = ServingModel.submit_bundle

    def counted(self: Any, request: Any, count: int, received_ns: int, answer: Any) -> Any:
        counts.append(count)
        return submit(self, request, count, received_ns, answer)

    monkeypatch.setattr(ServingModel, "submit_bundle", counted)
    return counts


def test_a_frames_requests_of_one_template_wait_as_one_bundle_and_are_counted_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _counting_bundles(monkeypatch)

    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000):
            serving = _serving(link)
            link.data_received(frame(*_decoded(arena, token, range(1, 6))))
            assert counts == [5]
            assert serving.queue_depth == 5  # the gauge counts requests, not queue entries
            serving.batcher.set_max_queue_delay(0)
            got = await _answered(worker, arena, set(range(1, 6)))
            assert got == {id: [[2.0 * id, -2.0 * id]] for id in range(1, 6)}
            stats = serving.stats
            assert (stats.success.count, stats.inference_count, stats.execution_count) == (5, 5, 1)
            assert stats.queue.count == 5 and sum(stats.queue_buckets) == 5
            assert serving.queue_depth == 0 and not link.tickets

    run(scenario())


def test_a_bundle_holds_at_most_what_one_batch_may(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _counting_bundles(monkeypatch)

    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path):  # max_batch_size 8
            link.data_received(frame(*_decoded(arena, token, range(1, 21))))
            got = await _answered(worker, arena, set(range(1, 21)))
            assert counts == [8, 8, 4]
            assert got == {id: [[2.0 * id, -2.0 * id]] for id in range(1, 21)}
            assert _serving(link).stats.success.count == 20

    run(scenario())


def test_a_request_withdrawn_while_its_bundle_waits_leaves_it_and_counts_as_canceled(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000):
            serving = _serving(link)
            link.data_received(frame(*_decoded(arena, token, range(1, 5))))
            link.data_received(frame((Kind.WITHDRAW.value, 2)))
            assert [message[1] for message in await worker.wait_for(Kind.DONE)] == [2]
            assert serving.queue_depth == 3 and serving.stats.failures_by_reason["CANCELED"] == 1
            serving.batcher.set_max_queue_delay(0)
            got = await _answered(worker, arena, {1, 3, 4})
            assert got == {id: [[2.0 * id, -2.0 * id]] for id in (1, 3, 4)}  # the others' own rows
            stats = serving.stats
            assert (stats.success.count, stats.fail.count, stats.inference_count) == (3, 1, 3)

    run(scenario())


def test_a_bundle_whose_requests_all_left_leaves_the_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000):
            serving = _serving(link)
            link.data_received(frame(*_decoded(arena, token, range(1, 4))))
            for id in (3, 1, 2):
                link.data_received(frame((Kind.WITHDRAW.value, id)))
            assert {message[1] for message in await worker.wait_for(Kind.DONE, 3)} == {1, 2, 3}
            assert serving.queue_depth == 0 and not link.tickets
            assert serving.stats.failures_by_reason["CANCELED"] == serving.stats.fail.count == 3

    run(scenario())


def test_a_bundle_in_a_failed_batch_is_rerun_a_request_at_a_time_so_only_the_culprit_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, model=PICKY):
            link.data_received(frame(*_decoded(arena, token, range(11, 16))))
            got = await _answered(worker, arena, set(range(11, 16)))
            assert got == {**{id: [[2.0 * id, -2.0 * id]] for id in (11, 12, 14, 15)}, 13: 500}
            error = next(message for message in worker.of(Kind.ANSWER) if message[1] == 13)
            assert b"13 is not served" in error[6]
            stats = _serving(link).stats
            assert (stats.success.count, stats.fail.count) == (4, 1)

    run(scenario())


def test_a_bundle_that_would_pass_max_batch_size_gives_the_batch_what_fits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000):  # max_batch_size 8
            serving = _serving(link)
            link.data_received(frame(*_decoded(arena, token, range(1, 6))))
            link.data_received(frame(*_decoded(arena, token, range(6, 11), first_number=False)))
            link.data_received(frame((Kind.WITHDRAW.value, 7)))  # leaves the second bundle while it waits
            await worker.wait_for(Kind.DONE)
            serving.batcher.set_max_queue_delay(0)
            got = await _answered(worker, arena, {1, 2, 3, 4, 5, 6, 8, 9, 10})
            assert got == {id: [[2.0 * id, -2.0 * id]] for id in (1, 2, 3, 4, 5, 6, 8, 9, 10)}
            stats = serving.stats
            assert sorted(stats.batch_stats) == [1, 8]  # 5 + 3 of the 4 left, then the last one
            assert (stats.success.count, stats.execution_count, stats.queue.count) == (9, 2, 9)
            assert serving.queue_depth == 0 and not link.tickets

    run(scenario())


GATED = """\
import pathlib


class Model:
    def __init__(self, context):
        self.gate = pathlib.Path(context.model_dir) / "open"

    def infer(self, inputs):
        wait_for_file(self.gate)
        return {"Y": inputs["X"] * 2}
""" + MODEL_GATE


def test_a_request_of_the_running_part_of_a_bundle_withdraws_from_that_part(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000, model=GATED):
            serving = _serving(link)
            link.data_received(frame(*_decoded(arena, token, range(1, 6))))
            link.data_received(frame(*_decoded(arena, token, range(6, 11), first_number=False)))
            serving.batcher.set_max_queue_delay(0)  # 1-5 with 6-8 run, held at the gate; 9 and 10 wait
            await wait_until_async(lambda: serving.batcher.executing == 1 and serving.queue_depth == 2,
                                   "the first batch running, two requests waiting")
            link.data_received(frame((Kind.WITHDRAW.value, 7), (Kind.WITHDRAW.value, 9)))  # running; waiting
            assert sorted(message[1] for message in await worker.wait_for(Kind.DONE, 2)) == [7, 9]
            assert serving.stats.failures_by_reason["CANCELED"] == 1  # 9 left the queue; 7 runs on, unanswered
            (tmp_path / "double" / "open").touch()
            wanted = {1, 2, 3, 4, 5, 6, 8, 10}
            got = await _answered(worker, arena, wanted)
            assert {id: got[id] for id in wanted} == {id: [[2.0 * id, -2.0 * id]] for id in wanted}
            assert sorted(serving.stats.batch_stats) == [1, 8]
            assert serving.queue_depth == 0 and not link.tickets

    run(scenario())


def test_the_part_of_a_bundle_a_failed_batch_took_is_rerun_a_request_at_a_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async for link, worker, arena, token in _linked(tmp_path, delay_us=1_000_000_000, model=PICKY):
            link.data_received(frame(*_decoded(arena, token, range(8, 13))))
            link.data_received(frame(*_decoded(arena, token, range(13, 18), first_number=False)))
            _serving(link).batcher.set_max_queue_delay(0)  # 8-12 and 13-15 (13 fails), then 16-17
            got = await _answered(worker, arena, set(range(8, 18)))
            assert got == {**{id: [[2.0 * id, -2.0 * id]] for id in range(8, 18) if id != 13}, 13: 500}
            stats = _serving(link).stats
            assert (stats.success.count, stats.fail.count) == (9, 1)
            assert 2 in stats.batch_stats  # the bundle's rest: 16 and 17

    run(scenario())


TRITON_DOUBLE = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(request, "X")
                                                            .as_numpy() * 2)]) for request in requests]
"""


def test_a_model_that_sees_requests_one_by_one_or_a_bounded_queue_takes_no_bundles(tmp_path: Path) -> None:
    policy = "\n[dynamic_batching.default_queue_policy]\nmax_queue_size = 2\n"

    async def scenario() -> None:
        async with served_double(tmp_path / "bounded", policy=policy) as (server, _):
            assert server.manager.latest["double"].bundle_limit == 0
        async with served_double(tmp_path / "free") as (server, _):
            assert server.manager.latest["double"].bundle_limit == 8
        async with served_double(tmp_path / "triton", model=TRITON_DOUBLE) as (server, _):  # execute sees each
            assert server.manager.latest["double"].bundle_limit == 0

    for folder in ("bounded", "free", "triton"):
        (tmp_path / folder).mkdir()
    run(scenario())


def _frames_of(plan: list[list[tuple[int, bool]]], arena: Arena, token: int) -> list[list[tuple[Any, ...]]]:
    """DECODED frames for ``plan``: per frame, per request (rows 1 or 2, a block apart
    from the one before or not); request ids count from 1, each X its own values."""
    frames: list[list[tuple[Any, ...]]] = []
    sent: set[int] = set()
    id = slot = 0
    for requests in plan:
        messages = []
        for rows, apart in requests:
            id += 1
            slot += 2 if apart else 1
            offset = 64 * slot
            x = np.array([[id + row / 2, -id - row / 2] for row in range(rows)], np.float32)
            write_arrays(arena.requests[offset:offset + 64], {"X": x})
            number = rows - 1
            template = None if number in sent else (_TEMPLATE if rows == 1 else _TEMPLATE_2)
            sent.add(number)
            messages.append((Kind.DECODED.value, id, token, number, template, offset, f"r{id}", 0))
        frames.append(messages)
    return frames


async def _served_plan(folder: Path, plan: list[list[tuple[int, bool]]], bundles: bool) -> tuple[dict[int, Any], tuple[int, ...]]:
    """Every request's answer and the statistics' counts, ``plan`` sent through a link
    with bundles, or with each request its own entry (the general path)."""
    from unittest import mock

    from nereid.models.serving import ServingModel

    folder.mkdir()
    limit = {} if bundles else {"new": property(lambda self: 0)}
    with mock.patch.object(ServingModel, "bundle_limit", **limit) if limit else contextlib.nullcontext():
        async for link, worker, arena, token in _linked(folder):
            for messages in _frames_of(plan, arena, token):
                link.data_received(frame(*messages))
            total = sum(len(requests) for requests in plan)
            got = await _answered(worker, arena, set(range(1, total + 1)))
            stats = _serving(link).stats
            return got, (stats.success.count, stats.fail.count, stats.inference_count, stats.queue.count)
    raise AssertionError("not served")


_PLANS = st.lists(st.lists(st.tuples(st.sampled_from([1, 2]), st.booleans()), min_size=1, max_size=12),
                  min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=_PLANS)
def test_bundles_answer_every_request_as_the_request_at_a_time_path_does(tmp_path: Path, plan: Any) -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as work:
            general = await _served_plan(Path(work) / "general", plan, bundles=False)
            bundled = await _served_plan(Path(work) / "bundled", plan, bundles=True)
        assert bundled == general
        total = sum(len(requests) for requests in plan)
        assert general[1] == (total, 0, sum(rows for requests in plan for rows, _ in requests), total)

    run(scenario())
