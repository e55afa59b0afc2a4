"""The generate extension's request parser: JSON keys -> typed input tensors and request
parameters, each problem named with the model, the field, what was expected and got."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import by_wire_name
from nereid.errors import InvalidInputError, MalformedRequestError
from nereid.http.generate_request import parse_generate_request
from nereid.tensors.checks import InputProblem, Problem


def dt(name: str) -> Any:
    found = by_wire_name(name)
    assert found is not None
    return found


CONFIG = ModelConfig(
    name="gen",
    max_batch_size=4,
    input=(
        ModelInput("text_input", dt("BYTES"), (1,)),
        ModelInput("max_tokens", dt("INT32"), (1,), optional=True),
        ModelInput("scores", dt("FP32"), (-1,), optional=True),
        ModelInput("flags", dt("BOOL"), (2, -1), optional=True),
    ),
)


def parse(doc: Any, config: ModelConfig = CONFIG) -> Any:
    return parse_generate_request(orjson.dumps(doc), config, model_name="gen", model_version=3)


def test_inputs_are_typed_by_the_config_and_shaped_by_its_dims_with_a_batch_of_one() -> None:
    request = parse({"text_input": "hi", "max_tokens": 5, "scores": [[1, 2.5], [3]], "flags": [True, False, True, True]})
    assert request.inputs["text_input"].tolist() == [[b"hi"]]
    assert (request.inputs["max_tokens"].dtype, request.inputs["max_tokens"].tolist()) == (np.int32, [[5]])
    assert (request.inputs["scores"].dtype, request.inputs["scores"].tolist()) == (np.float32, [[1.0, 2.5, 3.0]])
    assert request.inputs["flags"].shape == (1, 2, 2)
    assert (request.rows, request.model_version, request.id) == (1, 3, "")


def test_other_fields_and_parameters_become_request_parameters() -> None:
    request = parse({"text_input": "x", "id": "r1", "temperature": 0.5, "parameters": {"temperature": 0.7, "stop": True,
                                                                                       "priority": 2, "timeout": 100}})
    assert request.id == "r1"
    assert dict(request.parameters) == {"temperature": 0.7, "stop": True}  # parameters win over a top-level key
    assert (request.priority, request.timeout_us) == (2, 100)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"text_input": 3}, "model 'gen', input 'text_input' (BYTES, dims [1]): expected a JSON string "
                     "(or a list of them), got JSON number 3", id="string-expected"),
        pytest.param({"text_input": "x", "max_tokens": True}, "model 'gen', input 'max_tokens' (INT32, dims [1]): expected "
                     "a JSON integer in [-2147483648, 2147483647] (or a list of them), got JSON boolean true", id="int"),
        pytest.param({"text_input": "x", "max_tokens": 2**40}, "model 'gen', input 'max_tokens' (INT32, dims [1]): "
                     "expected a JSON integer in [-2147483648, 2147483647] (or a list of them), got JSON number "
                     "1099511627776", id="out-of-range"),
        pytest.param({"text_input": ["a", "b"]}, "model 'gen', input 'text_input' (BYTES, dims [1]): 2 element(s) do not "
                     "fit dims [1]", id="dims"),
        pytest.param({"text_input": "x", "flags": [True, False, True]}, "model 'gen', input 'flags' (BOOL, dims [2, -1]): "
                     "3 element(s) do not fit dims [2, -1]", id="dims-wildcard"),
        pytest.param({"text_input": "x", "id": 7}, "generate request for model 'gen': field 'id': expected a JSON string, "
                     "got number", id="id"),
        pytest.param({"text_input": "x", "parameters": []}, "generate request for model 'gen': field 'parameters': "
                     "expected a JSON object, got array", id="parameters"),
        pytest.param({"text_input": "x", "triton_x": 1}, "generate request for model 'gen': field 'triton_x' (not an input "
                     "of the model, so a request parameter): parameter keys starting with 'triton_' are reserved for "
                     "Triton usage and should not be specified.", id="reserved"),
        pytest.param({"text_input": "x", "priority": -1}, "generate request for model 'gen': field 'priority' (not an "
                     "input of the model, so a request parameter): expected an unsigned integer, got JSON number -1",
                     id="priority"),
        pytest.param({"text_input": "x", "parameters": {"k": [1]}}, "generate request for model 'gen': parameter 'k': "
                     "expected a JSON string, number or boolean, got array", id="parameter-type"),
    ],
)
def test_a_bad_field_names_the_model_the_field_and_what_was_expected(doc: Any, message: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse(doc)
    assert caught.value.message == message


def test_a_missing_required_input_comes_from_the_checking_core_worded_for_json_fields() -> None:
    with pytest.raises(InputProblem) as caught:
        parse({"prompt": "hello"})
    assert caught.value.code is Problem.INPUT_COUNT
    assert caught.value.message == (
        "generate request for model 'gen': missing required input(s) 'text_input': send each as a top-level JSON field "
        "(model inputs: 'text_input', 'max_tokens', 'scores', 'flags'; got fields: 'prompt')"
    )


@pytest.mark.parametrize("body", [b"{", b"[1]", b"\"x\""])
def test_a_body_that_is_not_a_json_object_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedRequestError, match="failed to parse the request JSON buffer"):
        parse_generate_request(body, CONFIG, model_name="gen")


def test_a_non_batching_model_gets_its_dims_without_a_batch_dimension() -> None:
    config = ModelConfig(name="gen", max_batch_size=0, input=(ModelInput("n", dt("INT64"), (-1,)),))
    request = parse({"n": [1, 2, 3]}, config)
    assert request.inputs["n"].shape == (3,)
