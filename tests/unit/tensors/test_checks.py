"""The one request-checking core: every rule raises its reason code, rendered by the
surface's renderer (Triton's texts for HTTP; the in-process API's own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import by_wire_name
from nereid.errors import InvalidInputError
from nereid.local import build_request
from nereid.tensors.checks import ConfigRules, Facts, InputProblem, Problem, triton_text

FP32 = by_wire_name("FP32")
INT64 = by_wire_name("INT64")
BYTES = by_wire_name("BYTES")
assert FP32 is not None and INT64 is not None and BYTES is not None


@dataclass
class Wire:
    """An input as a surface describes it."""

    dt: Any
    shape: tuple[int, ...]
    size: int = -1
    negative: bool = False

    def __post_init__(self) -> None:
        if self.size == -1:
            self.size = int(np.prod(self.shape)) * self.dt.itemsize


def model(max_batch_size: int = 4, optional_b: bool = False) -> ModelConfig:
    return ModelConfig(
        name="m",
        max_batch_size=max_batch_size,
        input=(ModelInput("A", FP32, (2, -1)), ModelInput("B", INT64, (1,), optional=optional_b)),
    )


def problem(rules: ConfigRules, inputs: dict[str, Wire], prefix: str = "[request id: r] ") -> InputProblem:
    with pytest.raises(InputProblem) as caught:
        rules.check_inputs(inputs, "m", prefix)
    assert isinstance(caught.value, InvalidInputError)  # a 400 on every surface
    return caught.value


def test_a_fitting_request_gives_its_names_in_check_order_and_its_rows() -> None:
    rules = ConfigRules(model())
    names, rows = rules.check_inputs({"B": Wire(INT64, (3, 1)), "A": Wire(FP32, (3, 2, 7))}, "m")
    assert (names, rows) == (["A", "B"], 3)
    assert ConfigRules(model(0)).check_inputs({"A": Wire(FP32, (2, 5)), "B": Wire(INT64, (1,))}, "m")[1] == 1


@pytest.mark.parametrize(
    ("inputs", "code", "input", "text"),
    [
        pytest.param(
            {"A": Wire(FP32, (1, 2, 3))}, Problem.INPUT_COUNT, None,
            "[request id: r] expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['A'], but missing "
            "required input(s) ['B']. Please provide all required input(s).",
            id="count",
        ),
        pytest.param(
            {"A": Wire(FP32, (1, 2, 3)), "C": Wire(FP32, (1,))}, Problem.UNEXPECTED_INPUT, "C",
            "unexpected inference input 'C' for model 'm'", id="unexpected",
        ),
        pytest.param(
            {"A": Wire(FP32, ()), "B": Wire(INT64, (1, 1))}, Problem.NO_BATCH_DIMENSION, "A",
            "[request id: r] input 'A' has no shape but model requires batch dimension for 'm'", id="no-batch-dim",
        ),
        pytest.param(
            {"A": Wire(FP32, (2, 2, 3)), "B": Wire(INT64, (1, 1))}, Problem.BATCH_MISMATCH, "B",
            "[request id: r] input 'B' batch size does not match other inputs for 'm'", id="batch-mismatch",
        ),
        pytest.param(
            {"A": Wire(FP32, (5, 2, 3)), "B": Wire(INT64, (5, 1))}, Problem.BATCH_SIZE, "A",
            "[request id: r] inference request batch-size must be <= 4 for 'm'", id="batch-too-large",
        ),
        pytest.param(
            {"A": Wire(FP32, (0, 2, 3)), "B": Wire(INT64, (0, 1))}, Problem.BATCH_SIZE, "A",
            "[request id: r] inference request batch-size must be between 1 and 4 for 'm', got 0", id="batch-zero",
        ),
        pytest.param(
            {"A": Wire(INT64, (1, 2, 3)), "B": Wire(INT64, (1, 1))}, Problem.DATATYPE, "A",
            "[request id: r] inference input 'A' data-type is 'INT64', but model 'm' expects 'FP32'", id="datatype",
        ),
        pytest.param(
            {"A": Wire(FP32, (1, 3, 3)), "B": Wire(INT64, (1, 1))}, Problem.SHAPE, "A",
            "[request id: r] unexpected shape for input 'A' for model 'm'. Expected [-1,2,-1], got [1,3,3]. NOTE:",
            id="shape",
        ),
        pytest.param(
            {"A": Wire(FP32, (1, 2, -5), negative=True), "B": Wire(INT64, (1, 1))}, Problem.UNSPECIFIED_DIMENSION,
            "A", "[request id: r] All input dimensions should be specified for input 'A' for model 'm', got [1,2,-5]",
            id="unspecified-dim",
        ),
        pytest.param(
            {"A": Wire(FP32, (1, 2, 3), size=7), "B": Wire(INT64, (1, 1))}, Problem.BYTE_SIZE, "A",
            "[request id: r] input byte size mismatch for input 'A' for model 'm'. Expected 24, got 7", id="byte-size",
        ),
    ],
)
def test_each_rule_raises_its_code_with_tritons_text(
    inputs: dict[str, Wire], code: Problem, input: str | None, text: str
) -> None:
    caught = problem(ConfigRules(model()), inputs)
    assert (caught.code, caught.input, caught.model) == (code, input, "m")
    assert caught.message.startswith(text)


def test_an_optional_input_may_be_left_out_but_not_stand_in_for_a_required_one() -> None:
    rules = ConfigRules(
        ModelConfig(
            name="m", max_batch_size=0,
            input=(ModelInput("A", FP32, (1,)), ModelInput("O", FP32, (1,), optional=True), ModelInput("R", FP32, (1,))),
        )
    )
    assert rules.check_inputs({"A": Wire(FP32, (1,)), "R": Wire(FP32, (1,))}, "m")[0] == ["A", "R"]
    caught = problem(rules, {"A": Wire(FP32, (1,)), "O": Wire(FP32, (1,))})
    assert caught.code is Problem.INPUT_COUNT and caught.facts.detail["missing"] == ["R"]


def test_a_surface_renders_the_same_problem_in_its_own_words() -> None:
    def plain(facts: Facts) -> str:
        return f"{facts.problem.value}: {facts.input} {dict(facts.detail)}"

    with pytest.raises(InputProblem) as caught:
        ConfigRules(model()).check_inputs({"A": Wire(FP32, (1, 3, 3)), "B": Wire(INT64, (1, 1))}, "m", render=plain)
    assert caught.value.message == "shape: A {'expected': (-1, 2, -1), 'got': (1, 3, 3), 'batching': True}"
    assert triton_text(caught.value.facts).startswith("unexpected shape for input 'A' for model 'm'")


# -- the in-process request builder (nereid.local.build_request) on the same core ----------


def test_python_values_become_arrays_of_the_config_types() -> None:
    request = build_request(model(), "m", {"A": [[[1, 2], [3, 4]]], "B": [[7]]}, {"k": 1}, priority=2)
    assert request.inputs["A"].dtype == np.float32 and request.inputs["A"].shape == (1, 2, 2)
    assert request.inputs["B"].dtype == np.int64 and request.rows == 1
    assert (dict(request.parameters), request.priority) == ({"k": 1}, 2)
    strings = ModelConfig(name="s", max_batch_size=0, input=(ModelInput("S", BYTES, (2,)),))
    assert build_request(strings, "s", {"S": ["a", b"b"]}).inputs["S"].tolist() == [b"a", b"b"]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        pytest.param({"A": np.ones((1, 2, 1), np.float64), "B": [[1]]},
                     "model 'm', input 'A': expected data type FP32 (numpy float32), got numpy float64", id="dtype"),
        pytest.param({"A": [[[1], [2]]]}, "model 'm': missing required input 'B'", id="missing"),
        pytest.param({"A": [[[1], [2]]], "B": [[1]], "C": [1]},
                     "model 'm': expected at most 2 inputs, got 3: ['A', 'B', 'C']", id="too-many"),
        pytest.param({"A": [[[1], [2]]], "X": [[1]]},
                     "unexpected inference input 'X' for model 'm' (inputs: ['A', 'B'])", id="unknown"),
        pytest.param({"A": [[1, 2]], "B": [[1]]}, "model 'm', input 'A': expected shape [-1, 2, -1], got [1, 2]",
                     id="shape"),
        pytest.param({"A": np.ones((5, 2, 1), np.float32), "B": np.ones((5, 1), np.int64)},
                     "model 'm', input 'A': expected a batch of 1..4 rows, got 5", id="batch"),
        pytest.param({"A": np.ones((2, 2, 1), np.float32), "B": [[1]]},
                     "model 'm', input 'B': expected batch size 2 (as the other inputs), got 1", id="mismatch"),
        pytest.param({"A": ["x"], "B": [[1]]},
                     "model 'm', input 'A': expected values convertible to FP32, got could not convert string to "
                     "float: 'x'", id="not-numbers"),
    ],
)
def test_the_in_process_builder_words_each_problem_for_python_callers(inputs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        build_request(model(), "m", inputs)
    assert caught.value.message == message
