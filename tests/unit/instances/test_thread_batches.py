"""nereid.instances.thread: a ModelInstance runs its model's code on its own threads (or
an ``async def infer`` on the loop), each batch split back per request; whatever the model
raises fails that batch only, and comes back in the outcome with the model named."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from nereid.faults import FaultLog
from nereid.inference import InferRequest
from nereid.instances.thread import ModelInstance
from nereid.repository.model_file import load_model_class
from tests.unit.instances.model_folder import model_folder

CONFIG = """
name = "m"
max_batch_size = 8
[[input]]
name = "X"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "Y"
data_type = "TYPE_INT32"
dims = [1]
"""

SYNC_MODEL = """
class Model:
    closed = []

    def infer(self, inputs):
        if (inputs["X"] < 0).any():
            raise SystemExit(3)
        if (inputs["X"] == 0).any():
            return {"Y": inputs["X"].astype("float64")}
        return {"Y": inputs["X"] + 1}

    def close(self):
        Model.closed.append(True)
"""

ASYNC_MODEL = SYNC_MODEL.replace("    def infer(self, inputs):", "    async def infer(self, inputs):")


def instance(tmp_path: Path, model: str) -> ModelInstance:
    model_file, context, config = model_folder(tmp_path, model, CONFIG)
    return ModelInstance(load_model_class(model_file, "m", 1), context, config, FaultLog())


def request(*values: int) -> InferRequest:
    return InferRequest(model_name="m", inputs={"X": np.array([[v] for v in values], dtype=np.int32)}, rows=len(values))


@pytest.mark.parametrize("model", [SYNC_MODEL, ASYNC_MODEL], ids=["sync", "async"])
def test_a_batch_is_split_back_per_request(tmp_path: Path, model: str) -> None:
    async def main() -> list[list[int]]:
        running = instance(tmp_path, model)
        await running.start()
        outcome = await running.run_batch([request(1, 2), request(5)])
        await running.close()
        assert outcome.error is None and outcome.outputs is not None
        assert outcome.compute_input_ns >= 0 and outcome.compute_infer_ns >= 0
        return [out["Y"].ravel().tolist() for out in outcome.outputs]

    assert asyncio.run(main()) == [[2, 3], [6]]


@pytest.mark.parametrize("model", [SYNC_MODEL, ASYNC_MODEL], ids=["sync", "async"])
def test_a_system_exit_in_infer_fails_the_batch_and_names_the_model(tmp_path: Path, model: str) -> None:
    async def main() -> str:
        running = instance(tmp_path, model)
        await running.start()
        failed = await running.run_batch([request(-1)])
        again = await running.run_batch([request(1)])  # the instance goes on serving
        await running.close()
        assert failed.outputs is None and again.error is None
        assert failed.error is not None
        return failed.error.message

    assert asyncio.run(main()) == 'model "m" raised in infer: SystemExit: 3'


def test_outputs_that_do_not_match_the_config_fail_the_batch(tmp_path: Path) -> None:
    async def main() -> str:
        running = instance(tmp_path, SYNC_MODEL)
        await running.start()
        outcome = await running.run_batch([request(0)])
        await running.close()
        assert outcome.error is not None
        return outcome.error.message

    assert asyncio.run(main()) == 'model "m", output "Y": expected data type INT32, got FP64'


def test_close_calls_the_models_close_once(tmp_path: Path) -> None:
    async def main() -> list[bool]:
        running = instance(tmp_path, SYNC_MODEL)
        await running.start()
        closed: list[bool] = running.model.closed
        await running.close()
        return closed

    assert asyncio.run(main()) == [True]


class _Turn:
    """A dispatch turn that records how many batches the model had run as it was taken and
    given back."""

    def __init__(self) -> None:
        self.running: ModelInstance | None = None
        self.seen: list[tuple[str, int]] = []

    def __enter__(self) -> None:
        assert self.running is not None
        self.seen.append(("taken", self.running.model.calls))

    def __exit__(self, *exc: object) -> None:
        assert self.running is not None
        self.seen.append(("given back", self.running.model.calls))


COUNTING_MODEL = """
class Model:
    calls = 0

    def infer(self, inputs):
        self.calls += 1
        return {"Y": inputs["X"] + 1}
"""


def test_infer_runs_inside_the_instance_dispatch_turn_and_the_outputs_are_split_after_it(tmp_path: Path) -> None:
    """The turn a GPU's instances take (``DispatchTurns``) covers ``infer`` alone: taken
    before the call, given back once it returns, before the outputs are brought back."""
    async def main() -> None:
        turn = _Turn()
        model_file, context, config = model_folder(tmp_path, COUNTING_MODEL, CONFIG)
        running = turn.running = ModelInstance(load_model_class(model_file, "m", 1), context, config,
                                               FaultLog(), dispatch_turn=turn)
        await running.start()
        outcome = await running.run_batch([request(1)])
        await running.close()
        assert outcome.outputs is not None and outcome.outputs[0]["Y"].ravel().tolist() == [2]
        assert turn.seen == [("taken", 0), ("given back", 1)]

    asyncio.run(main())
