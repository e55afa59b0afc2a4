"""DynamicBatcher's life around the request flow (batcher_lifecycle.py): started by
``async with``, tuned at run time, read by the metrics, drained by ``aclose``.

Fake instances and a ManualClock as in test_batcher.py (batcher_fakes.py); tests wait
with ``until`` and ``settle``, never by sleeping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nereid.config.schema import DynamicBatching, QueuePolicy
from nereid.errors import UnavailableError
from nereid.scheduling.batcher import DynamicBatcher
from nereid.stats import ModelStats
from tests.unit.manual_clock import ManualClock, settle, until
from tests.unit.scheduling.batcher_fakes import FakeInstance, make, run


def test_the_gauges_count_the_batches_running_and_the_requests_waiting() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        async with make([instance], max_batch_size=2) as batcher:
            assert (batcher.executing, batcher.queue_depth) == (0, 0)
            calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(5)]
            await until(lambda: batcher.executing == 1)
            await settle()
            assert (batcher.executing, batcher.queue_depth) == (1, 3)  # one batch of 2 runs, 3 wait
            gate.set()
            assert await asyncio.gather(*calls) == [0, 2, 4, 6, 8]
            assert (batcher.executing, batcher.queue_depth) == (0, 0)

    run(scenario())


def test_closing_drains_queued_requests_without_waiting_out_the_delay() -> None:
    async def scenario() -> None:
        instance = FakeInstance()
        batcher = make([instance], max_batch_size=8, max_queue_delay_microseconds=10**9)
        await batcher.__aenter__()
        calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(3)]
        await until(lambda: batcher.queue_depth == 3)
        await settle()
        assert instance.batches == []  # waiting out the (1000 s) delay
        await batcher.aclose()
        assert await asyncio.gather(*calls) == [0, 2, 4]

    run(scenario())


def test_set_max_batch_size_applies_to_later_batches() -> None:
    async def scenario() -> None:
        instance = FakeInstance()
        async with make([instance], max_batch_size=8, max_queue_delay_microseconds=10**9) as batcher:
            batcher.set_max_batch_size(2)
            await asyncio.gather(*(batcher.infer(i) for i in range(4)))
        assert [len(b) for b in instance.batches] == [2, 2]

    run(scenario())


def test_set_max_queue_delay_wakes_a_batch_that_waits_out_the_old_delay() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = FakeInstance()
        async with make([instance], max_batch_size=8, clock=clock, max_queue_delay_microseconds=10**9) as batcher:
            calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(3)]
            await until(lambda: batcher.queue_depth == 3 and clock.pending)
            batcher.set_max_queue_delay(0)
            await until(lambda: all(call.done() for call in calls))
            assert [call.result() for call in calls] == [0, 2, 4]
        assert instance.batches == [[0, 1, 2]]

    run(scenario())


def test_closing_with_a_drain_timeout_fails_what_is_still_queued_or_running() -> None:
    async def scenario() -> None:
        instance = FakeInstance(gate=asyncio.Event())  # never opened: the batch runs until cancelled
        batcher = make([instance], max_batch_size=1)
        await batcher.__aenter__()
        calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(3)]
        await until(lambda: batcher.executing == 1 and batcher.queue_depth == 2)
        assert not await batcher.aclose(drain_timeout=0)
        for call in calls:
            with pytest.raises(UnavailableError, match="model 'm' was unloaded"):
                await call
        assert instance.batches == [[0]]
        assert await batcher.aclose()  # closed already: nothing left to drain
        with pytest.raises(UnavailableError, match="model 'm' is not accepting requests"):
            await batcher.infer(3)

    run(scenario())


@pytest.mark.parametrize(("bundles", "batching", "limit", "limit_at_3"), [
    (True, {}, 8, 3),
    (True, {"preferred_batch_size": [2, 4]}, 4, 2),  # at 3, the largest preferred size left is 2
    (True, {"default_queue_policy": QueuePolicy(max_queue_size=16)}, 0, 0),  # it counts requests
    (True, {"preserve_ordering": True}, 0, 0),  # a failed batch's reruns would answer out of it
    (True, None, 0, 0),  # no dynamic batching: a batch per request
    (False, {}, 0, 0),  # the model sees requests one by one, or counts its own cost
], ids=["max-batch-size", "largest-preferred", "bounded-queue", "preserve-ordering", "no-batching",
        "model-tells-them-apart"])
def test_a_bundle_holds_at_most_what_the_model_batches_whole_and_only_where_nobody_can_tell(
        bundles: bool, batching: dict[str, Any] | None, limit: int, limit_at_3: int) -> None:
    batcher = DynamicBatcher(model_name="m", max_batch_size=8,
                             dynamic_batching=None if batching is None else DynamicBatching(**batching),
                             instances=[FakeInstance()], stats=ModelStats("m", 1), bundles=bundles)
    assert batcher.bundle_limit == limit
    batcher.set_max_batch_size(3)  # at run time
    assert batcher.bundle_limit == limit_at_3
