"""nereid.models.serving: the serving handle the surfaces use. It forwards a request to
its version's batcher with the request's own priority and timeout, follows a reload to
the object that replaced it, refuses once unloaded, and says why no instance can serve."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from nereid.config.schema import DynamicBatching, ModelConfig
from nereid.errors import ModelNotFoundError
from nereid.inference import InferRequest
from nereid.models.serving import ServingModel
from nereid.scheduling.batcher import DynamicBatcher
from nereid.stats import ModelStats
from tests.unit.manual_clock import until


@dataclass
class RecordingBatcher:
    """Stands in for DynamicBatcher: records how it was called."""

    calls: list[tuple[str, Any, Any, dict[str, Any]]] = field(default_factory=list)
    queue_depth: int = 3
    executing: int = 1

    async def infer(self, request: Any, received_ns: Any = None, **options: Any) -> Any:
        self.calls.append(("infer", request, received_ns, options))
        return {"Y": request.model_name}

    def submit(self, request: Any, received_ns: Any, on_answer: Any, **options: Any) -> Any:
        self.calls.append(("submit", request, received_ns, options))
        on_answer({"Y": request.model_name}, None)
        return "ticket"

    async def stream(self, request: Any, received_ns: Any = None, **options: Any) -> Any:
        self.calls.append(("stream", request, received_ns, options))
        for step in range(2):
            yield {"step": step}


@dataclass
class Instance:
    problem: str | None = None


def serving(batcher: Any = None, instances: tuple[Any, ...] = (), version: int = 1) -> ServingModel:
    return ServingModel(name="m", version=version, config=ModelConfig(name="m"), config_json={},
                        stats=ModelStats("m", version), batcher=batcher or RecordingBatcher(),
                        instances=instances, model_class=None)  # type: ignore[arg-type]


def request(priority: int = 0, timeout_us: int | None = None) -> InferRequest:
    return InferRequest(model_name="m", inputs={}, priority=priority, timeout_us=timeout_us)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_infer_passes_the_request_s_own_priority_and_timeout_to_the_batcher() -> None:
    model = serving()
    assert run(model.infer(request(priority=2, timeout_us=500), 123)) == {"Y": "m"}
    assert model.batcher.calls == [("infer", request(2, 500), 123, {"priority": 2, "timeout_us": 500})]  # type: ignore[attr-defined]


def test_submit_and_stream_pass_them_too() -> None:
    async def scenario() -> list[Any]:
        model = serving()
        answered: list[Any] = []
        assert model.submit(request(priority=1), None, lambda outputs, error: answered.append(outputs)) == "ticket"
        steps = [step async for step in model.stream(request(timeout_us=7))]
        assert answered == [{"Y": "m"}]
        return [(name, options) for name, _, _, options in model.batcher.calls] + steps  # type: ignore[attr-defined]

    assert run(scenario()) == [
        ("submit", {"priority": 1, "timeout_us": None}),
        ("stream", {"priority": 0, "timeout_us": 7}),
        {"step": 0}, {"step": 1},
    ]


def test_a_caller_holding_a_reloaded_version_is_served_by_its_successor() -> None:
    old, new = serving(), serving()
    old.retired = True
    old.successor = new
    run(old.infer(request()))
    assert old.batcher.calls == [] and len(new.batcher.calls) == 1  # type: ignore[attr-defined]


def test_an_unloaded_version_refuses_with_triton_s_words() -> None:
    model = serving()
    model.retired = True
    with pytest.raises(ModelNotFoundError, match="Request for unknown model: 'm' has no available versions"):
        run(model.infer(request()))
    with pytest.raises(ModelNotFoundError):
        model.submit(request(), None, lambda outputs, error: None)


def test_metrics_read_the_batcher_s_queue_and_running_batches() -> None:
    model = serving()
    assert (model.queue_depth, model.executing) == (3, 1)


@pytest.mark.parametrize(
    "problems, expected",
    [
        ((), None),
        ((None, "restarting"), None),
        (("restarting", "stuck past execution_timeout_ms"),
         "no instance can serve: restarting; stuck past execution_timeout_ms"),
    ],
    ids=["no-instances", "one-can-serve", "none-can-serve"],
)
def test_problem_says_why_when_no_instance_can_serve(problems: tuple[Any, ...], expected: str | None) -> None:
    assert serving(instances=tuple(Instance(p) for p in problems)).problem == expected


@dataclass
class _Doubling:
    name: str = "doubling_0"
    capacity: int = 1
    cost_function: None = None
    problem: str | None = None
    enforces_timeout: bool = False
    queues_batches: bool = False
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[int] = field(default_factory=list)

    async def run_batch(self, requests: Any) -> Any:
        self.seen.extend(r.priority for r in requests)
        await self.gate.wait()
        return _Outcome([{"Y": r.priority} for r in requests])

    async def run_stream(self, requests: Any, sink: Any, abandoned: Any) -> Any:  # pragma: no cover - not streaming
        raise AssertionError("not a decoupled model")


@dataclass(frozen=True)
class _Outcome:
    outputs: list[Any]
    error: None = None
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    began_ns: int = 0
    ended_ns: int = 0


def test_a_higher_priority_request_goes_first_through_a_real_batcher() -> None:
    async def scenario() -> list[int]:
        instance = _Doubling()
        batcher = DynamicBatcher(model_name="m", max_batch_size=1,
                                 dynamic_batching=DynamicBatching(priority_levels=2, default_priority_level=2),
                                 instances=[instance], stats=ModelStats("m", 1))
        async with batcher:
            model = serving(batcher)
            first = asyncio.ensure_future(model.infer(request(priority=2)))
            await until(lambda: instance.seen)
            low = asyncio.ensure_future(model.infer(request(priority=2)))
            high = asyncio.ensure_future(model.infer(request(priority=1)))
            await until(lambda: batcher.queue_depth == 2)
            instance.gate.set()
            await asyncio.gather(first, low, high)
        return instance.seen

    assert run(scenario()) == [2, 1, 2]
