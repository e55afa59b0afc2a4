"""What a process instance's model returns, made fit to cross to the server: torch
tensors as numpy, values that cannot be pickled named instead (the server then words the
error as for a thread instance), a Triton model's answer as the server rebuilds it. Used
by ``worker.py`` in the worker process."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from nereid.errors import NereidError
from nereid.instances.channel import Unsendable
from nereid.tensors.assembly import tensor_to_numpy
from nereid.tensors.device import outputs_to_host

__all__ = ["PICKLE_ERRORS", "picklable", "portable", "sendable", "worker_outputs"]

#: What pickling an arbitrary value of model code may raise.
PICKLE_ERRORS = (pickle.PicklingError, TypeError, AttributeError, ValueError)


def worker_outputs(raw: Any) -> Any:
    """What the model returned, made transferable: torch tensors (any device) become
    numpy (as the server would convert them); anything else is left as is, lists of str
    too: the server checks outputs against the config and converts or words the error
    exactly as for a thread instance."""
    if not isinstance(raw, dict):
        return raw
    if all(type(value) is np.ndarray for value in raw.values()):
        return raw  # the common case: nothing to convert
    raw = outputs_to_host(raw)  # CUDA tensors: one copy for the batch
    return {
        name: tensor_to_numpy(value) if type(value).__module__.startswith("torch") else value
        for name, value in raw.items()
    }


def sendable(outputs: Any) -> Any:
    """``outputs`` with each value that cannot be pickled (a lambda, a generator)
    replaced by an Unsendable naming its type: the server then words the error about it
    as for a thread instance (``expected a numpy array or torch tensor, got function``)."""
    if not isinstance(outputs, dict):
        return Unsendable(type(outputs).__name__)
    return {name: value if picklable(value) else Unsendable(type(value).__name__) for name, value in outputs.items()}


def picklable(value: Any) -> bool:
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except PICKLE_ERRORS:
        return False
    return True


def portable(answer: Any) -> Any:
    """A Triton model's answer as the server rebuilds it: outputs as numpy (a torch tensor
    moved to host), an error as ("error", class name, message)."""
    if isinstance(answer, NereidError):
        return ("error", type(answer).__name__, answer.message)
    return worker_outputs(answer)
