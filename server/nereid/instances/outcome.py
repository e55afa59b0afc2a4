"""What one execution of a batch comes to (``BatchOutcome``), and the sink a streamed
batch's steps go to (``StepSink``): the records thread and process instances hand the
batcher. Knows nothing about how the batch ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from nereid.errors import NereidError

__all__ = ["BatchOutcome", "StepSink"]

#: Receives one streamed step on the event loop: each request's own outputs, and whether
#: that request is finished with this step.
StepSink = Callable[[list[dict[str, np.ndarray]], list[bool]], None]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """The result of one execution: per-request outputs (same order as the requests), or
    the error that failed the whole batch; the three compute durations; and when the
    instance began and ended it (``time.monotonic_ns``; 0: not known), which the batcher
    counts as the instance's busy and idle time."""

    outputs: list[dict[str, np.ndarray]] | None
    error: NereidError | None
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    began_ns: int = 0
    ended_ns: int = 0
