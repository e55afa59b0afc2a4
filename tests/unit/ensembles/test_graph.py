"""An ensemble against its step models' configs: Triton's ValidateEnsembleConfig messages."""

from __future__ import annotations

import tomllib

import pytest

from nereid.config import ModelConfig, parse_model_config
from nereid.ensembles.graph import decoupled_problem, ensemble_problem, shapes_match

pytestmark = pytest.mark.unit

ENSEMBLE = """
platform = "ensemble"
max_batch_size = 4
[[input]]
name = "IN"
data_type = "FP32"
dims = [4]
[[output]]
name = "OUT"
data_type = "FP32"
dims = [4]
[[ensemble_scheduling.step]]
model_name = "step"
input_map = { X = "IN" }
output_map = { Y = "OUT" }
"""

STEP = """
max_batch_size = 8
[[input]]
name = "X"
data_type = "FP32"
dims = [4]
[[output]]
name = "Y"
data_type = "FP32"
dims = [-1]
"""


def config(text: str, name: str) -> ModelConfig:
    return parse_model_config(tomllib.loads(text), source=f"{name}/config.toml", folder_name=name)


def problem(step_text: str = STEP, ensemble_text: str = ENSEMBLE) -> str | None:
    return ensemble_problem(config(ensemble_text, "ens"), [config(step_text, "step")])


def test_a_step_that_fits_leaves_no_problem_and_minus_one_dims_match_any() -> None:
    assert problem() is None
    assert shapes_match([-1, 4], [3, 4]) and not shapes_match([4], [-1, 4]) and not shapes_match([3], [4])


def test_a_non_batching_step_fits_when_its_shape_is_the_batched_one() -> None:
    step = STEP.replace("max_batch_size = 8", "max_batch_size = 0").replace("dims = [4]", "dims = [-1, 4]")
    assert problem(step.replace("dims = [-1]", "dims = [-1, -1]")) is None


@pytest.mark.parametrize(
    ("step", "message"),
    [
        pytest.param(STEP.replace("max_batch_size = 8", "max_batch_size = 2"),
                     "ensemble 'ens' allows maximum batch size 4, but it contains model 'step' which only allows "
                     "maximum batch size to be 2", id="batch-size"),
        pytest.param(STEP.replace('name = "X"', 'name = "A"'),
                     "in ensemble 'ens', ensemble tensor 'IN' is mapping to non-existing input 'X' in model 'step'",
                     id="no-such-input"),
        pytest.param(STEP.replace("[[output]]", '[[input]]\nname = "B"\ndata_type = "FP32"\ndims = [4]\n[[output]]'),
                     "in ensemble 'ens', input 'B' in model 'step' is not mapped to any ensemble tensors",
                     id="input-not-fed"),
        pytest.param(STEP.replace('name = "Y"', 'name = "Z"'),
                     "in ensemble 'ens', ensemble tensor 'OUT' is mapped from non-existing output 'Y' in model 'step'",
                     id="no-such-output"),
        pytest.param(STEP.replace('data_type = "FP32"\ndims = [4]', 'data_type = "INT32"\ndims = [4]'),
                     "in ensemble 'ens', ensemble tensor 'IN': inconsistent data type: TYPE_FP32 is inferred from "
                     "model 'ens' while TYPE_INT32 is inferred from model 'step'", id="datatype"),
        pytest.param(STEP.replace("dims = [4]", "dims = [5]"),
                     "in ensemble 'ens', ensemble tensor 'IN': inconsistent shape: [-1,4] is inferred from model 'ens' "
                     "while [-1,5] is inferred from model 'step'", id="shape"),
    ],
)
def test_a_step_that_does_not_fit_is_named_with_tritons_words(step: str, message: str) -> None:
    assert problem(step) == message


def test_an_optional_input_may_be_left_unmapped() -> None:
    optional = '[[input]]\nname = "B"\ndata_type = "FP32"\ndims = [4]\noptional = true\n[[output]]'
    assert problem(STEP.replace("[[output]]", optional)) is None


#: IN -> first -> T; (IN, T) -> second -> OUT: second reads two flows when first is decoupled
TWO_FLOWS = ENSEMBLE.replace('output_map = { Y = "OUT" }', 'output_map = { Y = "T" }') + """
[[ensemble_scheduling.step]]
model_name = "second"
input_map = { X = "IN", X2 = "T" }
output_map = { Y = "OUT" }
"""
SECOND = STEP.replace("[[output]]", '[[input]]\nname = "X2"\ndata_type = "FP32"\ndims = [-1]\n[[output]]')
DECOUPLED = "[model_transaction_policy]\ndecoupled = true\n"


def test_a_decoupled_step_makes_the_ensemble_decoupled() -> None:
    ensemble = config(ENSEMBLE, "ens")
    assert decoupled_problem(ensemble, [config(STEP + DECOUPLED, "step")]) == (None, True)
    assert decoupled_problem(ensemble, [config(STEP, "step")]) == (None, False)


def test_a_step_reading_two_flows_is_refused_as_triton_refuses_it() -> None:
    ensemble = config(TWO_FLOWS, "ens")
    steps = [config(STEP + DECOUPLED, "step"), config(SECOND, "second")]
    assert ensemble_problem(ensemble, steps) == (
        "in ensemble 'ens', step of model 'second' receives inputs originated from different decoupled models")
    assert ensemble_problem(ensemble, [config(STEP, "step"), config(SECOND, "second")]) is None
