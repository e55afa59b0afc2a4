"""nereid.scheduling.pending: how a request's answer comes back (a Future, a callback, a
stream), preserve_ordering (InOrder), and how a batch is answered and counted (Answers).
Time is a ManualClock: statistics read exact durations."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from nereid.errors import ModelExecutionError, NereidError, RequestTimeoutError
from nereid.inference import ComputeTotals, InferRequest
from nereid.scheduling.pending import Answers, CallbackAnswer, InOrder, Pending, Stream, answer_now, awaited
from nereid.stats import ModelStats
from tests.unit.manual_clock import ManualClock, next_turn


class _Withdrawals:
    def __init__(self) -> None:
        self.withdrawn: list[Pending] = []

    def withdraw(self, pending: Pending) -> None:
        self.withdrawn.append(pending)


def pending(answer: Any, request: Any = "r", *, received_ns: int = 0, enqueued_ns: int = 0,
            batcher: Any = None) -> Pending:
    return Pending(1, None, 0, enqueued_ns, 0, request, received_ns, answer, batcher or _Withdrawals())


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


# -- CallbackAnswer --------------------------------------------------------------------


def test_a_callback_answer_is_called_once_with_the_first_outcome() -> None:
    calls: list[tuple[Any, Any]] = []
    answer = CallbackAnswer(lambda outputs, error: calls.append((outputs, error)))
    assert not answer.done()
    answer.set_result("out")
    answer.set_exception(RequestTimeoutError("late"))
    answer.cancel()
    assert calls == [("out", None)] and answer.done()


def test_a_withdrawn_callback_answer_gets_a_cancelled_error() -> None:
    calls: list[Any] = []
    answer = CallbackAnswer(lambda outputs, error: calls.append(error))
    answer.cancel()
    assert len(calls) == 1 and isinstance(calls[0], asyncio.CancelledError)


def test_a_failing_callback_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken(outputs: Any, error: Any) -> None:
        raise RuntimeError("client gone")

    with caplog.at_level(logging.ERROR, logger="nereid"):
        CallbackAnswer(broken).set_result("out")
    assert "answering a request failed" in caplog.text


def test_withdrawing_a_pending_asks_its_batcher() -> None:
    batcher = _Withdrawals()
    record = pending(CallbackAnswer(lambda outputs, error: None), batcher=batcher)
    record.withdraw()
    assert batcher.withdrawn == [record]


# -- awaited (the batchers' infer) -------------------------------------------------------


def test_an_awaited_answer_is_its_futures_result_and_leaves_the_request_alone() -> None:
    async def scenario() -> tuple[Any, list[Pending]]:
        batcher = _Withdrawals()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        record = pending(future, batcher=batcher)
        asyncio.get_running_loop().call_soon(future.set_result, "out")
        return await awaited(future, record), batcher.withdrawn

    assert run(scenario()) == ("out", [])


def test_a_caller_cancelled_while_awaiting_withdraws_its_request() -> None:
    async def scenario() -> tuple[bool, list[Pending], Pending]:
        batcher = _Withdrawals()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        record = pending(future, batcher=batcher)
        caller = asyncio.ensure_future(awaited(future, record))
        await next_turn()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return caller.cancelled(), batcher.withdrawn, record

    cancelled, withdrawn, record = run(scenario())
    assert cancelled and withdrawn == [record]


# -- Stream ------------------------------------------------------------------------------


def test_a_stream_yields_its_steps_then_its_last_one() -> None:
    async def scenario() -> list[Any]:
        stream = Stream()
        stream.put(1)
        stream.put(2)
        stream.set_result(3)
        stream.put(4)  # after the end: dropped
        return [step async for step in stream]

    assert run(scenario()) == [1, 2, 3]


def test_a_stream_that_fails_raises_to_its_reader_after_its_steps() -> None:
    async def scenario() -> list[Any]:
        stream = Stream()
        stream.put(1)
        stream.set_exception(ModelExecutionError("boom"))
        got = []
        with pytest.raises(ModelExecutionError, match="boom"):
            async for step in stream:
                got.append(step)
        assert stream.done() and not stream.finished
        return got

    assert run(scenario()) == [1]


def test_a_finished_stream_ends_without_a_last_step() -> None:
    async def scenario() -> tuple[list[Any], bool]:
        stream = Stream()
        stream.put("a")
        stream.finish()
        return [step async for step in stream], stream.finished

    assert run(scenario()) == (["a"], True)


# -- answer_now and InOrder ------------------------------------------------------------------


def test_answer_now_leaves_an_answered_request_alone() -> None:
    async def scenario() -> None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer_now(future, True, 1)
        answer_now(future, False, RequestTimeoutError("late"))
        assert future.result() == 1

    run(scenario())


def test_in_order_holds_an_answer_until_every_earlier_request_has_one() -> None:
    answered: list[str] = []
    order = InOrder()
    first, second, third = (pending(CallbackAnswer(lambda o, e, n=n: answered.append(n))) for n in "abc")
    for record in (first, second, third):
        order.track(record)
    order.answer(third, True, None)
    order.answer(second, True, None)
    assert answered == []  # the first is still running
    order.answer(first, True, None)
    assert answered == ["a", "b", "c"]


def test_in_order_does_not_wait_for_a_withdrawn_request() -> None:
    answered: list[str] = []
    order = InOrder()
    first = pending(CallbackAnswer(lambda o, e: answered.append("a")))
    second = pending(CallbackAnswer(lambda o, e: answered.append("b")))
    order.track(first)
    order.track(second)
    first.answer.cancel()  # its client left: it was "answered" with a cancellation
    order.answer(second, True, None)
    assert answered == ["a", "b"]


def test_in_order_answers_streams_at_once() -> None:
    order = InOrder()
    stream = Stream()
    earlier = pending(CallbackAnswer(lambda o, e: None))
    order.track(earlier)
    record = pending(stream)
    order.track(record)
    order.answer(record, False, ModelExecutionError("x"))
    assert stream.done()


# -- Answers ------------------------------------------------------------------------------------


def answers(clock: ManualClock, order: InOrder | None = None) -> Answers:
    return Answers(ModelStats("m", 1), lambda request: 2, order, clock.monotonic_ns)


def test_a_batch_is_counted_then_answered() -> None:
    clock = ManualClock(start_ns=1_000)
    results: list[Any] = []
    answering = answers(clock)
    batch = tuple(pending(CallbackAnswer(lambda o, e: results.append((o, answering.stats.success.count))),
                          received_ns=100, enqueued_ns=200) for _ in range(2))
    answering.batch(batch, 500, ["x", "y"], (10, 20, 30), (400, None, 5))
    stats = answering.stats
    assert results == [("x", 2), ("y", 2)]  # counted before the first answer went out
    assert (stats.execution_count, stats.inference_count) == (1, 4)  # rows_of: 2 per request
    assert stats.success.as_json() == {"count": 2, "ns": 2 * 900}
    assert stats.queue.as_json() == {"count": 2, "ns": 2 * 300}
    assert stats.compute_infer.as_json() == {"count": 2, "ns": 40}
    assert stats.batch_stats[4].compute_output.as_json() == {"count": 1, "ns": 30}
    assert stats.busy.as_json() == {"count": 1, "ns": 400}
    assert stats.idle_between.count == 0 and stats.formation.as_json() == {"count": 1, "ns": 5}
    assert stats.answer.count == 1


def test_an_ensemble_step_request_charges_its_batchs_compute_to_its_ensemble_too() -> None:
    """Triton's secondary statistics aggregator: each successful step request adds the
    compute times its batch charged it; a step request that failed adds nothing."""
    clock = ManualClock(start_ns=1_000)
    answering = answers(clock)
    first, second, failed = ComputeTotals(), ComputeTotals(), ComputeTotals()
    requests = [InferRequest("m", {}, compute_totals=totals) for totals in (first, second, failed)]
    batch = tuple(pending(CallbackAnswer(lambda o, e: None), request) for request in requests)
    answering.batch(batch, 500, ["x", "y", ModelExecutionError("bad row")], (10, 20, 30), None)
    assert (first.input_ns, first.infer_ns, first.output_ns) == (10, 20, 30)
    assert (second.input_ns, second.infer_ns, second.output_ns) == (10, 20, 30)
    assert (failed.input_ns, failed.infer_ns, failed.output_ns) == (0, 0, 0)


def test_a_request_that_failed_alone_fails_and_its_batch_mates_succeed() -> None:
    clock = ManualClock(start_ns=1_000)
    got: list[Any] = []
    answering = answers(clock)
    batch = tuple(pending(CallbackAnswer(lambda o, e: got.append((o, e)))) for _ in range(2))
    error = ModelExecutionError("bad row")
    answering.batch(batch, 0, [error, "ok"], (0, 0, 0), None)
    assert got == [(None, error), ("ok", None)]
    assert answering.stats.failures_by_reason["BACKEND"] == 1 and answering.stats.success.count == 1
    assert answering.stats.busy.count == 0  # a rerun's figures are not counted (scheduling None)


def test_a_failed_batch_fails_every_request_and_counts_the_withdrawn_too() -> None:
    clock = ManualClock(start_ns=1_000)
    errors: list[NereidError] = []
    answering = answers(clock)
    live = pending(CallbackAnswer(lambda o, e: errors.append(e)))
    gone = pending(CallbackAnswer(lambda o, e: None))
    gone.answer.cancel()
    answering.batch_failed((live, gone), ModelExecutionError("boom"), (10, 3, 1))
    assert [e.message for e in errors] == ["boom"]
    assert answering.stats.failures_by_reason["BACKEND"] == 2
    assert answering.stats.idle_between.as_json() == {"count": 1, "ns": 3}


def test_fail_counts_from_when_the_request_was_received() -> None:
    clock = ManualClock(start_ns=5_000)
    answering = answers(clock)
    record = pending(CallbackAnswer(lambda o, e: None), received_ns=1_000)
    answering.fail(record, RequestTimeoutError("Request timeout expired"), "REJECTED")
    answering.fail(record, RequestTimeoutError("again"), "REJECTED")  # answered already: not counted twice
    assert answering.stats.fail.as_json() == {"count": 1, "ns": 4_000}
    assert answering.stats.failures_by_reason["REJECTED"] == 1


def test_fail_keeps_preserve_ordering() -> None:
    clock = ManualClock()
    got: list[str] = []
    order = InOrder()
    answering = answers(clock, order)
    first = pending(CallbackAnswer(lambda o, e: got.append("first")))
    second = pending(CallbackAnswer(lambda o, e: got.append("second")))
    order.track(first)
    order.track(second)
    answering.fail(second, RequestTimeoutError("late"), "REJECTED")
    assert got == []
    answering.batch((first,), 0, ["x"], (0, 0, 0), None)
    assert got == ["first", "second"]
