"""A model that failed to load answers why, over both protocols: an infer gets Triton's
status and words followed by the reason the repository index holds, and its ready
endpoint says the same where the protocol has room for it (HTTP's body; gRPC's
ModelReadyResponse carries only ``ready``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer, start_server

FAILING_INIT = """
class Model:
    def __init__(self, context):
        raise RuntimeError("weights file missing")

    def infer(self, inputs):
        return {}
"""


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unavailable-repo")


@pytest.fixture(scope="module")
def server(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = RepoBuilder(repo_root)
    repo.add("fine", IDENTITY_CONFIG)
    repo.add("no_weights", IDENTITY_CONFIG, FAILING_INIT)
    repo.add("typo", IDENTITY_CONFIG.replace("max_batch_size", "max_batch_sise"))
    running = start_server(repo_root, "--strict-readiness", "false", log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    running.stop()


def reasons(repo_root: Path) -> dict[str, str]:
    """The reason each broken model gives, as the index holds it."""
    config = repo_root / "typo" / ("config.toml" if (repo_root / "typo" / "config.toml").exists() else "config.pbtxt")
    return {
        "no_weights": "version 1 is UNAVAILABLE: "
                      f"{repo_root}/no_weights/model.py: Model.__init__ failed for instance no_weights_0: "
                      "RuntimeError: weights file missing",
        "typo": f'UNAVAILABLE: {config}: unknown key "max_batch_sise" (did you mean "max_batch_size"?)',
    }


@pytest.mark.parametrize("model", ["no_weights", "typo"])
def test_infer_on_a_model_that_failed_to_load_says_why_over_http_and_grpc(
    server: RunningServer, repo_root: Path, model: str
) -> None:
    expected = f"Request for unknown model: '{model}' has no available versions; {reasons(repo_root)[model]}"
    with httpx.Client(base_url=server.http, timeout=30) as http:
        index = {row["name"]: row for row in http.post("/v2/repository/index").json()}
    assert expected.endswith(index[model]["reason"]), index[model]

    data = np.ones((1, 4), np.float32)
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as over_http:
        client.infer(model, [x])
    assert (over_http.value.status(), over_http.value.message()) == ("404", expected)
    assert not client.is_model_ready(model)
    np.testing.assert_array_equal(client.infer("fine", [x]).as_numpy("OUTPUT0"), data)
    client.close()

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    y = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    y.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as over_grpc:
        grpc.infer(model, [y])
    assert (over_grpc.value.status(), over_grpc.value.message()) == ("StatusCode.NOT_FOUND", expected)
    assert not grpc.is_model_ready(model)
    grpc.close()


@pytest.mark.parametrize("model", ["no_weights", "typo"])
def test_the_ready_endpoint_of_a_model_that_failed_to_load_says_why(
    server: RunningServer, repo_root: Path, model: str
) -> None:
    with httpx.Client(base_url=server.http, timeout=30) as http:
        for path in (f"/v2/models/{model}/ready", f"/v2/models/{model}/versions/1/ready"):
            response = http.get(path)
            assert response.status_code == 400, path
            message = response.json()["error"]
            assert message.startswith("Model version not ready: Request for unknown model: "), message
            reason = reasons(repo_root)[model].split(": ", 1)[1]
            assert message.endswith(reason), (path, message)
        assert http.get("/v2/models/fine/ready").status_code == 200
