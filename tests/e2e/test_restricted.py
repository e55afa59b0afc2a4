"""Restricted endpoint groups (Triton's --http-restricted-api / --grpc-restricted-protocol,
and --metrics-restricted-api) against a real server: a request without the group's key
gets Triton's status and message, one with it is served, unrestricted groups need
nothing, refusals are counted in /metrics, and the key never reaches the log."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RepoBuilder, RunningServer, free_port, start_server
from tests.e2e.test_grpc import CONFIG, ENGINES
from tests.waiting import START_TIMEOUT_S

KEY = "admin-key"
SECRET = "s3cret-Value-Do-Not-Log"
INFER_KEY = "infer-key"
INFER_SECRET = "infer-Secret-Do-Not-Log"
ADMIN = {KEY: SECRET}
INFER = {INFER_KEY: INFER_SECRET}
FLAGS = (
    "--model-control-mode", "explicit", "--load-model", "identity", "--log-verbose", "1",
    "--http-restricted-api", f"model-repository,shared-memory,logging:{KEY}={SECRET}",
    "--http-restricted-api", f"inference:{INFER_KEY}={INFER_SECRET}",
    "--grpc-restricted-protocol", f"model-repository,shared-memory,logging:{KEY}={SECRET}",
    "--grpc-restricted-protocol", f"inference:{INFER_KEY}={INFER_SECRET}",
)


@pytest.fixture(params=["native", "uvicorn"])
def server(repo: RepoBuilder, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    repo.add("identity", CONFIG)
    metrics_port = free_port()
    running = start_server(repo.root, *FLAGS, "--metrics-port", str(metrics_port), log_dir=tmp_path,
                           engine=request.param)
    running.metrics_port = metrics_port  # type: ignore[attr-defined]
    yield running
    running.stop()
    assert SECRET not in running.log() and INFER_SECRET not in running.log()


def _refused(response: httpx.Response, key: str) -> None:
    assert response.status_code == 403
    assert response.json() == {"error": f"This API is restricted, expecting header '{key}'"}


def _infer_body() -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_http_restricted_groups_need_their_key(server: RunningServer) -> None:
    with httpx.Client(base_url=server.http, timeout=30) as client:
        _refused(client.post("/v2/repository/index"), KEY)
        _refused(client.post("/v2/repository/index", headers={KEY: "wrong"}), KEY)
        _refused(client.post("/v2/repository/index", headers=INFER), KEY)  # another group's key
        assert client.post("/v2/repository/index", headers={"Admin-Key": SECRET}).status_code == 200
        _refused(client.post("/v2/repository/models/identity/unload"), KEY)
        _refused(client.get("/v2/systemsharedmemory/status"), KEY)
        _refused(client.post("/v2/logging", json={"log_verbose_level": 0}), KEY)
        assert client.get("/v2/logging", headers=ADMIN).status_code == 200
        # unrestricted groups: nothing needed
        assert client.get("/v2/health/ready").status_code == 200
        assert client.get("/v2/models/identity").status_code == 200
        assert client.get("/v2/models/identity/config").status_code == 200
        assert client.get("/v2/models/stats").status_code == 200
        # inference has its own key, on the fast path and on generate
        _refused(client.post("/v2/models/identity/infer", json=_infer_body()), INFER_KEY)
        _refused(client.post("/v2/models/identity/infer", json=_infer_body(), headers=ADMIN), INFER_KEY)
        _refused(client.post("/v2/models/identity/versions/1/infer", json=_infer_body()), INFER_KEY)
        _refused(client.post("/v2/models/identity/generate", json={}), INFER_KEY)
        answer = client.post("/v2/models/identity/infer", json=_infer_body(), headers=INFER)
        assert answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [1, 2, 3, 4]


def test_tritonclient_http_with_and_without_the_key(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    infer_input = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException, match=f"This API is restricted, expecting header '{INFER_KEY}'"):
        client.infer("identity", [infer_input])
    assert client.infer("identity", [infer_input], headers=INFER).as_numpy("OUTPUT0").tolist() == [[1, 1, 1, 1]]
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        client.unload_model("identity")
    client.unload_model("identity", headers=ADMIN)
    assert not client.is_model_ready("identity")
    client.load_model("identity", headers=ADMIN)
    assert client.is_model_ready("identity")
    client.close()


def test_repeated_infer_requests_are_each_checked(server: RunningServer) -> None:
    """The native engine takes byte-identical repeats of a request without parsing them:
    a refused request's repeats are refused too, an allowed one's are served."""
    body = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'

    def head(key_line: bytes) -> bytes:
        return (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n" + key_line
                + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))

    for key_line, status in ((b"infer-key: wrong\r\n", b"403"), (b"", b"403"),
                             (b"infer-key: " + INFER_SECRET.encode() + b"\r\n", b"200")):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            for _ in range(5):  # one at a time: each after the previous answer, as a repeat
                sock.sendall(head(key_line) + body)
                answer = _read_answer(sock)
                assert answer.split(b" ", 2)[1] == status, answer


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


def test_refusals_are_counted_in_metrics_by_group(server: RunningServer) -> None:
    with httpx.Client(base_url=server.http, timeout=30) as client:
        for _ in range(3):
            client.post("/v2/repository/index")
        client.post("/v2/models/identity/infer", json=_infer_body())
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        with pytest.raises(InferenceServerException):
            grpc_client.get_model_repository_index()
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30).text  # type: ignore[attr-defined]
    assert 'nereid_restricted_refusals{group="model-repository",protocol="http"} 3' in text
    assert 'nereid_restricted_refusals{group="inference",protocol="http"} 1' in text
    assert 'nereid_restricted_refusals{group="model-repository",protocol="grpc"} 1' in text


# -- gRPC -----------------------------------------------------------------------------------


@pytest.fixture(params=ENGINES)
def grpc_server(repo: RepoBuilder, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    repo.add("identity", CONFIG)
    running = start_server(repo.root, *FLAGS, "--grpc-server", request.param, log_dir=tmp_path)
    yield running
    running.stop()
    assert SECRET not in running.log() and INFER_SECRET not in running.log()


def _grpc_refused(exc: pytest.ExceptionInfo[InferenceServerException], key: str) -> None:
    assert exc.value.status() == "StatusCode.UNAVAILABLE"
    assert exc.value.message() == f"This protocol is restricted, expecting header 'triton-grpc-protocol-{key}'"


def test_grpc_restricted_groups_need_their_metadata_key(grpc_server: RunningServer) -> None:
    admin = {f"triton-grpc-protocol-{KEY}": SECRET}
    infer = {f"triton-grpc-protocol-{INFER_KEY}": INFER_SECRET}
    infer_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_repository_index()
        _grpc_refused(refused, KEY)
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_repository_index(headers={f"triton-grpc-protocol-{KEY}": "wrong"})
        _grpc_refused(refused, KEY)
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_repository_index(headers={KEY: SECRET})  # the HTTP spelling is not the gRPC one
        _grpc_refused(refused, KEY)
        assert [m.name for m in client.get_model_repository_index(headers=admin).models] == ["identity"]
        with pytest.raises(InferenceServerException) as refused:
            client.get_system_shared_memory_status()
        _grpc_refused(refused, KEY)
        with pytest.raises(InferenceServerException) as refused:
            client.get_log_settings()
        _grpc_refused(refused, KEY)
        assert client.is_server_ready() and client.get_model_config("identity").config.name == "identity"
        with pytest.raises(InferenceServerException) as refused:
            client.infer("identity", [infer_input], headers=admin)
        _grpc_refused(refused, INFER_KEY)
        assert client.infer("identity", [infer_input], headers=infer).as_numpy("OUTPUT0").tolist() == [[1, 1, 1, 1]]


def test_grpc_stream_needs_the_inference_key(grpc_server: RunningServer) -> None:
    import queue

    infer_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
    for headers, refused in ((None, True), ({f"triton-grpc-protocol-{INFER_KEY}": INFER_SECRET}, False)):
        results: queue.Queue[Any] = queue.Queue()
        with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
            client.start_stream(lambda result, error: results.put((result, error)), headers=headers)
            try:
                client.async_stream_infer("identity", [infer_input])
            except InferenceServerException:
                assert refused  # the stream was ended at once (as Triton ends it), before this request
            result, error = results.get(timeout=30)
            client.stop_stream()
        if refused:
            assert error is not None and "This protocol is restricted" in error.message()
        else:
            assert error is None and result.as_numpy("OUTPUT0").tolist() == [[1, 1, 1, 1]]


# -- health, metrics, start-up --------------------------------------------------------------


def test_restricted_health_and_metrics(repo: RepoBuilder, tmp_path: Path) -> None:
    repo.add("identity", CONFIG)
    metrics_port = free_port()
    server = start_server(
        repo.root, "--http-restricted-api", f"health:{KEY}={SECRET}", "--metrics-restricted-api", f"scrape={SECRET}",
        "--metrics-port", str(metrics_port), log_dir=tmp_path, ready_headers=ADMIN,
    )
    try:
        _refused(httpx.get(f"{server.http}/v2/health/live", timeout=30), KEY)
        _refused(httpx.get(f"{server.http}/v2/models/identity/ready", timeout=30), KEY)  # model ready is health
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        _refused(httpx.get(metrics, timeout=30), "scrape")
        scraped = httpx.get(metrics, headers={"scrape": SECRET}, timeout=30)
        assert scraped.status_code == 200
        assert 'nereid_restricted_refusals{group="health",protocol="http"} 2' in scraped.text
        assert 'nereid_restricted_refusals{group="metrics",protocol="metrics"} 1' in scraped.text
    finally:
        server.stop()
    assert SECRET not in server.log()


def test_a_group_in_two_flags_stops_the_server_as_triton_does(repo: RepoBuilder) -> None:
    repo.add("identity", CONFIG)
    result = subprocess.run(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo.root),
         "--http-restricted-api", "model-repository,health:k1=v1", "--http-restricted-api", f"metadata,health:k2={SECRET}"],
        capture_output=True, text=True, timeout=START_TIMEOUT_S,
    )
    assert result.returncode == 2
    assert "--http-restricted-api: group 'health' can not be specified in multiple config groups" in result.stderr
    assert SECRET not in result.stderr
