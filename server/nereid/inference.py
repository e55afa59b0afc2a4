"""The records one inference travels in: InferRequest in, InferResult out.

Owns the shapes only. The HTTP codec (or the in-process API) builds an InferRequest once,
with numpy arrays already checked against the model config; below that nobody re-checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = [
    "InferRequest", "RequestedOutput", "InferResult", "ParameterValue", "SequenceFlags", "ComputeTotals", "FINISHED",
]

#: The key a decoupled (streaming) model may add to a yielded output dict: a bool per row
#: of the batch; a request whose rows are all True gets this step as its last response.
FINISHED = "__finished__"

ParameterValue = str | int | bool | float


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """One entry of the request's ``outputs`` list."""

    name: str
    binary_data: bool = False
    #: top-K classification (0: off), protocol.md §2.8.
    classification: int = 0
    shm_region: str | None = None
    shm_byte_size: int = 0
    shm_offset: int = 0


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's sequence parameters (``sequence_id``, ``sequence_start``,
    ``sequence_end``): the correlation id (0 or "": none given) and the two flags. Only
    a model with sequence_batching reads them (scheduling/sequences.py)."""

    id: int | str = 0
    start: bool = False
    end: bool = False


@dataclass(slots=True)
class ComputeTotals:
    """The compute durations charged to the step requests of one ensemble request, summed
    (Triton's secondary statistics aggregator of an ensemble request): each step request
    that succeeds adds what its model charged it (its batch's compute_input, compute_infer
    and compute_output ns); the ensemble reports the sums as its own."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns


@dataclass(slots=True)
class InferRequest:
    """One validated inference request.

    ``inputs`` maps input name -> numpy array of the full request shape (batch dim first
    when the model batches; BYTES inputs are object arrays of ``bytes``). ``rows`` is the
    request's batch size (1 for non-batching models). ``outputs`` is None when the request
    asks for every output (each then encoded per ``binary_data_output``).
    """

    model_name: str
    inputs: dict[str, np.ndarray]
    rows: int = 1
    id: str = ""
    model_version: int | None = None
    outputs: tuple[RequestedOutput, ...] | None = None
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
    priority: int = 0
    #: per-request queue timeout in microseconds (only honoured with allow_timeout_override).
    timeout_us: int | None = None
    binary_data_output: bool = False
    #: the sequence parameters, when the request gave any.
    sequence: SequenceFlags | None = None
    #: an ensemble's step request: where its compute durations are added too, once it
    #: succeeds (None: any other request).
    compute_totals: ComputeTotals | None = None


@dataclass(slots=True)  # not frozen: one is made per answered request, and a frozen init costs twice
class InferResult:
    """What one request gets back: its own rows of every output the model produced.

    ``outputs`` maps output name -> numpy array (BYTES outputs as object arrays of bytes),
    in the order the model produced them. ``parameters`` holds response parameters.
    """

    model_name: str
    model_version: int
    outputs: Mapping[str, np.ndarray]
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
