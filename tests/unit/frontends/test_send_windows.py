"""SendWindows: a stream's writer waits past its window or the link's, and wakes when the
worker gives bytes back, the stream ends, or the worker goes away."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, strategies as st

from nereid.frontends.send_windows import SendWindows
from tests.unit.manual_clock import next_turn


def run(test: Any) -> None:
    asyncio.run(test())


def test_a_writer_waits_past_its_streams_window_until_the_worker_gives_bytes_back() -> None:
    async def test() -> None:
        windows = SendWindows(per_stream=10, whole=100)
        windows.sent(1, 10)
        await windows.wait(1)  # at the window, not past it: goes on
        windows.sent(1, 5)
        writer = asyncio.ensure_future(windows.wait(1))
        await next_turn()
        assert not writer.done()
        windows.returned(1, 4)  # still 11 out
        await next_turn()
        assert not writer.done()
        windows.returned(1, 1)
        await next_turn()
        assert writer.done() and windows.out == {1: 10} and windows.total == 10

    run(test)


def test_a_stream_ended_or_reset_lets_its_bytes_go_and_wakes_its_writer() -> None:
    async def test() -> None:
        windows = SendWindows(per_stream=10, whole=100)
        windows.sent(1, 50)
        writer = asyncio.ensure_future(windows.wait(1))
        await next_turn()
        windows.forget(1)
        await next_turn()
        assert writer.done() and windows.out == {} and windows.total == 0
        windows.returned(1, 50)  # a CREDIT that crossed the reset: ignored
        assert windows.total == 0

    run(test)


def test_slow_streams_that_fill_the_link_hold_others_to_one_part_never_stop_them() -> None:
    async def test() -> None:
        windows = SendWindows(per_stream=10, whole=20)
        for id in (1, 2, 3):
            windows.sent(id, 9)  # 27 out: past the link's 20
        assert windows.blocked(1) and windows.blocked(3)
        assert not windows.blocked(4)  # nothing out: may send one part
        await windows.wait(4)
        windows.sent(4, 30)
        assert windows.blocked(4)
        slow = asyncio.ensure_future(windows.wait(1))
        fast = asyncio.ensure_future(windows.wait(4))
        await next_turn()
        windows.returned(4, 30)  # its client read it all
        await next_turn()
        assert fast.done() and not slow.done()
        windows.returned(2, 9)  # 18 out: under the link's window again
        await next_turn()
        assert slow.done()

    run(test)


def test_a_worker_gone_wakes_every_writer_and_counts_nothing_more() -> None:
    async def test() -> None:
        windows = SendWindows(per_stream=1, whole=1)
        windows.sent(1, 5)
        windows.sent(2, 5)
        writers = [asyncio.ensure_future(windows.wait(id)) for id in (1, 2)]
        await next_turn()
        windows.close()
        await asyncio.gather(*writers)
        windows.sent(3, 5)
        assert windows.total == 0 and not windows.blocked(3)

    run(test)


OPERATIONS = st.lists(st.tuples(st.sampled_from(["sent", "returned", "forget"]), st.integers(1, 4), st.integers(0, 40)),
                      max_size=60)


@given(OPERATIONS)
def test_the_link_total_is_the_sum_of_the_streams_and_a_writer_waits_exactly_while_blocked(operations: list[Any]) -> None:
    async def test() -> None:
        windows = SendWindows(per_stream=16, whole=48)
        writers: dict[int, asyncio.Future[None]] = {}
        for operation, id, size in operations:
            if operation == "sent":
                windows.sent(id, size)
            elif operation == "returned":
                windows.returned(id, size)
            else:
                windows.forget(id)
            for id in range(1, 5):
                if id not in writers or writers[id].done():
                    writers[id] = asyncio.ensure_future(windows.wait(id))
            await next_turn()
            await next_turn()
            assert windows.total == sum(windows.out.values()) and all(out > 0 for out in windows.out.values())
            for id, writer in writers.items():
                assert writer.done() is not windows.blocked(id)
        windows.close()
        await asyncio.gather(*writers.values())

    run(test)
