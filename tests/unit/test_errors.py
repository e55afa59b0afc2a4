"""The errors about a model keep its name beside their message (``model``, None when not
known), whatever branch of the NereidError tree they sit in."""

from __future__ import annotations

import pytest

from nereid.errors import (
    ExecutionTimeoutError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelNotReadyError,
    NereidError,
    UnavailableError,
)

pytestmark = pytest.mark.unit

ABOUT_A_MODEL = [ModelNotFoundError, ModelNotReadyError, ModelExecutionError, ExecutionTimeoutError]


@pytest.mark.parametrize("kind", ABOUT_A_MODEL, ids=lambda kind: kind.__name__)
def test_an_error_about_a_model_keeps_its_name_and_its_message(kind: type[NereidError]) -> None:
    error = kind("model 'm' version 2 is not at ready state", model="m")  # type: ignore[call-arg]
    assert (error.model, error.message, str(error)) == (  # type: ignore[attr-defined]
        "m", "model 'm' version 2 is not at ready state", "model 'm' version 2 is not at ready state")
    assert kind("unknown").model is None  # type: ignore[attr-defined]


def test_a_version_not_ready_is_unavailable() -> None:
    assert isinstance(ModelNotReadyError("not ready", model="m"), UnavailableError)
    assert not isinstance(ModelNotFoundError("not found", model="m"), UnavailableError)
