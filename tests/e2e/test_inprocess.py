"""The in-process API: nereid.Server without HTTP, through the same batcher."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading

import numpy as np
import pytest

import nereid
from tests.conftest import EXAMPLES, RepoBuilder


def examples() -> "nereid.Server":
    """The example repository with only the small models loaded (explicit mode)."""
    return nereid.Server(EXAMPLES, model_control_mode="explicit", load_model=("add_one", "simple"))

COUNTER = """
max_batch_size = 4
[[input]]
name = "N"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "STEP"
data_type = "TYPE_INT32"
dims = [1]
[dynamic_batching]
max_queue_delay_microseconds = 200000
[model_transaction_policy]
decoupled = true
"""

COUNTER_MODEL = """
import numpy as np
import nereid

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        n = inputs["N"][:, 0]
        for step in range(1, int(n.max()) + 1):
            yield {"STEP": np.full((len(n), 1), step, np.int32), nereid.FINISHED: n <= step}
"""


def test_sync_infer_on_the_example_repository() -> None:
    with examples() as server:
        outputs = server.infer("add_one", {"INPUT0": np.array([[41]], np.int64)})
        assert outputs["OUTPUT0"].tolist() == [[42]]
        simple = server.infer("simple", {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)})
        assert simple["OUTPUT0"].tolist() == [[2] * 16]
        assert server.is_ready()


def test_concurrent_sync_callers_share_batches() -> None:
    with examples() as server:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda n: server.infer("add_one", {"INPUT0": [[n]]})["OUTPUT0"][0, 0], range(8)))
        assert results == list(range(1, 9))
        stats = server.manager.get("add_one").stats
        assert stats.inference_count == 8
        assert stats.execution_count < 8  # some calls were executed together


def test_async_infer_and_stream_on_the_callers_loop(repo: RepoBuilder) -> None:
    repo.add("counter", COUNTER, COUNTER_MODEL)

    async def main() -> list[list[int]]:
        async with nereid.Server(repo.root) as server:
            async def collect(n: int) -> list[int]:
                return [int(step["STEP"][0, 0]) async for step in server.astream("counter", {"N": [[n]]})]

            return list(await asyncio.gather(collect(3), collect(1), collect(2)))

    assert asyncio.run(main()) == [[1, 2, 3], [1], [1, 2]]


def test_sync_stream_yields_steps_as_they_come(repo: RepoBuilder) -> None:
    repo.add("counter", COUNTER, COUNTER_MODEL)
    with nereid.Server(repo.root) as server:
        steps = [int(step["STEP"][0, 0]) for step in server.stream("counter", {"N": [[4]]})]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        pytest.param({"INPUT0": np.array([[1.5]], np.float32)}, "model 'add_one', input 'INPUT0': expected data type INT64 (numpy int64), got numpy float32", id="dtype"),
        pytest.param({"INPUT0": np.array([1], np.int64)}, "model 'add_one', input 'INPUT0': expected shape [-1, 1], got [1]", id="shape"),
        pytest.param({"INPUT0": np.ones((5, 1), np.int64)}, "model 'add_one', input 'INPUT0': expected a batch of 1..4 rows, got 5", id="batch"),
        pytest.param({"NOPE": [[1]]}, "unexpected inference input 'NOPE' for model 'add_one' (inputs: ['INPUT0'])", id="unknown"),
        pytest.param({}, "model 'add_one': missing required input 'INPUT0'", id="missing"),
    ],
)
def test_bad_inputs_are_refused_with_a_message_naming_model_input_expected_and_got(inputs: dict, message: str) -> None:  # type: ignore[type-arg]
    with examples() as server:
        with pytest.raises(nereid.InvalidInputError) as info:
            server.infer("add_one", inputs)
        assert str(info.value) == message
        assert server.infer("add_one", {"INPUT0": [[1]]})["OUTPUT0"].tolist() == [[2]]


def test_unknown_model_is_a_clear_error() -> None:
    with examples() as server:
        with pytest.raises(nereid.ModelNotFoundError, match="Request for unknown model: 'nope' is not found"):
            server.infer("nope", {})


AUTO = """
max_batch_size = 4
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [1]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [1]
"""

def test_gpus_are_counted_off_the_event_loop(repo: RepoBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU host the first count imports torch and initialises CUDA (4.5 s measured on
    # an H100 host, during which no request was answered): it must run on a worker thread.
    import threading

    import nereid.instances.devices

    probed_on: list[threading.Thread] = []

    def probe() -> int:
        probed_on.append(threading.current_thread())
        return 0

    monkeypatch.setattr(nereid.instances.devices, "_visible_gpus", probe)
    repo.add("auto", AUTO)  # identity model; no [[instance_group]]: KIND_AUTO

    async def main() -> tuple[threading.Thread, str]:
        async with nereid.Server(repo.root) as server:
            return threading.current_thread(), server.manager.get("auto").config.instance_group[0].kind

    loop_thread, kind = asyncio.run(main())
    assert kind == "KIND_CPU"
    assert len(probed_on) == 1 and probed_on[0] is not loop_thread


RELEASE_RECORDING_MODEL = """
import os
import threading

class Model:
    def __init__(self, context):
        self.path = os.path.join(context.model_dir, "released_by.txt")

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}

    def __del__(self):
        with open(self.path, "w") as file:
            file.write(threading.current_thread().name)
"""


@pytest.mark.thread_only("the model object lives in the instance's process, which exits with it: "
                         "no thread of the server holds or releases it")
@pytest.mark.parametrize("requests", [0, 3])
def test_an_unloaded_model_is_released_by_the_loop_not_by_its_instance_thread(
    repo: RepoBuilder, requests: int
) -> None:
    # A model released by its (daemon) instance thread could be torn down while the
    # interpreter shuts down; in 3.11 that aborts the process when the teardown needs the
    # GIL from C++ code (torch tensors). The instance thread must hold nothing of it.
    from tests.conftest import IDENTITY_CONFIG

    folder = repo.add("identity", IDENTITY_CONFIG, RELEASE_RECORDING_MODEL)

    async def scenario() -> str:
        async with nereid.Server(repo.root) as server:
            for _ in range(requests):
                await server.ainfer("identity", {"INPUT0": np.ones((1, 4), np.float32)})
        return threading.current_thread().name

    loop_thread = asyncio.run(scenario())
    gc.collect()
    assert (folder / "released_by.txt").read_text() == loop_thread
