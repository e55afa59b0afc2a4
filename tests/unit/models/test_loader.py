"""The model manager with its real loader: tiny in-process models from a temporary
repository, reached through the serving handle (infer, stream); no HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from nereid.errors import ModelLoadError, ModelNotFoundError
from nereid.inference import InferRequest
from nereid.models.manager import ModelManager
from tests.conftest import IDENTITY_CONFIG, IDENTITY_MODEL, RepoBuilder

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
[model_transaction_policy]
decoupled = true
"""

#: Yields steps 1..N for each request, marking a request finished at its N.
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


#: IDENTITY_CONFIG whose output has labels.
LABELLED = IDENTITY_CONFIG.rstrip() + '\nlabel_filename = "labels.txt"\n'

#: The identity model, which leaves a file behind when it is closed.
CLOSING_MODEL = IDENTITY_MODEL.replace("        pass", "        self.folder = context.model_dir") + """
    def close(self):
        (self.folder / "closed").write_text("yes")
"""


def run(repo: RepoBuilder, scenario: Any, *startup: str) -> None:
    async def main() -> None:
        manager = ModelManager(repo.root, mode="explicit", startup_models=startup)
        await manager.start()
        try:
            await scenario(manager)
        finally:
            await manager.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


def identity_request() -> InferRequest:
    return InferRequest("m", {"INPUT0": np.arange(4, dtype=np.float32).reshape(1, 4)})


def test_a_loaded_model_serves_through_its_handle_and_closes_on_unload(repo: RepoBuilder) -> None:
    folder = repo.add("m", LABELLED, CLOSING_MODEL, files={"labels.txt": "zero\none\n"})

    async def scenario(manager: ModelManager) -> None:
        serving = manager.get("m")
        outputs = await serving.infer(identity_request())
        assert outputs["OUTPUT0"].tolist() == [[0.0, 1.0, 2.0, 3.0]]
        assert serving.labels == {"OUTPUT0": ["zero", "one"]}
        assert (serving.queue_depth, serving.executing) == (0, 0)
        assert serving.config_json["max_batch_size"] == 8
        await manager.unload("m")
        assert serving.retired and (folder / "closed").read_text() == "yes"
        with pytest.raises(ModelNotFoundError, match="has no available versions"):
            await serving.infer(identity_request())

    run(repo, scenario, "m")


def test_the_loader_reports_why_a_model_did_not_load(repo: RepoBuilder) -> None:
    repo.add("broken", IDENTITY_CONFIG, "import not_a_module_xyz\n")
    repo.add("unlabelled", LABELLED, IDENTITY_MODEL)

    async def scenario(manager: ModelManager) -> None:
        with pytest.raises(ModelLoadError, match="No module named 'not_a_module_xyz'"):
            await manager.load("broken")
        with pytest.raises(ModelLoadError, match="label_filename of output 'OUTPUT0' not found"):
            await manager.load("unlabelled")
        states = {entry.name: (entry.state, entry.reason) for entry in manager.states()}
        assert states["broken"][0] == states["unlabelled"][0] == "UNAVAILABLE"
        assert "import failed: ModuleNotFoundError" in states["broken"][1]

    run(repo, scenario)


def test_stream_yields_a_decoupled_models_steps_and_follows_a_reload(repo: RepoBuilder) -> None:
    repo.add("counter", COUNTER, COUNTER_MODEL)

    def request(n: int) -> InferRequest:
        return InferRequest("counter", {"N": np.array([[n]], np.int32)})

    async def scenario(manager: ModelManager) -> None:
        held = manager.get("counter")
        assert [int(step["STEP"][0, 0]) async for step in held.stream(request(3))] == [1, 2, 3]
        await manager.load("counter")  # a reload: the held handle follows its successor
        assert held.retired and held.successor is manager.get("counter")
        assert [int(step["STEP"][0, 0]) async for step in held.stream(request(2))] == [1, 2]
        # Closing early takes the request away (its steps stop), and the model serves on.
        steps = held.stream(request(50))
        assert int((await steps.__anext__())["STEP"][0, 0]) == 1
        await steps.aclose()
        assert [int(step["STEP"][0, 0]) async for step in held.stream(request(1))] == [1]
        await manager.unload("counter")
        unloaded = held.stream(request(1))  # looked up lazily: the error comes with the first step
        with pytest.raises(ModelNotFoundError, match="'counter' has no available versions"):
            await unloaded.__anext__()

    run(repo, scenario, "counter")
