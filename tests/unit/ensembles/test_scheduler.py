"""EnsembleScheduler with fake step models: the dataflow (independent steps run together,
a step runs once its inputs are ready), errors naming the step, statistics, withdrawal,
and why the ensemble cannot serve while a step model is missing or no longer fits."""

from __future__ import annotations

import asyncio
import itertools
import tomllib
from typing import Any

import numpy as np
import pytest

from nereid.config import ModelConfig, parse_model_config
from nereid.ensembles import EnsembleScheduler
from nereid.errors import InvalidInputError, ModelExecutionError, ModelNotFoundError, NereidError
from nereid.inference import ComputeTotals, InferRequest, SequenceFlags
from nereid.stats import ModelStats
from tests.unit.manual_clock import settle

pytestmark = pytest.mark.unit

#: IN -> a -> A, IN -> b -> B, (A, B) -> c -> OUT: a and b can run together
DIAMOND = """
platform = "ensemble"
max_batch_size = 4
[[input]]
name = "IN"
data_type = "FP32"
dims = [-1]
[[output]]
name = "OUT"
data_type = "FP32"
dims = [-1]
[[ensemble_scheduling.step]]
model_name = "c"
input_map = { X = "A", X2 = "B" }
output_map = { Y = "OUT" }
[[ensemble_scheduling.step]]
model_name = "a"
input_map = { X = "IN" }
output_map = { Y = "A" }
[[ensemble_scheduling.step]]
model_name = "b"
input_map = { X = "IN" }
output_map = { Y = "B" }
"""

STEP = """
max_batch_size = 4
[[input]]
name = "X"
data_type = "FP32"
dims = [{dims}]
{extra}
[[output]]
name = "Y"
data_type = "FP32"
dims = [-1]
"""

SECOND_INPUT = '[[input]]\nname = "X2"\ndata_type = "FP32"\ndims = [-1]'


def config(text: str, name: str) -> ModelConfig:
    return parse_model_config(tomllib.loads(text), source=f"{name}/config.toml", folder_name=name)


class FakeStep:
    """A step model: ``Y`` = the sum of its inputs + ``add``; waits at ``gate`` if set."""

    def __init__(self, name: str, add: float, dims: str = "-1", extra: str = "") -> None:
        self.name, self.version, self.add = name, 1, add
        self.config = config(STEP.format(dims=dims, extra=extra), name)
        self.problem: str | None = None
        self.settled = True
        self.started = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.error: NereidError | None = None
        self.requests: list[InferRequest] = []
        self.responses: list[float] = []
        #: the compute_input, compute_infer and compute_output ns its batch charges a request
        self.compute = (0, 0, 0)

    async def infer(self, request: InferRequest, received_ns: int | None = None) -> dict[str, np.ndarray]:
        self.requests.append(request)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        if request.compute_totals is not None:  # what its batcher charges a step request
            request.compute_totals.add(*self.compute)
        return {"Y": sum(request.inputs.values()) + self.add}

    async def stream(self, request: InferRequest, received_ns: int | None = None) -> Any:
        """A decoupled step: one response per ``responses`` entry, ``Y`` = X + entry."""
        self.requests.append(request)
        for add in self.responses:
            yield {"Y": request.inputs["X"] + add}


class Models:
    """The step models by name (the manager's ``get``)."""

    def __init__(self, *steps: FakeStep) -> None:
        self.steps = {step.name: step for step in steps}

    def get(self, name: str, version: int | None = None) -> FakeStep:
        step = self.steps.get(name)
        if step is None:
            raise ModelNotFoundError(f"Request for unknown model: '{name}' is not found", model=name)
        return step


def diamond() -> tuple[EnsembleScheduler, Models, ModelStats]:
    models = Models(FakeStep("a", 1), FakeStep("b", 10), FakeStep("c", 100, extra=SECOND_INPUT))
    stats = ModelStats("ens", 1)
    ticks = itertools.count(0, 1000)
    return EnsembleScheduler(config(DIAMOND, "ens"), models, stats, clock=lambda: next(ticks)), models, stats


def request(*values: float) -> InferRequest:
    return InferRequest("ens", {"IN": np.array([values], dtype=np.float32)}, rows=1, id="r1", priority=2)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_independent_steps_run_together_and_a_step_waits_for_all_its_inputs() -> None:
    async def scenario() -> dict[str, np.ndarray]:
        scheduler, models, _ = diamond()
        a, b, c = models.steps["a"], models.steps["b"], models.steps["c"]
        a.gate, b.gate = asyncio.Event(), asyncio.Event()
        answer = asyncio.ensure_future(scheduler.infer(request(1, 2)))
        await a.started.wait()
        await b.started.wait()  # both running at once, neither answered yet
        a.gate.set()
        await settle()  # A's answer has every chance to reach C
        assert not c.started.is_set()  # c still waits for B
        b.gate.set()
        return await answer  # type: ignore[no-any-return]

    outputs = run(scenario())
    np.testing.assert_array_equal(outputs["OUT"], [[(1 + 1) + (1 + 10) + 100, (2 + 1) + (2 + 10) + 100]])


def test_a_step_request_carries_the_ensemble_requests_id_priority_and_rows() -> None:
    scheduler, models, _ = diamond()
    run(scheduler.infer(request(1)))
    step_request = models.steps["c"].requests[0]
    assert (step_request.model_name, step_request.id, step_request.priority, step_request.rows) == ("c", "r1", 2, 1)
    assert set(step_request.inputs) == {"X", "X2"}


def test_every_step_request_carries_the_ensemble_requests_correlation_id_and_sequence_flags() -> None:
    """As Triton's EnsembleContext::InitStep (SetCorrelationId, SetFlags)."""
    scheduler, models, _ = diamond()
    flags = SequenceFlags(id="session-7", start=True, end=False)
    run(scheduler.infer(InferRequest("ens", {"IN": np.ones((1, 1), dtype=np.float32)}, sequence=flags)))
    assert [models.steps[name].requests[0].sequence for name in ("a", "b", "c")] == [flags] * 3


def test_a_successful_request_is_counted_once_for_the_ensemble() -> None:
    scheduler, _, stats = diamond()
    run(scheduler.infer(request(1)))
    snapshot = stats.snapshot()
    assert (snapshot["inference_count"], snapshot["execution_count"]) == (1, 1)
    assert snapshot["inference_stats"]["success"]["count"] == 1
    assert snapshot["inference_stats"]["fail"]["count"] == 0


def test_the_ensemble_reports_the_sums_of_its_step_requests_compute_times_as_triton() -> None:
    """Triton's RequestTracker: one execution of the request's batch size whose compute
    input, infer and output are the sums of its steps'; queue from arrival to start."""
    scheduler, models, stats = diamond()
    models.steps["a"].compute = (1, 10, 100)
    models.steps["b"].compute = (2, 20, 200)
    models.steps["c"].compute = (4, 40, 400)
    two_rows = InferRequest("ens", {"IN": np.ones((2, 3), dtype=np.float32)}, rows=2)
    run(scheduler.infer(two_rows, received_ns=0))
    snapshot = stats.snapshot()
    inference = snapshot["inference_stats"]
    assert (snapshot["inference_count"], snapshot["execution_count"]) == (2, 1)
    assert inference["compute_input"] == {"count": 1, "ns": 7}
    assert inference["compute_infer"] == {"count": 1, "ns": 70}
    assert inference["compute_output"] == {"count": 1, "ns": 700}
    # the clock ticks 1000 ns a reading: arrived at 0, started at 1000
    assert inference["queue"] == {"count": 1, "ns": 1000}
    assert snapshot["batch_stats"] == [{
        "batch_size": 2, "compute_input": {"count": 1, "ns": 7}, "compute_infer": {"count": 1, "ns": 70},
        "compute_output": {"count": 1, "ns": 700},
    }]


def test_an_ensemble_that_is_a_step_charges_its_sums_to_the_outer_ensemble() -> None:
    scheduler, models, _ = diamond()
    models.steps["a"].compute = (1, 10, 100)
    models.steps["c"].compute = (4, 40, 400)
    outer = ComputeTotals()
    inner = InferRequest("ens", {"IN": np.ones((1, 1), dtype=np.float32)}, compute_totals=outer)
    run(scheduler.infer(inner))
    assert (outer.input_ns, outer.infer_ns, outer.output_ns) == (5, 50, 500)


def test_a_failed_request_charges_no_compute() -> None:
    scheduler, models, stats = diamond()
    models.steps["a"].compute = (1, 10, 100)
    models.steps["c"].error = ModelExecutionError("boom", model="c")
    with pytest.raises(ModelExecutionError):
        run(scheduler.infer(request(1)))
    snapshot = stats.snapshot()
    assert snapshot["execution_count"] == 0 and snapshot["inference_stats"]["compute_infer"]["count"] == 0


def test_a_failing_step_keeps_its_error_class_and_subject_and_is_named() -> None:
    scheduler, models, stats = diamond()
    models.steps["b"].error = ModelExecutionError("model 'b': division by zero", model="b")
    with pytest.raises(ModelExecutionError) as failure:
        run(scheduler.infer(request(1)))
    assert failure.value.message == "in ensemble 'ens', step 'b': model 'b': division by zero"
    assert str(failure.value) == failure.value.message and failure.value.model == "b"
    assert models.steps["c"].requests == []  # nothing after the failure ran
    assert stats.snapshot()["inference_stats"]["fail"]["count"] == 1


def test_a_step_input_that_does_not_fit_its_model_is_refused_naming_the_step() -> None:
    scheduler, models, _ = diamond()
    models.steps["a"].config = config(STEP.format(dims="3", extra=""), "a")
    with pytest.raises(InvalidInputError) as failure:
        run(scheduler.infer(request(1, 2)))
    assert failure.value.message.startswith(
        "in ensemble 'ens', step 'a': unexpected shape for input 'X' for model 'a'. Expected [-1,3], got [1,2]."
    )


def test_a_withdrawn_request_is_answered_cancelled_and_its_steps_stop() -> None:
    async def scenario() -> tuple[list[Any], bool]:
        scheduler, models, _ = diamond()
        models.steps["a"].gate = asyncio.Event()
        answers: list[Any] = []
        ticket = scheduler.submit(request(1), None, lambda outputs, error: answers.append((outputs, error)))
        await models.steps["a"].started.wait()
        ticket.withdraw()
        await scheduler.aclose()
        return answers, models.steps["c"].started.is_set()

    answers, c_started = run(scenario())
    assert len(answers) == 1 and answers[0][0] is None and isinstance(answers[0][1], asyncio.CancelledError)
    assert not c_started


def test_submit_answers_through_the_callback() -> None:
    async def scenario() -> list[Any]:
        scheduler, _, _ = diamond()
        answered = asyncio.Event()
        answers: list[Any] = []

        def on_answer(outputs: Any, error: BaseException | None) -> None:
            answers.append((outputs, error))
            answered.set()

        scheduler.submit(request(0), None, on_answer)
        await answered.wait()
        return answers

    [(outputs, error)] = run(scenario())
    assert error is None and outputs["OUT"].tolist() == [[111.0]]


def test_the_ensemble_says_why_it_cannot_serve_while_a_step_model_is_missing_or_unfit() -> None:
    scheduler, models, _ = diamond()
    assert scheduler.problem is None
    b = models.steps.pop("b")
    assert scheduler.problem == "ensemble 'ens' depends on 'b' which has no loaded version"
    models.steps["b"] = b
    b.problem = "no instance can serve: instance b_0 restarting"
    assert scheduler.problem == "ensemble 'ens' depends on 'b': no instance can serve: instance b_0 restarting"
    b.problem = None
    b.config = config(STEP.format(dims="-1", extra="").replace('name = "Y"', 'name = "Z"'), "b")
    assert scheduler.problem == "in ensemble 'ens', ensemble tensor 'B' is mapped from non-existing output 'Y' in model 'b'"


def test_the_ensemble_counts_as_unloaded_when_triton_would_have_unloaded_it() -> None:
    """Triton unloads an ensemble whose step model is gone or no longer fits
    (LoadModelByDependency); it keeps it loaded while a step's instances cannot serve."""
    scheduler, models, _ = diamond()
    assert not scheduler.withdrawn
    b = models.steps.pop("b")
    assert scheduler.withdrawn
    models.steps["b"] = b
    assert not scheduler.withdrawn
    b.problem = "no instance can serve: instance b_0 restarting"
    assert scheduler.problem is not None and not scheduler.withdrawn
    b.problem = None
    b.config = config(STEP.format(dims="-1", extra="").replace('name = "Y"', 'name = "Z"'), "b")
    assert scheduler.withdrawn


def test_the_ensemble_is_settled_while_each_step_model_there_is_settled() -> None:
    """Its problem then changes only when a step model is loaded or unloaded (which the
    model manager announces), so a front-end worker may answer its readiness."""
    scheduler, models, _ = diamond()
    assert scheduler.settled
    models.steps["b"].settled = False  # e.g. process instances, which restart on their own
    assert not scheduler.settled
    models.steps.pop("b")
    assert scheduler.settled  # no model for the step: the manager's state, announced


def test_a_closed_scheduler_refuses_new_requests() -> None:
    scheduler, _, _ = diamond()
    run(scheduler.aclose())
    with pytest.raises(NereidError, match="model 'ens' was unloaded"):
        run(scheduler.infer(request(1)))


#: IN -> gen (decoupled) -> G -> post -> OUT
STREAMING = """
platform = "ensemble"
max_batch_size = 4
[[input]]
name = "IN"
data_type = "FP32"
dims = [-1]
[[output]]
name = "OUT"
data_type = "FP32"
dims = [-1]
[[ensemble_scheduling.step]]
model_name = "gen"
input_map = { X = "IN" }
output_map = { Y = "G" }
[[ensemble_scheduling.step]]
model_name = "post"
input_map = { X = "G" }
output_map = { Y = "OUT" }
"""


def test_each_response_of_a_decoupled_step_runs_the_steps_after_it_and_is_a_response() -> None:
    gen = FakeStep("gen", 0, extra="[model_transaction_policy]\ndecoupled = true")
    gen.responses = [1, 2, 3]
    post = FakeStep("post", 100)
    stats = ModelStats("ens", 1)
    scheduler = EnsembleScheduler(config(STREAMING, "ens"), Models(gen, post), stats)

    async def collect() -> list[list[list[float]]]:
        return [outputs["OUT"].tolist() async for outputs in scheduler.stream(request(0))]

    assert run(collect()) == [[[101.0]], [[102.0]], [[103.0]]]
    assert len(post.requests) == 3
    assert stats.snapshot()["inference_stats"]["success"]["count"] == 1


def test_leaving_a_stream_early_counts_a_failure_for_reason_other_as_triton() -> None:
    """Triton's ensemble scheduler reports every failure with FailureReason::OTHER."""
    gen = FakeStep("gen", 0, extra="[model_transaction_policy]\ndecoupled = true")
    gen.responses = [1, 2, 3]
    stats = ModelStats("ens", 1)
    scheduler = EnsembleScheduler(config(STREAMING, "ens"), Models(gen, FakeStep("post", 100)), stats)

    async def first() -> list[list[float]]:
        steps = scheduler.stream(request(0))
        outputs = await anext(steps)
        await steps.aclose()
        return outputs["OUT"].tolist()  # type: ignore[no-any-return]

    assert run(first()) == [[101.0]]
    assert stats.failures_by_reason == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}
