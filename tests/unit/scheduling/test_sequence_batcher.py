"""SequenceBatcher through its front door, with a fake instance that accumulates its
input into an implicit state and records the control values it got. Time is a
ManualClock: idle release happens when the test advances it, never by sleeping."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from nereid.config import parse_model_config
from nereid.config.schema import ModelConfig
from nereid.errors import (InvalidInputError, ModelExecutionError, NereidError, RequestCancelledError,
                           RequestTimeoutError)
from nereid.inference import InferRequest, SequenceFlags
from nereid.scheduling.sequence_batcher import SequenceBatcher
from nereid.scheduling.sequence_tensors import SequenceTensors
from nereid.stats import ModelStats
from tests.unit.manual_clock import ManualClock, next_turn, until

CONFIG = {
    "name": "acc",
    "max_batch_size": 4,
    "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    "sequence_batching": {
        "max_sequence_idle_microseconds": 1000,
        "control_input": [
            {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
            {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "fp32_false_true": [0, 1]}]},
            {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
            {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
        ],
        "state": [{"input_name": "STATE_IN", "output_name": "STATE_OUT", "data_type": "TYPE_INT32", "dims": [1],
                   "initial_state": [{"data_type": "TYPE_INT32", "dims": [1], "zero_data": True}]}],
    },
}
from tests.unit.scheduling.batcher_fakes import Outcome


@dataclass
class Accumulator:
    """OUTPUT = STATE_IN + INPUT, kept as STATE_OUT; records (CORRID, START, END, READY) per row."""

    name: str = "acc_0"
    capacity: int = 1
    problem: str | None = None
    enforces_timeout: bool = False
    queues_batches: bool = False
    batches: list[list[tuple[int, int, float, bool]]] = field(default_factory=list)
    #: per batch, each row's (INPUT, STATE_IN)
    values: list[list[tuple[int, int]]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    fail_on: int | None = None  # an INPUT value that fails the batch

    @property
    def cost_function(self) -> None:
        return None

    async def run_batch(self, requests: Sequence[InferRequest]) -> Outcome:
        self.batches.append([(int(r.inputs["CORRID"][0, 0]), int(r.inputs["START"][0, 0]),
                              float(r.inputs["END"][0, 0]), bool(r.inputs["READY"][0, 0])) for r in requests])
        self.values.append([(int(r.inputs["INPUT"][0, 0]), int(r.inputs["STATE_IN"][0, 0])) for r in requests])
        if self.gate is not None:
            await self.gate.wait()
        await next_turn()
        if any(int(r.inputs["INPUT"][0, 0]) == self.fail_on for r in requests):
            return Outcome(None, ModelExecutionError("the model raised"))
        outputs = []
        for request in requests:
            total = request.inputs["STATE_IN"] + request.inputs["INPUT"]
            outputs.append({"OUTPUT": total, "STATE_OUT": total})
        return Outcome(outputs, None)


def config(**changes: Any) -> ModelConfig:
    data = {**CONFIG, "sequence_batching": {**CONFIG["sequence_batching"], **changes}}  # type: ignore[dict-item]
    return parse_model_config(data, source="config.toml", folder_name="acc")


def make(instances: list[Accumulator], clock: ManualClock, **changes: Any) -> SequenceBatcher:
    model = config(**changes)
    return SequenceBatcher(config=model, tensors=SequenceTensors(model, Path(".")), instances=instances,
                           stats=ModelStats("acc", 1), clock=clock)


def request(value: int, id_: int | str, start: bool = False, end: bool = False) -> InferRequest:
    return InferRequest("acc", {"INPUT": np.array([[value]], dtype=np.int32)},
                        sequence=SequenceFlags(id_, start, end))


def total(answer: dict[str, np.ndarray]) -> int:
    return int(answer["OUTPUT"][0, 0])


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_sequence_accumulates_its_state_and_never_returns_it() -> None:
    async def scenario() -> None:
        async with make([Accumulator()], ManualClock()) as batcher:
            first = await batcher.infer(request(1, 7, start=True))
            second = await batcher.infer(request(2, 7))
            third = await batcher.infer(request(3, 7, end=True))
        assert [int(r["OUTPUT"][0, 0]) for r in (first, second, third)] == [1, 3, 6]
        assert all(list(r) == ["OUTPUT"] for r in (first, second, third))
        assert batcher.stats.success.count == 3

    run(scenario())


def test_controls_are_filled_as_triton_fills_them() -> None:
    async def scenario() -> None:
        instance = Accumulator()
        async with make([instance], ManualClock()) as batcher:
            await batcher.infer(request(1, 7, start=True))
            await batcher.infer(request(1, 7))
            await batcher.infer(request(1, 7, end=True))
            await batcher.infer(request(1, 9, start=True, end=True))
        assert instance.batches == [[(7, 1, 0.0, True)], [(7, 0, 0.0, True)], [(7, 0, 1.0, True)],
                                    [(9, 1, 1.0, True)]]

    run(scenario())


def test_interleaved_sequences_keep_their_own_state_and_share_batches() -> None:
    async def scenario() -> None:
        instance = Accumulator(gate=asyncio.Event())
        async with make([instance], ManualClock()) as batcher:
            a1 = asyncio.ensure_future(batcher.infer(request(1, 1, start=True)))
            await until(lambda: instance.batches)
            rest = [asyncio.ensure_future(batcher.infer(r)) for r in (
                request(10, 2, start=True), request(100, 3, start=True), request(2, 1))]
            instance.gate.set()
            results = await asyncio.gather(a1, *rest)
        assert [int(r["OUTPUT"][0, 0]) for r in results] == [1, 10, 100, 3]
        assert [[row[0] for row in batch] for batch in instance.batches] == [[1], [1, 2, 3]]

    run(scenario())


def test_a_start_resets_the_state_of_a_reused_id() -> None:
    async def scenario() -> None:
        async with make([Accumulator()], ManualClock()) as batcher:
            await batcher.infer(request(5, 7, start=True))
            again = await batcher.infer(request(1, 7, start=True))
        assert int(again["OUTPUT"][0, 0]) == 1

    run(scenario())


def test_an_idle_sequence_is_released_after_max_sequence_idle_microseconds() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with make([Accumulator()], clock) as batcher:
            await batcher.infer(request(1, 7, start=True))
            clock.advance(999_000)
            assert int((await batcher.infer(request(1, 7)))["OUTPUT"][0, 0]) == 2
            clock.advance(1_000_000)
            with pytest.raises(InvalidInputError, match="sequence 7 to model 'acc' must specify the START flag"):
                await batcher.infer(request(1, 7))
        assert sum(batcher.stats.failures_by_reason.values()) == 0  # refused before enqueueing, as in Triton

    run(scenario())


def test_a_string_id_for_an_integer_corrid_is_refused_with_tritons_message() -> None:
    async def scenario() -> None:
        async with make([Accumulator()], ManualClock()) as batcher:
            with pytest.raises(InvalidInputError) as raised:
                await batcher.infer(request(1, "abc", start=True))
        assert raised.value.message == ("[request id: <id_unknown>] sequence batching control 'CORRID' data-type is "
                                        "'BYTES', but model 'acc' expects 'UINT64'")

    run(scenario())


def test_oldest_batches_across_sequences_on_one_instance() -> None:
    async def scenario() -> None:
        instance = Accumulator(gate=asyncio.Event())
        async with make([instance], ManualClock(), oldest={"max_candidate_sequences": 8}) as batcher:
            first = asyncio.ensure_future(batcher.infer(request(1, 1, start=True)))
            await until(lambda: instance.batches)
            others = [asyncio.ensure_future(batcher.infer(request(1, i, start=True))) for i in range(2, 8)]
            instance.gate.set()
            await asyncio.gather(first, *others)
        assert [len(batch) for batch in instance.batches] == [1, 4, 2]  # max_batch_size 4

    run(scenario())


def test_closing_runs_what_was_accepted() -> None:
    async def scenario() -> None:
        instance = Accumulator(gate=asyncio.Event())
        batcher = make([instance], ManualClock())
        await batcher.__aenter__()
        answers = [asyncio.ensure_future(batcher.infer(request(1, 1, start=True))),
                   asyncio.ensure_future(batcher.infer(request(2, 1, end=True)))]
        await until(lambda: instance.batches)
        closing = asyncio.ensure_future(batcher.aclose())
        instance.gate.set()
        assert await closing
        assert [int(a.result()["OUTPUT"][0, 0]) for a in answers] == [1, 3]

    run(scenario())


def test_closing_with_a_drain_timeout_fails_what_is_still_running() -> None:
    async def scenario() -> None:
        instance = Accumulator(gate=asyncio.Event())  # never opened: the batch hangs in the model
        batcher = make([instance], ManualClock())
        await batcher.__aenter__()
        running = asyncio.ensure_future(batcher.infer(request(1, 1, start=True)))
        queued = asyncio.ensure_future(batcher.infer(request(2, 1)))
        await until(lambda: instance.batches)
        assert not await batcher.aclose(drain_timeout=0)
        for answer in (running, queued):
            with pytest.raises(NereidError, match="model 'acc' was unloaded"):
                await answer

    run(scenario())


def test_a_failed_step_fails_its_request_and_the_sequence_goes_on_from_its_last_state() -> None:
    async def scenario() -> None:
        async with make([Accumulator(fail_on=13)], ManualClock()) as batcher:
            await batcher.infer(request(1, 7, start=True))
            with pytest.raises(ModelExecutionError, match="the model raised"):
                await batcher.infer(request(13, 7))
            after = await batcher.infer(request(2, 7, end=True))
        assert int(after["OUTPUT"][0, 0]) == 3
        assert batcher.stats.failures_by_reason["BACKEND"] == 1

    run(scenario())


def test_an_empty_slot_below_a_ready_one_runs_a_null_request_with_ready_false() -> None:
    async def scenario() -> None:
        instance = Accumulator()
        async with make([instance], ManualClock()) as batcher:
            await batcher.infer(request(1, 7, start=True))  # slot 0
            await batcher.infer(request(10, 8, start=True))  # slot 1: slot 0 has nothing
        # the null row: START, END, READY false, CORRID 0, zeros for INPUT and STATE_IN
        assert instance.batches == [[(7, 1, 0.0, True)], [(0, 0, 0.0, False), (8, 1, 0.0, True)]]
        assert instance.values == [[(1, 0)], [(0, 0), (10, 0)]]

    run(scenario())


def test_a_null_rows_output_is_never_delivered_and_its_slots_state_is_untouched() -> None:
    async def scenario() -> None:
        instance = Accumulator()
        async with make([instance], ManualClock()) as batcher:
            await batcher.infer(request(1, 7, start=True))  # slot 0: state 1
            second = await batcher.infer(request(10, 8, start=True))  # slot 0 runs a null row (output 0)
            third = await batcher.infer(request(5, 7))  # 1 + 5: the null row's STATE_OUT was dropped
        assert (total(second), total(third)) == (10, 6)
        assert len(instance.batches[1]) == 2
        assert batcher.stats.success.count == 3  # the null row is no request
        assert batcher.stats.inference_count == 3

    run(scenario())


def test_direct_rows_stop_at_the_highest_ready_slot() -> None:
    async def scenario() -> None:
        instance = Accumulator()
        async with make([instance], ManualClock()) as batcher:
            for id_ in (1, 2, 3):
                await batcher.infer(request(1, id_, start=True))
            await batcher.infer(request(1, 2))
            await batcher.infer(request(1, 1))
        assert [[row[3] for row in batch] for batch in instance.batches] == [
            [True], [False, True], [False, False, True], [False, True], [True]]

    run(scenario())


def test_a_backlogged_sequence_past_its_requests_timeout_is_rejected_as_triton_rejects_it() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with make([Accumulator()], clock, max_sequence_idle_microseconds=10**9) as batcher:
            for id_ in (1, 2, 3, 4):  # the 4 slots
                await batcher.infer(request(1, id_, start=True))
            waiting = asyncio.ensure_future(batcher.infer(request(1, 5, start=True), timeout_us=1000))
            patient = asyncio.ensure_future(batcher.infer(request(1, 6, start=True)))
            await until(lambda: batcher.sequences.next_expiry_ns() is not None)
            clock.advance(999_000)
            assert not waiting.done()
            clock.advance(1_000)
            with pytest.raises(RequestTimeoutError, match="^timeout of the corresponding sequence has been expired$"):
                await waiting
            assert not patient.done()
            await batcher.infer(request(1, 1, end=True))  # a slot frees: sequence 6 gets it
            assert total(await patient) == 1
        assert batcher.stats.failures_by_reason["REJECTED"] == 1

    run(scenario())


def test_a_sequence_idle_in_the_backlog_is_released_only_after_it_got_a_slot_and_ran() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        async with make([Accumulator()], clock) as batcher:  # idle limit 1000 us
            for id_ in (1, 2, 3, 4):
                await batcher.infer(request(1, id_, start=True))
            backlogged = asyncio.ensure_future(batcher.infer(request(1, 5, start=True)))
            await until(lambda: batcher.sequences.backlog)
            clock.advance(500_000)
            for id_ in (1, 2, 3):  # keep 1-3 busy; 4 idles out and frees its slot
                await batcher.infer(request(1, id_))
            clock.advance(500_000)
            assert total(await backlogged) == 1  # idle 1000 us in the backlog: kept, then run
            clock.advance(0)  # the reaper, due now: idle since its last request
            with pytest.raises(InvalidInputError, match="sequence 5 to model 'acc' must specify the START flag"):
                await batcher.infer(request(1, 5))

    run(scenario())


def test_a_cancelled_queued_request_ends_its_sequence_and_fails_those_behind_it_as_canceled() -> None:
    async def scenario() -> None:
        instance = Accumulator(gate=asyncio.Event())
        async with make([instance], ManualClock()) as batcher:
            running = asyncio.ensure_future(batcher.infer(request(1, 7, start=True)))
            await until(lambda: instance.batches)
            cancelled = asyncio.ensure_future(batcher.infer(request(2, 7)))
            behind = asyncio.ensure_future(batcher.infer(request(3, 7)))
            await until(lambda: batcher.queue_depth == 2)
            cancelled.cancel()
            with pytest.raises(RequestCancelledError, match="sequence 7 was cancelled"):
                await behind
            instance.gate.set()
            assert total(await running) == 1
            with pytest.raises(InvalidInputError, match="sequence 7 to model 'acc' must specify the START flag"):
                await batcher.infer(request(4, 7))
        assert batcher.stats.failures_by_reason["CANCELED"] == 2

    run(scenario())
