"""``nereid.batch``: the decorator, used from plain Python without a server."""

from __future__ import annotations

import asyncio
import threading

import pytest

import nereid


def call_in_threads(fn, items):  # type: ignore[no-untyped-def]
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fn(i))) for i in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[i] for i in items]


def test_sync_callers_block_and_get_their_own_result() -> None:
    @nereid.batch(max_batch_size=4, max_queue_delay_microseconds=50_000)
    def square(xs: list[int]) -> list[int]:
        return [x * x for x in xs]

    assert call_in_threads(square, list(range(8))) == [x * x for x in range(8)]
    stats = square.stats
    assert stats["calls"] == 8
    assert sum(size * count for size, count in stats["batch_sizes"].items()) == 8
    assert max(stats["batch_sizes"]) <= 4
    square.close()


def test_async_function_is_awaited_and_batches_concurrent_callers() -> None:
    @nereid.batch(max_batch_size=16, max_queue_delay_microseconds=50_000)
    async def plus_one(xs: list[int]) -> list[int]:
        return [x + 1 for x in xs]

    async def main() -> list[int]:
        return list(await asyncio.gather(*(plus_one(i) for i in range(10))))

    assert asyncio.run(main()) == list(range(1, 11))
    assert plus_one.stats["batch_sizes"] == {10: 1}
    plus_one.close()


def test_decorated_method_has_one_batcher_per_object() -> None:
    class Embedder:
        def __init__(self, scale: int) -> None:
            self.scale = scale

        @nereid.batch(max_batch_size=8)
        def embed(self, xs: list[int]) -> list[int]:
            return [x * self.scale for x in xs]

    a, b = Embedder(2), Embedder(3)
    assert a.embed(5) == 10
    assert b.embed(5) == 15
    assert a.embed.stats["calls"] == 1


def test_the_users_exception_reaches_only_the_failing_caller() -> None:
    @nereid.batch(max_batch_size=8, max_queue_delay_microseconds=50_000)
    def checked(xs: list[int]) -> list[int]:
        if 3 in xs:
            raise ValueError("three is not allowed")
        return xs

    results: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            results[i] = checked(i)
        except ValueError as exc:
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results[3], ValueError) and str(results[3]) == "three is not allowed"
    assert [results[i] for i in (0, 1, 2, 4, 5)] == [0, 1, 2, 4, 5]
    checked.close()


def test_a_result_list_of_the_wrong_length_fails_the_batch_with_a_clear_error() -> None:
    @nereid.batch(max_batch_size=4)
    def broken(xs: list[int]) -> list[int]:
        return xs[:-1]

    with pytest.raises(nereid.ModelExecutionError, match=r"expected a list of 1 results \(one per item\), got list of length 0"):
        broken(1)
    broken.close()


def test_batch_size_function_bounds_the_batch_by_cost() -> None:
    @nereid.batch(max_batch_size=10, max_queue_delay_microseconds=50_000, batch_size=len)
    def lengths(xs: list[str]) -> list[int]:
        return [len(x) for x in xs]

    words = ["aaaa", "bbbb", "cccc", "dd"]
    assert call_in_threads(lambda i: lengths(words[i]), range(4)) == [4, 4, 4, 2]
    with pytest.raises(ValueError, match="more than max_batch_size 10"):
        lengths("x" * 11)
    lengths.close()


def test_set_max_queue_delay_changes_it_at_run_time() -> None:
    @nereid.batch(max_batch_size=4, max_queue_delay_microseconds=10**9)
    def ident(xs: list[int]) -> list[int]:
        return xs

    ident.set_max_queue_delay(0)
    # With the old delay this call would wait 1000 s and the per-test timeout would fail it.
    assert ident(1) == 1
    ident.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"max_batch_size": 0}, "max_batch_size: expected an integer >= 1, got 0", id="zero-batch"),
        pytest.param({"max_queue_delay_microseconds": -1}, "max_queue_delay_microseconds: expected an integer >= 0, got -1", id="negative-delay"),
        pytest.param({"preferred_batch_size": [9], "max_batch_size": 8}, r"preferred_batch_size: expected sizes in 1..8 \(max_batch_size\), got 9", id="preferred-too-big"),
    ],
)
def test_bad_decorator_arguments_fail_at_decoration(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nereid.batch(**kwargs)(lambda xs: xs)  # type: ignore[arg-type]
