"""DynamicBatcher through its front door, with fake instances that record what they get.

Time is a ManualClock: it moves only when a test advances it, and a test waits for the
batcher's tasks with ``until`` (a condition) or ``settle`` (to see that nothing happens),
never by sleeping.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import pytest

from nereid.scheduling.batcher import DynamicBatcher
from nereid.scheduling.clock import SYSTEM_CLOCK
from nereid.config.schema import DynamicBatching, QueuePolicy
from nereid.errors import ModelExecutionError, QueueFullError, RequestTimeoutError, UnavailableError
from nereid.stats import ModelStats
from tests.unit.manual_clock import ManualClock, settle, until, next_turn
from tests.unit.scheduling.batcher_fakes import FakeInstance, Outcome, StoppingBatcher, make, run



def test_a_burst_with_a_long_queue_delay_forms_one_batch() -> None:
    async def scenario() -> None:
        instance = FakeInstance()
        async with make([instance], max_batch_size=8, max_queue_delay_microseconds=10**9) as batcher:
            results = await asyncio.gather(*(batcher.infer(i) for i in range(8)))
        assert results == [i * 2 for i in range(8)]
        assert [len(b) for b in instance.batches] == [8]
        assert batcher.stats.execution_count == 1
        assert batcher.stats.success.count == 8

    run(scenario())


def test_requests_arriving_while_the_instance_is_busy_are_batched_together() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        async with make([instance], max_batch_size=8, max_queue_delay_microseconds=0) as batcher:
            first = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            rest = [asyncio.ensure_future(batcher.infer(i)) for i in range(1, 6)]
            await until(lambda: batcher.queue_depth == 5)
            gate.set()
            await asyncio.gather(first, *rest)
        assert [len(b) for b in instance.batches] == [1, 5]

    run(scenario())


def test_two_idle_instances_both_take_work() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        a, b = FakeInstance("a", gate=gate), FakeInstance("b", gate=gate)
        async with make([a, b], max_batch_size=1) as batcher:
            calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(2)]
            await until(lambda: batcher.queue_depth == 0)
            await settle()
            assert len(a.batches) == 1 and len(b.batches) == 1
            gate.set()
            await asyncio.gather(*calls)

    run(scenario())


def test_max_concurrent_batches_lets_one_instance_run_several_batches() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(capacity=3, gate=gate)
        async with make([instance], max_batch_size=1) as batcher:
            calls = [asyncio.ensure_future(batcher.infer(i)) for i in range(3)]
            await until(lambda: batcher.queue_depth == 0)
            await settle()
            assert len(instance.batches) == 3
            gate.set()
            await asyncio.gather(*calls)

    run(scenario())


def test_a_failing_request_fails_alone_and_its_batch_mates_succeed() -> None:
    async def scenario() -> None:
        instance = FakeInstance(poison=3)
        async with make([instance], max_batch_size=8, max_queue_delay_microseconds=10**9) as batcher:
            results = await asyncio.gather(*(batcher.infer(i) for i in range(8)), return_exceptions=True)
        assert isinstance(results[3], ModelExecutionError)
        assert str(results[3]) == "model raised on 3"
        assert [r for i, r in enumerate(results) if i != 3] == [i * 2 for i in range(8) if i != 3]
        assert batcher.stats.fail.count == 1
        assert batcher.stats.success.count == 7

    run(scenario())


def test_queue_full_rejects_with_tritons_message() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        policy = QueuePolicy(max_queue_size=1)
        async with make([instance], max_batch_size=1, default_queue_policy=policy) as batcher:
            running = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            queued = asyncio.ensure_future(batcher.infer(1))
            await until(lambda: batcher.queue_depth == 1)
            with pytest.raises(QueueFullError, match="Exceeds maximum queue size"):
                await batcher.infer(2)
            gate.set()
            assert await asyncio.gather(running, queued) == [0, 2]

    run(scenario())


def test_queued_request_times_out_with_request_timeout_expired() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        clock = ManualClock()
        policy = QueuePolicy(default_timeout_microseconds=20_000)
        async with make([instance], max_batch_size=1, clock=clock, default_queue_policy=policy) as batcher:
            running = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            queued = asyncio.ensure_future(batcher.infer(1))
            await until(lambda: batcher.queue_depth == 1)
            # The instance is busy, so no batch is being formed: the timeout fires on its own.
            clock.advance(20_000_000 - 1)
            await settle()
            assert not queued.done()
            clock.advance(1)
            await until(queued.done)
            with pytest.raises(RequestTimeoutError, match="Request timeout expired"):
                await queued
            gate.set()
            await running
        assert batcher.stats.failures_by_reason["REJECTED"] == 1

    run(scenario())


@pytest.mark.parametrize("override, times_out", [(True, True), (False, False)])
def test_a_request_timeout_counts_without_a_default_one_only_when_overriding_is_allowed(
    override: bool, times_out: bool
) -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        clock = ManualClock()
        policy = QueuePolicy(allow_timeout_override=override)
        async with make([instance], max_batch_size=1, clock=clock, default_queue_policy=policy) as batcher:
            running = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            queued = asyncio.ensure_future(batcher.infer(3, timeout_us=20_000))
            await until(lambda: batcher.queue_depth == 1)
            clock.advance(50_000_000)  # well past the request's 20 ms
            await settle()
            assert queued.done() is times_out
            gate.set()
            await running
            if times_out:
                with pytest.raises(RequestTimeoutError, match="Request timeout expired"):
                    await queued
            else:
                assert await queued == 6

    run(scenario())


def test_a_higher_priority_request_goes_first_through_the_batcher() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        async with make([instance], max_batch_size=1, priority_levels=2, default_priority_level=2) as batcher:
            running = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            normal = asyncio.ensure_future(batcher.infer(1))
            urgent = asyncio.ensure_future(batcher.infer(5, priority=1))
            await until(lambda: batcher.queue_depth == 2)
            gate.set()
            assert await asyncio.gather(running, normal, urgent) == [0, 2, 10]
        assert instance.batches == [[0], [5], [1]]

    run(scenario())


def test_a_cancelled_caller_takes_its_request_out_of_the_queue() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        async with make([instance], max_batch_size=4, max_queue_delay_microseconds=0) as batcher:
            running = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: len(instance.batches) == 1)
            gone = asyncio.ensure_future(batcher.infer(99))
            kept = asyncio.ensure_future(batcher.infer(1))
            await until(lambda: batcher.queue_depth == 2)
            gone.cancel()
            await until(lambda: batcher.queue_depth == 1)
            gate.set()
            assert await asyncio.gather(running, kept) == [0, 2]
        assert all(99 not in batch for batch in instance.batches)
        assert batcher.stats.failures_by_reason["CANCELED"] == 1

    run(scenario())


# 100 µs waits go to the precise timer, 5 ms ones to the loop's call_at (1 ms steps).
@pytest.mark.parametrize("delay_us", [100, 5_000])
def test_a_partial_batch_leaves_once_its_oldest_request_waited_the_queue_delay(delay_us: int) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = FakeInstance()
        delay_ns = delay_us * 1000
        async with make([instance], max_batch_size=8, clock=clock, max_queue_delay_microseconds=delay_us) as batcher:
            first = asyncio.ensure_future(batcher.infer(0))
            await until(lambda: clock.pending == [clock.monotonic_ns() + delay_ns])
            clock.advance(delay_ns // 2)
            rest = [asyncio.ensure_future(batcher.infer(i)) for i in (1, 2)]
            await until(lambda: batcher.queue_depth == 3)
            clock.advance(delay_ns // 2 - 1)
            await settle()
            assert instance.batches == []
            clock.advance(1)
            await until(lambda: first.done() and all(call.done() for call in rest))
            assert [first.result()] + [call.result() for call in rest] == [0, 2, 4]
        assert instance.batches == [[0, 1, 2]]
        # Queue times, exactly: the first waited the whole delay, the others half of it.
        assert batcher.stats.queue.ns == delay_ns + 2 * (delay_ns // 2)
        assert clock.pending == []

    run(scenario())


@dataclass
class FakeStreamingInstance:
    """Streams item*1, item*2, ... and marks an item finished after ``item`` steps."""

    name: str = "stream_0"
    capacity: int = 1
    problem: str | None = None
    enforces_timeout: bool = False
    queues_batches: bool = False
    batches: list[list[Any]] = field(default_factory=list)
    steps_run: int = 0

    @property
    def cost_function(self) -> None:
        return None

    async def run_batch(self, items: Sequence[Any]) -> Outcome:  # pragma: no cover - unused
        raise AssertionError("a streaming batcher must call run_stream")

    async def run_stream(self, items: Sequence[Any], sink: Any, abandoned: Any) -> Outcome:
        self.batches.append(list(items))
        for step in range(1, max(items) + 1):
            self.steps_run += 1
            sink([item * step for item in items], [item <= step for item in items])
            await next_turn()
            if abandoned():
                break
        return Outcome([], None)


def make_streaming(instance: FakeStreamingInstance, **batching: Any) -> DynamicBatcher:
    return StoppingBatcher(
        model_name="s", max_batch_size=8, dynamic_batching=DynamicBatching(**batching),
        instances=[instance], stats=ModelStats("s", 1), streaming=True, clock=ManualClock(),
    )


def test_each_streaming_request_gets_its_own_steps_and_leaves_when_finished() -> None:
    async def scenario() -> None:
        instance = FakeStreamingInstance()
        async with make_streaming(instance, max_queue_delay_microseconds=10**9, preferred_batch_size=(3,)) as batcher:
            async def collect(n: int) -> list[int]:
                return [step async for step in batcher.stream(n)]

            results = await asyncio.gather(collect(1), collect(3), collect(2))
        assert results == [[1], [3, 6, 9], [2, 4]]
        assert [len(b) for b in instance.batches] == [3]
        assert batcher.stats.success.count == 3

    run(scenario())


def test_the_generator_stops_once_every_caller_is_gone() -> None:
    async def scenario() -> None:
        instance = FakeStreamingInstance()
        async with make_streaming(instance) as batcher:
            stream = batcher.stream(1000)
            first = await stream.__anext__()
            await stream.aclose()
            await until(lambda: batcher.executing == 0)
        assert first == 1000
        assert instance.steps_run < 1000

    run(scenario())


def test_a_stream_left_while_queued_leaves_the_queue() -> None:
    async def scenario() -> None:
        instance = FakeStreamingInstance()
        async with make_streaming(instance, max_queue_delay_microseconds=10**9) as batcher:
            async def consume() -> list[int]:
                return [step async for step in batcher.stream(2)]

            reader = asyncio.ensure_future(consume())
            await until(lambda: batcher.queue_depth == 1)
            reader.cancel()
            await until(reader.done)
            assert batcher.queue_depth == 0
        assert instance.batches == []
        assert batcher.stats.failures_by_reason["CANCELED"] == 1

    run(scenario())


def test_preserve_ordering_holds_a_later_response_until_earlier_ones_are_answered() -> None:
    async def scenario(preserve: bool) -> tuple[bool, list[int]]:
        gate = asyncio.Event()
        slow, fast = FakeInstance("slow", gate=gate), FakeInstance("fast")
        async with make([slow, fast], max_batch_size=1, preserve_ordering=preserve) as batcher:
            first = asyncio.ensure_future(batcher.infer(1))
            await until(lambda: len(slow.batches) == 1)  # the first idle instance waits at the gate
            second = asyncio.ensure_future(batcher.infer(2))
            await until(lambda: len(fast.batches) == 1 and batcher.executing == 1)  # the other ran it
            await settle()
            second_early = second.done()
            gate.set()
            return second_early, list(await asyncio.gather(first, second))

    assert run(scenario(False)) == (True, [2, 4])
    assert run(scenario(True)) == (False, [2, 4])


def test_submit_with_on_answer_calls_it_once_per_request_from_the_batch() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate, poison=None)
        answers: list[tuple[Any, Any]] = []
        seen_when_next_batch_formed: list[int] = []
        original = instance.run_batch

        async def recording_run_batch(items: Sequence[Any]) -> Outcome:
            seen_when_next_batch_formed.append(len(answers))
            return await original(items)

        instance.run_batch = recording_run_batch  # type: ignore[method-assign]
        async with make([instance], max_batch_size=4, max_queue_delay_microseconds=0) as batcher:
            first = batcher.submit(1, None, lambda result, error: answers.append((result, error)))
            await until(lambda: len(instance.batches) == 1)  # running, held at the gate
            for item in (2, 3):
                batcher.submit(item, None, lambda result, error: answers.append((result, error)))
            gate.set()
            await until(lambda: len(answers) == 3)
            await settle()  # and no more
        assert answers == [(2, None), (4, None), (6, None)]
        assert first.answer.done()
        # Pipelined: the second batch was handed to the instance before the first one's
        # answer went out (answering never delays the next batch).
        assert seen_when_next_batch_formed == [0, 0]

    run(scenario())


def test_submit_with_on_answer_reports_errors_and_withdrawal() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate, poison=99)
        answers: dict[int, tuple[Any, Any]] = {}

        def on(item: int) -> Any:
            return lambda result, error: answers.setdefault(item, (result, error))

        async with make([instance], max_batch_size=4, max_queue_delay_microseconds=0) as batcher:
            batcher.submit(0, None, on(0))
            await until(lambda: len(instance.batches) == 1)
            withdrawn = batcher.submit(5, None, on(5))
            batcher.submit(99, None, on(99))
            withdrawn.withdraw()
            withdrawn.withdraw()  # twice: still answered once
            gate.set()
            await until(lambda: len(answers) == 3)
        assert answers[0] == (0, None)
        assert answers[5][0] is None and isinstance(answers[5][1], asyncio.CancelledError)
        assert answers[99][0] is None and isinstance(answers[99][1], ModelExecutionError)
        assert all(5 not in batch for batch in instance.batches)
        assert batcher.stats.failures_by_reason["CANCELED"] == 1
        assert batcher.stats.failures_by_reason["BACKEND"] == 1

    run(scenario())


def test_a_failing_on_answer_does_not_stop_its_batch_mates(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[list[Any], list[list[Any]]]:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        answers: list[Any] = []

        def broken(result: Any, error: Any) -> None:
            raise RuntimeError("the client's reply failed")

        async with make([instance], max_batch_size=4, max_queue_delay_microseconds=0) as batcher:
            running = batcher.infer(0)
            held = asyncio.ensure_future(running)
            await until(lambda: len(instance.batches) == 1)  # at the gate: the next four queue
            batcher.submit(1, None, broken)
            for item in (2, 3, 4):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            gate.set()
            await held
            await until(lambda: len(answers) == 3)
            answers.append(await batcher.infer(5))  # the batcher still serves
        return answers, instance.batches

    answers, batches = run(scenario())
    assert answers == [4, 6, 8, 10]
    assert batches[1] == [1, 2, 3, 4]
    assert "answering a request failed" in caplog.text


def test_the_default_clock_is_real_time_called_with_nothing_in_between() -> None:
    async def scenario() -> None:
        batcher = DynamicBatcher(
            model_name="m", max_batch_size=8, dynamic_batching=DynamicBatching(), instances=[FakeInstance()],
            stats=ModelStats("m", 1),
        )
        assert batcher._clock is time.monotonic_ns is SYSTEM_CLOCK.monotonic_ns
        async with batcher:
            # Timeouts and queue delays are scheduled with the loop's own call_at.
            assert batcher._call_at == asyncio.get_running_loop().call_at
            assert await batcher.infer(4) == 8

    run(scenario())


@dataclass
class QueueingInstance:
    """Like an instance thread: takes batches at any time (``queues_batches``) and runs
    them one after the other. Each batch runs until the test releases it
    (``release()``); ``handed`` and ``began`` record the clock when a batch was handed
    over and when it began to run."""

    clock: ManualClock
    name: str = "queueing_0"
    capacity: int = 1
    queues_batches: bool = True
    problem: str | None = None
    enforces_timeout: bool = False
    handed: list[tuple[int, list[Any]]] = field(default_factory=list)
    began: list[int] = field(default_factory=list)
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    _gates: list[asyncio.Event] = field(default_factory=list)

    @property
    def cost_function(self) -> None:
        return None

    def release(self, index: int) -> None:
        self._gates[index].set()

    async def run_batch(self, items: Sequence[Any]) -> Outcome:
        self.handed.append((self.clock.monotonic_ns(), list(items)))
        gate = asyncio.Event()
        self._gates.append(gate)
        async with self._turn:
            self.began.append(self.clock.monotonic_ns())
            await gate.wait()
        return Outcome([item * 2 for item in items], None)


def test_a_full_batch_is_handed_to_the_instance_while_the_current_one_runs_and_starts_when_it_returns() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock)
        answers: list[Any] = []
        async with make([instance], max_batch_size=4, clock=clock, max_queue_delay_microseconds=0) as batcher:
            for item in range(4):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            await until(lambda: len(instance.began) == 1)  # batch 1 runs
            clock.advance(10_000_000)
            for item in range(4, 8):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            # a full batch queued: formed and handed over now, while batch 1 still runs
            await until(lambda: len(instance.handed) == 2)
            assert instance.handed[1] == (clock.monotonic_ns(), [4, 5, 6, 7])
            assert instance.began == [clock.monotonic_ns() - 10_000_000]
            assert batcher.queue_depth == 4  # handed over, not begun: they still wait
            clock.advance(40_000_000)
            instance.release(0)
            # batch 2 begins as batch 1 returns: no time passes in between
            await until(lambda: len(instance.began) == 2)
            assert instance.began[1] == clock.monotonic_ns()
            assert batcher.queue_depth == 0
            await until(lambda: len(answers) == 4)
            clock.advance(50_000_000)
            instance.release(1)
            await until(lambda: len(answers) == 8)
        assert sorted(answers) == [item * 2 for item in range(8)]
        assert batcher.stats.idle_between.as_json() == {"count": 1, "ns": 0}
        assert batcher.stats.busy.as_json() == {"count": 2, "ns": 100_000_000}  # 50 ms each, back to back

    run(scenario())


def test_a_partial_batch_waits_for_the_running_one_to_return_and_takes_what_arrived_meanwhile() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock)
        async with make([instance], max_batch_size=4, clock=clock, max_queue_delay_microseconds=0) as batcher:
            for item in range(4):
                batcher.submit(item, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 1)
            batcher.submit(4, None, lambda result, error: None)
            await settle()
            assert len(instance.handed) == 1  # not full: it could still grow
            batcher.submit(5, None, lambda result, error: None)
            instance.release(0)
            await until(lambda: len(instance.began) == 2)
            assert instance.handed[1][1] == [4, 5]
            instance.release(1)

    run(scenario())


def test_the_returned_batch_is_answered_after_the_next_one_is_handed_to_the_instance() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock, queues_batches=False)
        answered_when_handed: list[int] = []
        answers: list[Any] = []
        original = instance.run_batch

        async def recording(items: Sequence[Any]) -> Outcome:
            answered_when_handed.append(len(answers))
            return await original(items)

        instance.run_batch = recording  # type: ignore[method-assign]
        async with make([instance], max_batch_size=2, clock=clock, max_queue_delay_microseconds=0) as batcher:
            for item in range(2):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            await until(lambda: len(instance.began) == 1)
            for item in range(2, 4):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            await settle()
            assert len(instance.handed) == 1  # this instance takes a batch only when idle
            clock.advance(5_000_000)
            instance.release(0)
            await until(lambda: len(answers) == 2 and len(instance.began) == 2)
            instance.release(1)
            await until(lambda: len(answers) == 4)
        assert answered_when_handed == [0, 0]  # batch 2 was handed over before batch 1's answers
        assert batcher.stats.idle_between.as_json() == {"count": 1, "ns": 0}
        assert batcher.stats.answer.count == 2 and batcher.stats.formation.count == 2

    run(scenario())


def test_a_partial_batch_is_handed_over_once_the_running_one_is_about_to_end() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock)
        async with make([instance], max_batch_size=8, clock=clock, max_queue_delay_microseconds=0) as batcher:
            batcher.submit(0, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 1)
            clock.advance(50_000_000)  # batches take 50 ms
            instance.release(0)
            await until(lambda: batcher.executing == 0)
            batcher.submit(1, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 2)
            batcher.submit(2, None, lambda result, error: None)
            clock.advance(44_999_999)
            await settle()
            assert len(instance.handed) == 2  # not full, and batch 2 is not about to end yet
            clock.advance(1)  # 5 ms (a tenth) before batch 2 is expected to end
            await until(lambda: len(instance.handed) == 3)
            assert instance.handed[2] == (clock.monotonic_ns(), [2])
            batcher.submit(3, None, lambda result, error: None)  # too late for batch 3
            clock.advance(5_000_000)
            instance.release(1)
            await until(lambda: len(instance.began) == 3)
            assert instance.began[2] == clock.monotonic_ns()  # at once
            instance.release(2)
            await until(lambda: len(instance.began) == 4)
            assert instance.handed[3][1] == [3]
            instance.release(3)
        assert batcher.stats.idle_between.as_json() == {"count": 2, "ns": 0}

    run(scenario())


def test_late_a_partial_batch_smaller_than_the_running_one_waits_until_arrivals_pause() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock)
        async with make([instance], max_batch_size=8, clock=clock, max_queue_delay_microseconds=0) as batcher:
            for item in (0, 1):
                batcher.submit(item, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 1)
            clock.advance(50_000_000)
            instance.release(0)  # batches of 2 take 50 ms: the next one is due 5 ms before its end
            await until(lambda: batcher.executing == 0)
            for item in (2, 3):
                batcher.submit(item, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 2)
            clock.advance(44_000_000)
            batcher.submit(4, None, lambda result, error: None)
            clock.advance(2_000_000)  # past the due point, but request 4 came 2 ms ago
            await settle()
            assert len(instance.handed) == 2  # one queued, two running: more may still come
            clock.advance(3_000_000)  # 5 ms without an arrival
            await until(lambda: len(instance.handed) == 3)
            assert instance.handed[2] == (clock.monotonic_ns(), [4])
            batcher.submit(5, None, lambda result, error: None)
            instance.release(1)
            await until(lambda: len(instance.began) == 3)
            instance.release(2)
            await until(lambda: len(instance.began) == 4)
            assert instance.handed[3][1] == [5]
            instance.release(3)

    run(scenario())


def test_requests_handed_over_ahead_of_time_still_count_against_max_queue_size() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = QueueingInstance(clock)
        policy = QueuePolicy(max_queue_size=1)
        async with make([instance], max_batch_size=1, clock=clock, max_queue_delay_microseconds=0,
                        default_queue_policy=policy) as batcher:
            batcher.submit(0, None, lambda result, error: None)
            await until(lambda: len(instance.began) == 1)
            batcher.submit(1, None, lambda result, error: None)  # a full batch: handed over at once
            await until(lambda: len(instance.handed) == 2)
            with pytest.raises(QueueFullError):
                batcher.submit(2, None, lambda result, error: None)
            instance.release(0)
            await until(lambda: len(instance.began) == 2)
            batcher.submit(3, None, lambda result, error: None)  # batch 2 began: room again
            instance.release(1)
            await until(lambda: len(instance.began) == 3)
            instance.release(2)

    run(scenario())


def test_with_several_slots_a_partial_batch_waits_for_the_first_free_one() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        a, b = QueueingInstance(clock, name="a"), QueueingInstance(clock, name="b")
        async with make([a, b], max_batch_size=8, clock=clock, max_queue_delay_microseconds=0) as batcher:
            for round_ in range(2):  # batches of one request take 50 ms on each instance
                for started, item in enumerate((2 * round_, 2 * round_ + 1), start=2 * round_ + 1):
                    batcher.submit(item, None, lambda result, error: None)
                    await until(lambda: len(a.began) + len(b.began) == started)
                if round_ == 0:
                    clock.advance(50_000_000)
                    a.release(0)
                    b.release(0)
                    await until(lambda: batcher.executing == 0)
            batcher.submit(4, None, lambda result, error: None)
            clock.advance(49_000_000)  # both about to end
            await settle()
            assert len(a.handed) + len(b.handed) == 4 and batcher.queue_depth == 1  # not handed early
            a.release(1)
            await until(lambda: len(a.began) == 3)
            assert a.handed[2][1] == [4]
            a.release(2)
            b.release(1)

    run(scenario())


class RecordedAnswer:
    """An Answer (pending.py) that records how it was answered."""

    def __init__(self) -> None:
        self.outcome: tuple[str, Any] | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def set_result(self, outputs: Any) -> None:
        if self.outcome is None:
            self.outcome = ("result", outputs)

    def set_exception(self, error: BaseException) -> None:
        if self.outcome is None:
            self.outcome = ("error", error)

    def cancel(self) -> None:
        if self.outcome is None:
            self.outcome = ("cancelled", None)


def test_submit_many_queues_each_payload_and_answers_it_through_its_own_answer() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        async with make([instance], max_batch_size=8, max_queue_delay_microseconds=0) as batcher:
            batcher.submit(0, None, lambda result, error: None)
            await until(lambda: len(instance.batches) == 1)  # running, held at the gate
            answers = [RecordedAnswer() for _ in range(4)]
            pendings = batcher.submit_many([1, 2, 3, 4], [10, 11, 12, 13], answers)
            assert batcher.queue_depth == 4
            pendings[2].withdraw()  # type: ignore[union-attr]  # each one its own entry
            gate.set()
            await until(lambda: all(answer.done() for answer in answers))
        assert [answer.outcome for answer in answers] == [("result", 2), ("result", 4), ("cancelled", None), ("result", 8)]
        assert instance.batches[1] == [1, 2, 4]  # the rest of them, in one batch
        assert batcher.stats.failures_by_reason["CANCELED"] == 1

    run(scenario())


def test_submit_many_refuses_what_the_queue_has_no_room_for() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        policy = QueuePolicy(max_queue_size=2)
        async with make([instance], max_batch_size=1, default_queue_policy=policy) as batcher:
            batcher.submit(0, None, lambda result, error: None)
            await until(lambda: len(instance.batches) == 1)
            answers = [RecordedAnswer() for _ in range(3)]
            admitted = batcher.submit_many([1, 2, 3], [0, 0, 0], answers)
            assert isinstance(admitted[2], QueueFullError) and str(admitted[2]) == "Exceeds maximum queue size"
            assert batcher.stats.failures_by_reason["REJECTED"] == 1
            gate.set()
            await until(lambda: answers[0].done() and answers[1].done())
        assert [answer.outcome for answer in answers] == [("result", 2), ("result", 4), None]

    run(scenario())


def test_submit_many_times_out_each_request_under_its_timeout() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        gate = asyncio.Event()
        instance = FakeInstance(gate=gate)
        policy = QueuePolicy(default_timeout_microseconds=100)
        async with make([instance], max_batch_size=1, clock=clock, default_queue_policy=policy) as batcher:
            batcher.submit(0, None, lambda result, error: None)
            await until(lambda: len(instance.batches) == 1)
            answers = [RecordedAnswer() for _ in range(2)]
            batcher.submit_many([1, 2], [0, 0], answers)
            clock.advance(200_000)
            await until(lambda: all(answer.done() for answer in answers))
            gate.set()
        assert all(isinstance(answer.outcome[1], RequestTimeoutError) for answer in answers)  # type: ignore[index]
        assert batcher.stats.failures_by_reason["REJECTED"] == 2

    run(scenario())


def test_submit_many_after_close_is_unavailable() -> None:
    async def scenario() -> None:
        batcher = make([FakeInstance()])
        async with batcher:
            pass
        with pytest.raises(UnavailableError, match="not accepting requests"):
            batcher.submit_many([1], [0], [RecordedAnswer()])

    run(scenario())


@dataclass
class FutureInstance:
    """Like a process instance: ``run_batch`` hands the batch over at once and returns a
    future, set when the test says (``finish``), so two batches can come back in one turn
    of the loop, as two replies read off one pipe do."""

    name: str = "futures_0"
    capacity: int = 1
    queues_batches: bool = True
    problem: str | None = None
    enforces_timeout: bool = False
    handed: list[list[Any]] = field(default_factory=list)
    futures: list[asyncio.Future[Outcome]] = field(default_factory=list)

    @property
    def cost_function(self) -> None:
        return None

    def run_batch(self, items: Sequence[Any]) -> asyncio.Future[Outcome]:
        self.handed.append(list(items))
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    def finish(self, index: int) -> None:
        self.futures[index].set_result(Outcome([item * 2 for item in self.handed[index]], None))


def test_batches_that_return_in_one_turn_are_answered_in_the_order_they_ran() -> None:
    """One instance runs its batches in order, so its answers go out in that order, even
    when the next batch's result is there already as the one before is answered (an
    ensemble's decoupled step relies on it: each response's next step follows the one
    before)."""
    async def scenario() -> None:
        instance = FutureInstance()
        answers: list[Any] = []
        async with make([instance], max_batch_size=2, max_queue_delay_microseconds=0) as batcher:  # type: ignore[list-item]
            for item in range(4):
                batcher.submit(item, None, lambda result, error: answers.append(result))
            await until(lambda: len(instance.handed) == 2)  # the second batch handed over while the first runs
            instance.finish(0)
            instance.finish(1)
            await until(lambda: len(answers) == 4)
        assert answers == [0, 2, 4, 6]

    run(scenario())


# -- bundles: several alike requests of one caller as one queue entry ------------------------


@dataclass
class BundleAnswerSpy:
    """A BundleAnswer that records its answer; its requests are a payload's items."""

    received: list[int]
    outcome: list[Any] = field(default_factory=list)

    def done(self) -> bool:
        return bool(self.outcome)

    def set_result(self, outputs: Any) -> None:
        self.outcome.append(("result", list(outputs)))

    def set_exception(self, error: BaseException) -> None:
        self.outcome.append(("error", type(error).__name__))

    def cancel(self) -> None:
        self.set_exception(asyncio.CancelledError())

    def parts(self, payload: Any) -> list[tuple[Any, int, Any]]:
        raise AssertionError("no batch fails here")


def _bundling(instance: FakeInstance, clock: ManualClock, **batching: Any) -> DynamicBatcher:
    """A batcher whose payloads are lists of items, one item a row (``bundles`` on)."""
    return StoppingBatcher(model_name="m", max_batch_size=8, dynamic_batching=DynamicBatching(**batching),
                           instances=[instance], stats=ModelStats("m", 1), clock=clock, cost_of=len, rows_of=len,
                           bundles=True)


class ListInstance(FakeInstance):
    """Doubles every item of every payload (a list): the batch's outputs, one list each."""

    async def run_batch(self, items: Sequence[Any]) -> Outcome:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        await next_turn()
        return Outcome([[item * 2 for item in payload] for payload in items], None)


def test_a_bundle_waits_as_one_entry_and_is_counted_as_the_requests_it_stands_for() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = ListInstance()
        async with _bundling(instance, clock, max_queue_delay_microseconds=1000) as batcher:
            answer = BundleAnswerSpy([0, 0, 0])
            bundle = batcher.submit_bundle([1, 2, 3], 3, 0, answer)
            assert bundle.count == 3 and batcher.queue_depth == 3
            pending = batcher.submit([4], None, lambda outputs, error: None)
            assert batcher.queue_depth == 4
            clock.advance(1_000_000)
            await until(lambda: bool(answer.outcome))
        assert answer.outcome == [("result", [2, 4, 6])]
        assert instance.batches == [[[1, 2, 3], [4]]] and pending.answer.done()
        stats = batcher.stats
        assert (stats.success.count, stats.inference_count, stats.queue.count) == (4, 4, 4)
        assert sum(stats.queue_buckets) == 4

    run(scenario())


def test_a_request_that_leaves_a_waiting_bundle_is_canceled_and_the_rest_run_without_it() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        instance = ListInstance()
        async with _bundling(instance, clock, max_queue_delay_microseconds=1000) as batcher:
            answer = BundleAnswerSpy([10, 20, 30])
            bundle = batcher.submit_bundle([1, 2, 3], 3, 20, answer)
            assert batcher.withdraw_part(bundle, [1, 3], 20)
            assert (bundle.count, bundle.cost, batcher.queue_depth) == (2, 2, 2)
            assert batcher.stats.failures_by_reason["CANCELED"] == 1
            clock.advance(1_000_000)
            await until(lambda: bool(answer.outcome))
            assert not batcher.withdraw_part(bundle, [1], 10)  # taken: nothing changes
        assert answer.outcome == [("result", [2, 6])] and instance.batches == [[[1, 3]]]
        stats = batcher.stats
        assert (stats.success.count, stats.fail.count, stats.inference_count) == (2, 1, 2)

    run(scenario())


def test_a_bundle_that_times_out_fails_as_each_of_its_requests() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        gate = asyncio.Event()
        instance = ListInstance(gate=gate)
        policy = QueuePolicy(default_timeout_microseconds=100)
        async with _bundling(instance, clock, max_queue_delay_microseconds=10**9,
                             default_queue_policy=policy) as batcher:
            answer = BundleAnswerSpy([0, 0])
            batcher.submit_bundle([1, 2], 2, 0, answer)
            clock.advance(200_000)
            await until(lambda: bool(answer.outcome))
        assert answer.outcome == [("error", "RequestTimeoutError")]
        assert batcher.stats.failures_by_reason["REJECTED"] == batcher.stats.fail.count == 2

    run(scenario())
