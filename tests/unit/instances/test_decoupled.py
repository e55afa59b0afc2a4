"""nereid.instances.decoupled: a thread instance runs a decoupled model's batch step by
step (a generator ``infer`` on its thread, an async generator on the loop), each step split
per request and handed to the sink on the loop; the generator is closed once the batch is
abandoned, and what it raises comes back in the outcome."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.unit.instances.test_thread_batches import instance, request

STEPS = """
class Model:
    def infer(self, inputs):
        for step in range(3):
            if (inputs["X"] < 0).any() and step == 1:
                raise ValueError("no negative steps")
            yield {"Y": inputs["X"] + step}
"""

ASYNC_STEPS = STEPS.replace("    def infer(self, inputs):", "    async def infer(self, inputs):")


def _run(tmp_path: Path, model: str, values: tuple[int, ...], abandon: bool = False) -> tuple[Any, list[Any]]:
    """The outcome and the steps of a batch of two requests (the first value, the rest);
    ``abandon``: every request is gone as soon as the first step is out."""
    async def main() -> tuple[Any, list[Any]]:
        running = instance(tmp_path, model)
        await running.start()
        steps: list[Any] = []

        def sink(parts: list[Any], finished: list[bool]) -> None:
            steps.append([part["Y"].ravel().tolist() for part in parts])

        outcome = await running.run_stream([request(*values[:1]), request(*values[1:])], sink, lambda: abandon)
        await running.close()
        return outcome, steps

    return asyncio.run(main())


@pytest.mark.parametrize("model", [STEPS, ASYNC_STEPS], ids=["generator", "async generator"])
def test_each_step_is_split_per_request_and_handed_to_the_sink(tmp_path: Path, model: str) -> None:
    outcome, steps = _run(tmp_path, model, (1, 5, 6))
    assert outcome.error is None
    assert steps == [[[1], [5, 6]], [[2], [6, 7]], [[3], [7, 8]]]


@pytest.mark.parametrize("model", [STEPS, ASYNC_STEPS], ids=["generator", "async generator"])
def test_an_abandoned_batch_closes_the_generator_early(tmp_path: Path, model: str) -> None:
    outcome, steps = _run(tmp_path, model, (1, 2), abandon=True)
    assert outcome.error is None and len(steps) == 1


@pytest.mark.parametrize("model", [STEPS, ASYNC_STEPS], ids=["generator", "async generator"])
def test_a_raise_between_steps_fails_the_batch_and_names_the_model(tmp_path: Path, model: str) -> None:
    outcome, steps = _run(tmp_path, model, (-1, 2))
    assert len(steps) == 1 and outcome.outputs is None
    assert outcome.error.message == 'model "m" raised in infer: ValueError: no negative steps'
