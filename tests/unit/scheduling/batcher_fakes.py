"""What the DynamicBatcher tests (test_batcher.py, test_batcher_lifecycle.py) run it on:
a fake instance that records the batches it gets, and ``make`` to build a batcher over
such instances on a ManualClock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Sequence

from nereid.config.schema import DynamicBatching
from nereid.errors import ModelExecutionError, NereidError
from nereid.scheduling.batcher import DynamicBatcher
from nereid.stats import ModelStats
from tests.unit.manual_clock import ManualClock, next_turn


@dataclass(frozen=True)
class Outcome:
    outputs: list[Any] | None
    error: NereidError | None
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    began_ns: int = 0
    ended_ns: int = 0


@dataclass
class FakeInstance:
    """Doubles every item; fails any batch holding an item equal to ``poison``."""

    name: str = "fake_0"
    capacity: int = 1
    problem: str | None = None
    enforces_timeout: bool = False
    queues_batches: bool = False
    poison: Any = None
    gate: asyncio.Event | None = None
    batches: list[list[Any]] = field(default_factory=list)

    @property
    def cost_function(self) -> None:
        return None

    async def run_batch(self, items: Sequence[Any]) -> Outcome:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        await next_turn()
        if self.poison is not None and self.poison in items:
            return Outcome(None, ModelExecutionError(f"model raised on {self.poison}"))
        return Outcome([item * 2 for item in items], None)


class StoppingBatcher(DynamicBatcher):
    """A check failing inside ``async with`` stops the batcher at once instead of draining
    it: an instance held at a gate would keep the drain, and so the test, waiting."""

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        await self.aclose(drain_timeout=0 if exc_type is not None else None)


def make(
    instances: list[FakeInstance], max_batch_size: int = 8, clock: ManualClock | None = None, **batching: Any
) -> DynamicBatcher:
    return StoppingBatcher(
        model_name="m",
        max_batch_size=max_batch_size,
        dynamic_batching=DynamicBatching(**batching),
        instances=instances,
        stats=ModelStats("m", 1),
        clock=clock or ManualClock(),
    )


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))
