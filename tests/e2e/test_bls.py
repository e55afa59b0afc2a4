"""Business Logic Scripting between the models of one server: two servers in one process,
each with a Triton model calling a model of its own repository (``exec()`` and
``async_exec()``), never reach each other's models."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest

import nereid
from tests.conftest import RepoBuilder

TENSOR_CONFIG = """
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

TARGET_MODEL = """
class Model:
    def infer(self, inputs):
        return {{"Y": inputs["X"] + {offset}}}
"""

CALLER_MODEL = """
import triton_python_backend_utils as pb_utils


def call_target(request):
    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
    return pb_utils.InferenceRequest(
        model_name="target", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
    )


def answer(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "Y")])


class TritonPythonModel:
    def execute(self, requests):
        return [answer(call_target(request).exec()) for request in requests]
"""

ASYNC_CALLER_MODEL = CALLER_MODEL.replace(
    "    def execute(self, requests):\n        return [answer(call_target(request).exec()) for request in requests]",
    "    async def execute(self, requests):\n"
    "        return [answer(await call_target(request).async_exec()) for request in requests]",
)


def repository(root: Path, offset: int) -> Path:
    repo = RepoBuilder(root)
    repo.add("target", TENSOR_CONFIG, TARGET_MODEL.format(offset=offset))
    repo.add("caller", TENSOR_CONFIG, CALLER_MODEL)
    repo.add("async_caller", TENSOR_CONFIG, ASYNC_CALLER_MODEL)
    return root


@pytest.mark.parametrize("caller", ["caller", "async_caller"])
def test_each_servers_bls_calls_reach_its_own_models(tmp_path: Path, caller: str) -> None:
    first = repository(tmp_path / "first", offset=1000)
    second = repository(tmp_path / "second", offset=2000)
    with nereid.Server(first) as one, nereid.Server(second) as two:

        def ask(server: nereid.Server, value: int) -> int:
            return int(server.infer(caller, {"X": np.array([[value]], dtype=np.int32)})["Y"][0, 0])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # both servers' calls interleaved
            asked = [(server, offset, value) for value in range(12)
                     for server, offset in ((one, 1000), (two, 2000))]
            answers = list(pool.map(lambda job: ask(job[0], job[2]), asked))
    assert answers == [offset + value for _, offset, value in asked]

