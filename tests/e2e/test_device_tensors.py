"""``input_tensors = "torch"``: a model gets its inputs as torch tensors on its device
(here the CPU; tests/gpu covers CUDA), in thread and process instances alike."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder

pytest.importorskip("torch")

CONFIG = """
max_batch_size = 8
input_tensors = "torch"
[[input]]
name = "IDS"
data_type = "TYPE_INT64"
dims = [3]
[[output]]
name = "DOUBLED"
data_type = "TYPE_INT64"
dims = [3]
[[output]]
name = "KIND"
data_type = "TYPE_STRING"
dims = [1]
[dynamic_batching]
[[instance_group]]
kind = "KIND_CPU"
isolation = "{isolation}"
"""

MODEL = """
import torch

class Model:
    def infer(self, inputs):
        ids = inputs["IDS"]
        kind = type(ids).__module__ + "." + type(ids).__name__ + "@" + str(ids.device)
        return {"DOUBLED": ids * 2, "KIND": [[kind]] * ids.shape[0]}
"""


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_model_asking_for_torch_tensors_gets_them_and_may_return_them(
    serve, repo: RepoBuilder, isolation: str  # type: ignore[no-untyped-def]
) -> None:
    repo.add("tensors", CONFIG.format(isolation=isolation), MODEL)
    server = serve(repo.root)
    client = httpclient.InferenceServerClient(server.url)
    try:
        ids = httpclient.InferInput("IDS", [2, 3], "INT64")
        ids.set_data_from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))
        result = client.infer("tensors", [ids])
        config = client.get_model_config("tensors")
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), np.arange(6).reshape(2, 3) * 2)
    assert list(result.as_numpy("KIND").reshape(-1)) == [b"torch.Tensor@cpu"] * 2
    assert config["parameters"]["input_tensors"] == {"string_value": "torch"}
