"""Business Logic Scripting between the models of one server: two servers in one process,
each with a Triton model calling a model of its own repository (``exec()`` and
``async_exec()``), never reach each other's models."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import nereid
from tests.conftest import RepoBuilder
from tests.waiting import MODEL_GATE, wait_until

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



# -- what a caller sees, from a thread or a process instance ---------------------------------

STEPS_CONFIG = """
max_batch_size = 0
[[input]]
name = "N"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "STEP"
data_type = "TYPE_INT32"
dims = [1]
[model_transaction_policy]
decoupled = true
"""

STEPS_MODEL = """
import numpy as np


class Model:
    def infer(self, inputs):
        for step in range(int(inputs["N"][0])):
            yield {"STEP": np.array([step], dtype=np.int32)}
"""

WIDE_CONFIG = """
max_batch_size = 0
[[input]]
name = "X"
data_type = "TYPE_FP32"
dims = [-1]
[[output]]
name = "Y"
data_type = "TYPE_FP32"
dims = [-1]
"""

WIDE_MODEL = """
class Model:
    def infer(self, inputs):
        return {"Y": inputs["X"] * 2}
"""

#: Holds its one instance until the file "go" exists beside model.py (says "entered" first).
GATED_CONFIG = WIDE_CONFIG + """
[dynamic_batching]
[dynamic_batching.default_queue_policy]
allow_timeout_override = true
"""

GATED_MODEL = """
class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        (self.folder / "entered").touch()
        wait_for_file(self.folder / "go")
        return {"Y": inputs["X"]}
""" + MODEL_GATE

#: One request, input KIND picks what execute does with BLS; the answer is text in OUT.
PROBE_CONFIG = """
max_batch_size = 0
[[input]]
name = "KIND"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "OUT"
data_type = "TYPE_STRING"
dims = [1]
"""

PROBE_MODEL = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


def ask(model, name, array, **options):
    return pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor(name, array)], requested_output_names=[], **options)


def describe(response):
    if response.has_error():
        return "error: " + response.error().message()
    return ",".join(f"{t.name()}={t.as_numpy().tolist()}" for t in response.output_tensors())


class TritonPythonModel:
    def execute(self, requests):
        kind = pb_utils.get_input_tensor_by_name(requests[0], "KIND").as_numpy()[0].decode()
        if kind == "stream":
            text = "|".join(describe(r) for r in ask("steps", "N", np.array([3], np.int32)).exec(decoupled=True))
        elif kind == "async":
            text = describe(asyncio.run(ask("steps", "N", np.array([2], np.int32)).async_exec(decoupled=False)))
        elif kind == "wide":
            x = np.arange(1_000_000, dtype=np.float32)  # 4 MB: through shared memory from a process
            y = pb_utils.get_output_tensor_by_name(ask("wide", "X", x).exec(), "Y").as_numpy()
            text = str(bool((y == 2 * x).all()))
        elif kind == "missing":
            text = describe(ask("no_such_model", "X", np.zeros(1, np.float32)).exec())
        elif kind == "bad_input":
            text = describe(ask("wide", "NOT_AN_INPUT", np.zeros(1, np.float32)).exec())
        elif kind == "timeout":  # 1 ms in the queue of a model that is busy: expires
            text = describe(ask("gated", "X", np.zeros(1, np.float32), timeout=1000).exec())
        elif kind == "itself":
            text = describe(ask("probe", "KIND", np.array([b"missing"], dtype=np.object_)).exec())
        else:
            text = "unknown kind " + kind
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))])]
"""


#: Calls itself with DEPTH - 1 until 0; two instances, so the caller's is never the only one.
RECURSIVE_CONFIG = """
max_batch_size = 0
[[input]]
name = "DEPTH"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "DEPTH"
data_type = "TYPE_INT32"
dims = [1]
[[instance_group]]
count = 2
kind = "KIND_CPU"
"""

RECURSIVE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        depth = pb_utils.get_input_tensor_by_name(requests[0], "DEPTH").as_numpy()
        if depth[0] > 0:
            inner = pb_utils.InferenceRequest(
                model_name="recursive", inputs=[pb_utils.Tensor("DEPTH", depth - 1)], requested_output_names=[]
            ).exec()
            if inner.has_error():
                raise pb_utils.TritonModelException(inner.error().message())
            depth = pb_utils.get_output_tensor_by_name(inner, "DEPTH").as_numpy() + 101
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DEPTH", depth)])]
"""


@pytest.fixture(scope="module")
def probing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nereid.Server]:
    repo = RepoBuilder(tmp_path_factory.mktemp("bls-probe"))
    repo.add("steps", STEPS_CONFIG, STEPS_MODEL)
    repo.add("wide", WIDE_CONFIG, WIDE_MODEL)
    repo.add("probe", PROBE_CONFIG, PROBE_MODEL)
    repo.add("gated", GATED_CONFIG, GATED_MODEL)
    repo.add("recursive", RECURSIVE_CONFIG, RECURSIVE_MODEL)
    with nereid.Server(repo.root) as server:
        yield server


def probe(server: nereid.Server, kind: str) -> str:
    out = server.infer("probe", {"KIND": np.array([kind.encode()], dtype=np.object_)})["OUT"]
    return bytes(out[0]).decode()


def test_a_decoupled_bls_request_yields_each_response(probing: nereid.Server) -> None:
    assert probe(probing, "stream") == "STEP=[0]|STEP=[1]|STEP=[2]"


def test_async_exec_of_a_decoupled_model_without_decoupled_is_an_error_response(probing: nereid.Server) -> None:
    assert probe(probing, "async") == (
        "error: model 'steps' is decoupled (it streams): use stream() instead of infer()"
    )


def test_large_tensors_go_and_come_back_whole(probing: nereid.Server) -> None:
    assert probe(probing, "wide") == "True"


def test_an_unknown_model_is_an_error_response_naming_it(probing: nereid.Server) -> None:
    assert probe(probing, "missing").startswith("error: ") and "no_such_model" in probe(probing, "missing")


def test_an_unknown_input_is_an_error_response_naming_it(probing: nereid.Server) -> None:
    assert "NOT_AN_INPUT" in probe(probing, "bad_input")


def test_a_request_to_its_own_single_instance_model_does_not_hang(probing: nereid.Server) -> None:
    """Its only instance is the caller: the request would wait for ever; it is an error
    response naming the model and the instance instead."""
    answer = probe(probing, "itself")
    assert answer.startswith('error: BLS request from model "probe" instance probe_0 to its own model')


def test_a_model_with_another_instance_serves_its_own_request_there(probing: nereid.Server) -> None:
    answer = probing.infer("recursive", {"DEPTH": np.array([1], np.int32)})["DEPTH"]
    assert answer.tolist() == [101]


def test_a_bls_request_past_its_timeout_is_an_error_response(probing: nereid.Server) -> None:
    """``InferenceRequest(timeout=...)`` (microseconds) counts where the model's queue
    policy allows it (allow_timeout_override), as for a client's request."""
    [folder] = [path / "gated" for path in probing.options.model_repositories]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holding = pool.submit(probing.infer, "gated", {"X": np.zeros(1, np.float32)})
        wait_until(lambda: (folder / "entered").exists(), "the gated model to hold its instance")
        try:
            assert probe(probing, "timeout") == "error: Request timeout expired"
        finally:
            (folder / "go").touch()
        holding.result(timeout=60)

