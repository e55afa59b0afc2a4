"""Every HTTP engine serves the same protocol: native (the default), uvicorn, granian, hypercorn."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

from tests.conftest import IDENTITY_CONFIG, RepoBuilder

CONFIG = IDENTITY_CONFIG + """\
[dynamic_batching]
"""


@pytest.mark.parametrize("engine", ["native", "uvicorn", "granian", "hypercorn"])
def test_engine_serves_binary_and_json_infer_and_errors(serve, repo: RepoBuilder, engine: str) -> None:  # type: ignore[no-untyped-def]
    repo.add("identity", CONFIG)
    server = serve(repo.root, engine=engine)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    client = httpclient.InferenceServerClient(server.url)
    try:
        for binary in (True, False):
            tensor = httpclient.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(data, binary_data=binary)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            np.testing.assert_array_equal(client.infer("identity", [tensor], outputs=[output]).as_numpy("OUTPUT0"), data)
        with pytest.raises(httpclient.InferenceServerException) as info:
            client.get_model_metadata("missing")
        assert info.value.status() == "404"
        assert client.get_server_metadata()["extensions"]
    finally:
        client.close()

    async def aio() -> np.ndarray:
        async with aioclient.InferenceServerClient(server.url) as client:
            tensor = aioclient.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(data)
            result = await client.infer("identity", [tensor])
            return result.as_numpy("OUTPUT0")

    np.testing.assert_array_equal(asyncio.run(aio()), data)
