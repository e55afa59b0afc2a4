"""instances.sendable: a process instance's outputs made fit to cross to the server."""

from __future__ import annotations

import numpy as np

from nereid.errors import InvalidInputError
from nereid.instances.channel import Unsendable
from nereid.instances.sendable import picklable, portable, sendable, worker_outputs


def test_numpy_outputs_pass_as_they_are() -> None:
    outputs = {"Y": np.arange(3)}
    assert worker_outputs(outputs) is outputs
    assert worker_outputs([1, 2]) == [1, 2]  # not a dict: the server words the error


def test_values_that_cannot_be_pickled_are_named_by_their_type() -> None:
    made = sendable({"Y": np.arange(2), "F": lambda: None})
    assert isinstance(made["F"], Unsendable) and made["F"].type_name == "function"
    np.testing.assert_array_equal(made["Y"], np.arange(2))
    whole = sendable(x for x in ())
    assert isinstance(whole, Unsendable) and whole.type_name == "generator"
    assert picklable(3) and not picklable(lambda: None)


def test_a_triton_error_answer_becomes_its_class_and_message() -> None:
    assert portable(InvalidInputError("bad X")) == ("error", "InvalidInputError", "bad X")
    outputs = {"Y": np.zeros(1)}
    assert portable(outputs) is outputs
