"""A client that goes away while its request is queued takes the request with it."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder
from tests.waiting import wait_until

CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [2]
[dynamic_batching]
max_queue_delay_microseconds = 1500000
"""


@pytest.mark.parametrize("engine", ["native", "uvicorn", "hypercorn"])  # one infer flow, engines' own disconnects
def test_a_request_whose_client_disconnects_while_queued_is_never_executed(serve, repo: RepoBuilder, engine: str) -> None:  # type: ignore[no-untyped-def]
    repo.add("slow_batch", CONFIG)
    server = serve(repo.root, engine=engine)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    request = (
        f"POST /v2/models/slow_batch/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        # queued: the batch waits 1.5 s for company
        wait_until(lambda: server.gauge("nv_inference_pending_request_count", "slow_batch") == 1, "the request queued")
    # The departed request must not be batched with this one.
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[3, 4]], np.float32))
    result = client.infer("slow_batch", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(result, [[3, 4]])
    stats = client.get_inference_statistics("slow_batch")["model_stats"][0]
    client.close()
    assert stats["inference_count"] == 1
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(1, 1)]
    assert stats["inference_stats"]["fail"]["count"] == 1  # counted as cancelled
