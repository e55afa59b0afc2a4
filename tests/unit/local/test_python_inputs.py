"""build_request's conversion of Python values (the checks it shares with HTTP are in
tests/unit/tensors/test_checks.py): str elements of a STRING input are encoded, an
array already of the config's type is taken as it is, anything else is refused naming
the model, the input and what was given."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.config.schema import ModelConfig, ModelInput
from nereid.datatypes import by_config_name
from nereid.errors import InvalidInputError
from nereid.local import build_request

pytestmark = pytest.mark.unit


def config(data_type: str) -> ModelConfig:
    found = by_config_name(data_type)
    assert found is not None
    return ModelConfig(name="m", max_batch_size=0, input=(ModelInput("X", found, (-1,)),))


def test_an_array_of_the_config_type_is_taken_as_it_is() -> None:
    array = np.arange(3, dtype=np.float32)
    assert build_request(config("FP32"), "m", {"X": array}).inputs["X"] is array


def test_str_elements_of_a_string_input_become_utf8_bytes() -> None:
    assert build_request(config("STRING"), "m", {"X": ["é", b"b"]}).inputs["X"].tolist() == ["é".encode(), b"b"]


def test_a_string_input_refuses_other_elements_naming_their_type() -> None:
    with pytest.raises(InvalidInputError) as caught:
        build_request(config("STRING"), "m", {"X": ["a", 3]})
    assert caught.value.message == "model 'm', input 'X': expected str or bytes elements (STRING), got int"
