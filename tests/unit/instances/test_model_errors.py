"""nereid.instances.model_errors: what model code raises, as the loop and batcher handle it."""

from __future__ import annotations

import asyncio

import pytest

from nereid.instances.model_errors import ModelBaseException, as_exception, cancelled_by_loop, model_exception
from tests.unit.manual_clock import next_turn


def test_a_base_exception_is_carried_as_an_exception_named_like_it() -> None:
    try:
        raise SystemExit(9)
    except SystemExit as exc:
        carried = as_exception(exc)
    assert isinstance(carried, ModelBaseException) and isinstance(carried, Exception)
    assert type(carried).__name__ == "SystemExit" and carried.args == (9,)
    assert carried.__cause__ is not None and carried.__traceback__ is not None


def test_one_carrier_class_per_base_exception_class() -> None:
    assert type(as_exception(KeyboardInterrupt())) is type(as_exception(KeyboardInterrupt("again")))
    assert type(as_exception(KeyboardInterrupt())) is not type(as_exception(GeneratorExit()))


def test_an_exception_from_a_process_is_stood_for_by_its_type_name() -> None:
    error = model_exception("ZeroDivisionError", "division by zero")
    assert type(error).__name__ == "ZeroDivisionError" and str(error) == "division by zero"
    assert type(error) is type(model_exception("ZeroDivisionError", "again"))


def test_a_cancelled_error_of_the_model_is_not_the_loops() -> None:
    async def model_raises() -> bool:
        return cancelled_by_loop(asyncio.CancelledError())

    assert asyncio.run(model_raises()) is False
    assert cancelled_by_loop(ValueError()) is False


def test_the_loop_cancelling_the_task_goes_on_up() -> None:
    async def main() -> bool:
        seen: list[bool] = []

        async def model_code() -> None:
            try:
                await asyncio.Event().wait()  # never set: only the cancel below ends it
            except asyncio.CancelledError as exc:
                seen.append(cancelled_by_loop(exc))
                raise

        task = asyncio.create_task(model_code())
        await next_turn()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen[0]

    assert asyncio.run(main()) is True
