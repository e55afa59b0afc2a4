"""System shared memory end to end: tritonclient round trips, every bad request answered
with a clear error (and the server still serving), deferred unregister while a request is
in flight, the CPU-only CUDA answers, --allow-client-shm false, and perf_analyzer
--shared-memory system."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.conftest import IDENTITY_CONFIG, ROOT, RepoBuilder, RunningServer, free_port, start_server
from tests.e2e.test_perf_analyzer import SMOKE_WINDOWS
from tests.waiting import MODEL_GATE, wait_until

IDENTITY = IDENTITY_CONFIG + """\
[dynamic_batching]
max_queue_delay_microseconds = 100
"""

#: Holds each request until the test creates "open" beside model.py ("entered": it runs).
SLOW = """
class Model:
    def __init__(self, context):
        self.folder = context.model_dir
    def infer(self, inputs):
        (self.folder / "entered").touch()
        wait_for_file(self.folder / "open")
        return {"OUTPUT0": inputs["INPUT0"] + 1}
""" + MODEL_GATE

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("shm-models")
    repo = RepoBuilder(root / "models")
    repo.root.mkdir()
    repo.add("identity", IDENTITY)
    repo.add("slow", IDENTITY, model=SLOW)
    running = start_server(repo.root, "--metrics-port", str(free_port()), log_dir=root)
    yield running
    running.stop()


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions() -> Iterator[list[Any]]:
    handles: list[Any] = []
    yield handles
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def unique(name: str) -> str:
    return f"{name}_{os.getpid()}_{time.monotonic_ns()}"


def make_region(regions: list[Any], name: str, size: int) -> tuple[str, Any]:
    key = "/" + unique(name)
    handle = shm.create_shared_memory_region(name, key, size)
    regions.append(handle)
    return key, handle


def good_infer(server: RunningServer) -> None:
    """A plain request succeeds: the server is healthy after whatever came before."""
    client = httpclient.InferenceServerClient(server.url)
    try:
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def shm_infer_body(input_region: str, output_region: str, *, in_size: int = 16, in_offset: int = 0,
                   out_size: int = 16, out_offset: int = 0) -> dict[str, Any]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {
            "shared_memory_region": input_region, "shared_memory_byte_size": in_size,
            "shared_memory_offset": in_offset}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": output_region, "shared_memory_byte_size": out_size,
            "shared_memory_offset": out_offset}}],
    }


# -- the happy path -----------------------------------------------------------------------


def test_inputs_and_outputs_travel_through_registered_regions(
    server: RunningServer, client: httpclient.InferenceServerClient, regions: list[Any]
) -> None:
    in_key, in_handle = make_region(regions, "input", 64)
    out_key, out_handle = make_region(regions, "output", 64)
    data = np.array([[1.5, -2.0, 3.25, 1e6]], dtype=np.float32)
    shm.set_shared_memory_region(in_handle, [data], offset=16)
    client.register_system_shared_memory("input", in_key, 48, offset=16)
    client.register_system_shared_memory("output", out_key, 64)

    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_shared_memory("input", 16)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    wanted.set_shared_memory("output", 16, offset=8)
    result = client.infer("identity", [tensor], outputs=[wanted])

    # The response names the output; its data is in the region, not in the body.
    assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}
    out = shm.get_contents_as_numpy(out_handle, np.float32, [1, 4], offset=8)
    np.testing.assert_array_equal(out, data)
    assert client.get_system_shared_memory_status() == [
        {"name": "input", "key": in_key, "offset": 16, "byte_size": 48},
        {"name": "output", "key": out_key, "offset": 0, "byte_size": 64},
    ]
    assert client.get_system_shared_memory_status("output") == [
        {"name": "output", "key": out_key, "offset": 0, "byte_size": 64}
    ]
    client.unregister_system_shared_memory("input")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["output"]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []


def test_concurrent_shm_requests_each_get_their_own_rows_back(
    server: RunningServer, client: httpclient.InferenceServerClient, regions: list[Any]
) -> None:
    handles = []
    for i in range(6):
        in_key, in_handle = make_region(regions, f"cin{i}", 16)
        out_key, out_handle = make_region(regions, f"cout{i}", 16)
        shm.set_shared_memory_region(in_handle, [np.full((1, 4), i, dtype=np.float32)])
        client.register_system_shared_memory(f"cin{i}", in_key, 16)
        client.register_system_shared_memory(f"cout{i}", out_key, 16)
        handles.append(out_handle)

    def run(i: int) -> int:
        return httpx.post(f"{server.http}/v2/models/identity/infer", json=shm_infer_body(f"cin{i}", f"cout{i}"),
                          timeout=30).status_code

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert list(pool.map(run, range(6))) == [200] * 6
    for i, handle in enumerate(handles):
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 4]), np.full((1, 4), i))


def test_server_metadata_advertises_the_shared_memory_extensions(client: httpclient.InferenceServerClient) -> None:
    extensions = client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" in extensions


def test_unregister_during_inference_is_deferred_until_the_request_is_done(
    server: RunningServer, client: httpclient.InferenceServerClient, regions: list[Any]
) -> None:
    in_key, in_handle = make_region(regions, "slow_in", 16)
    out_key, out_handle = make_region(regions, "slow_out", 16)
    shm.set_shared_memory_region(in_handle, [np.ones((1, 4), dtype=np.float32)])
    client.register_system_shared_memory("slow_in", in_key, 16)
    client.register_system_shared_memory("slow_out", out_key, 16)
    body = shm_infer_body("slow_in", "slow_out")
    outcome: dict[str, Any] = {}

    def run() -> None:
        outcome["response"] = httpx.post(f"{server.http}/v2/models/slow/infer", json=body, timeout=30)

    command = server.process.args
    assert isinstance(command, list)
    folder = Path(command[command.index("--model-repository") + 1]) / "slow"
    worker = threading.Thread(target=run)
    worker.start()
    wait_until(lambda: (folder / "entered").exists(), "the request in flight")
    assert httpx.post(f"{server.http}/v2/systemsharedmemory/unregister").status_code == 200
    # Triton keeps regions in use listed until their requests complete.
    assert sorted(r["name"] for r in client.get_system_shared_memory_status()) == ["slow_in", "slow_out"]
    (folder / "open").touch()
    worker.join(30)
    assert outcome["response"].status_code == 200, outcome["response"].text
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_handle, np.float32, [1, 4]), np.full((1, 4), 2, np.float32)
    )
    assert client.get_system_shared_memory_status() == []


# -- bad requests: a clear error each, and the server keeps serving ----------------------


def test_unknown_region_in_infer_is_404(server: RunningServer) -> None:
    reply = httpx.post(f"{server.http}/v2/models/identity/infer", json=shm_infer_body("nope", "nope"))
    assert (reply.status_code, reply.json()) == (404, {"error": "Unable to find shared memory region: 'nope'"})
    good_infer(server)


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        pytest.param({"in_offset": 64}, 400,
                     "Invalid offset for shared memory region: 'in' (offset 64 is beyond the region's 32 bytes)",
                     id="input-offset-beyond-region"),
        pytest.param({"in_offset": 24}, 400,
                     "Invalid offset + byte size for shared memory region: 'in' "
                     "(offset 24 + byte size 16 > region size 32)", id="input-size-beyond-region"),
        pytest.param({"out_offset": 8, "out_size": 32}, 400,
                     "Invalid offset + byte size for shared memory region: 'out' "
                     "(offset 8 + byte size 32 > region size 32)", id="output-beyond-region"),
        pytest.param({"in_size": 32}, 400, "input byte size mismatch", id="input-byte-size-mismatch"),
        pytest.param({"out_size": 8}, 500, "should be at least 16 bytes to hold the results",
                     id="output-region-too-small"),
    ],
)
def test_bad_offsets_and_sizes_in_infer_name_the_region(
    server: RunningServer, client: httpclient.InferenceServerClient, regions: list[Any],
    change: dict[str, int], status: int, message: str,
) -> None:
    in_key, _ = make_region(regions, "in", 32)
    out_key, _ = make_region(regions, "out", 32)
    client.register_system_shared_memory("in", in_key, 32)
    client.register_system_shared_memory("out", out_key, 32)
    reply = httpx.post(f"{server.http}/v2/models/identity/infer", json=shm_infer_body("in", "out", **change))
    assert reply.status_code == status
    assert message in reply.json()["error"]
    good_infer(server)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param({"key": "/a/b", "byte_size": 8}, 400,
                     "failed to register shared memory region 'r': invalid key '/a/b'", id="key-with-slash"),
        pytest.param({"key": "/../etc/passwd", "byte_size": 8}, 400,
                     "failed to register shared memory region 'r': invalid key '/../etc/passwd'", id="key-with-dotdot"),
        pytest.param({"key": "..", "byte_size": 8}, 400, "invalid key '..'", id="key-dotdot"),
        pytest.param({"key": "/nereid_no_such_object", "byte_size": 8}, 500,
                     "Unable to open shared memory region: '/nereid_no_such_object'", id="missing-object"),
        pytest.param({"key": "/triton_python_backend_shm_region_1", "byte_size": 8}, 400,
                     "as the key contains the reserved prefix 'triton_python_backend_shm_region_'", id="reserved-key"),
        pytest.param({"byte_size": 8}, 400, "Shared memory register request has no 'key' field", id="no-key"),
        pytest.param({"key": "/x"}, 400, "Shared memory register request has no 'byte_size' field", id="no-byte-size"),
        pytest.param({"key": 5, "byte_size": 8}, 500, "Unable to parse 'key'", id="key-not-a-string"),
        pytest.param({"key": "/x", "byte_size": -1}, 500, "Unable to parse 'byte_size'", id="negative-byte-size"),
    ],
)
def test_bad_registrations_are_refused_with_a_clear_error(
    server: RunningServer, body: dict[str, Any], status: int, message: str
) -> None:
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/region/r/register", json=body)
    assert reply.status_code == status
    assert message in reply.json()["error"]
    assert httpx.get(f"{server.http}/v2/systemsharedmemory/status").json() == []
    good_infer(server)


def test_registration_beyond_the_object_is_invalid_args(server: RunningServer, regions: list[Any]) -> None:
    key, _ = make_region(regions, "small", 64)
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/region/small/register",
                       json={"key": key, "offset": 8, "byte_size": 64})
    assert reply.status_code == 400
    assert reply.json()["error"] == (
        f"failed to register shared memory region 'small': invalid args (offset 8 + byte_size 64 > 64 bytes in '{key}')"
    )
    good_infer(server)


def test_registering_a_name_twice_is_400(
    server: RunningServer, client: httpclient.InferenceServerClient, regions: list[Any]
) -> None:
    key, _ = make_region(regions, "twice", 16)
    client.register_system_shared_memory("twice", key, 16)
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/region/twice/register", json={"key": key, "byte_size": 16})
    assert (reply.status_code, reply.json()) == (400, {"error": "shared memory region 'twice' already in manager"})
    good_infer(server)


def test_empty_register_body_is_a_json_error(server: RunningServer) -> None:
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/region/r/register", content=b"")
    assert (reply.status_code, reply.json()) == (
        500, {"error": "failed to parse the request JSON buffer: The document is empty. at 0"}
    )


def test_unknown_names_status_is_404_and_unregister_is_200(server: RunningServer) -> None:
    status = httpx.get(f"{server.http}/v2/systemsharedmemory/region/ghost/status")
    assert (status.status_code, status.json()) == (404, {"error": "Unable to find system shared memory region: 'ghost'"})
    assert httpx.post(f"{server.http}/v2/systemsharedmemory/region/ghost/unregister").status_code == 200


def test_register_without_a_region_name_and_wrong_methods(server: RunningServer) -> None:
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/register", json={"key": "/x", "byte_size": 8})
    assert (reply.status_code, reply.json()) == (
        400, {"error": "'region name' is necessary to register system shared memory region"}
    )
    wrong = httpx.get(f"{server.http}/v2/systemsharedmemory/region/r/register")
    assert (wrong.status_code, wrong.json()) == (405, {"error": "Method Not Allowed"})
    assert httpx.post(f"{server.http}/v2/systemsharedmemory/status").status_code == 405


# -- CUDA shared memory on a server without GPU support -----------------------------------


def test_cuda_shared_memory_answers_like_a_cpu_only_triton(server: RunningServer) -> None:
    base = f"{server.http}/v2/cudasharedmemory"
    assert httpx.get(f"{base}/status").json() == []
    assert httpx.post(f"{base}/unregister").status_code == 200
    assert httpx.post(f"{base}/region/r/unregister").status_code == 200
    missing = httpx.get(f"{base}/region/r/status")
    assert (missing.status_code, missing.json()) == (404, {"error": "Unable to find cuda shared memory region: 'r'"})
    reply = httpx.post(f"{base}/region/r/register",
                       json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}, timeout=60)
    assert reply.status_code == 400
    if not _cuda_available():
        assert reply.json() == {"error": "failed to register CUDA shared memory region: 'r', GPUs not supported"}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# -- --allow-client-shm false -------------------------------------------------------------


def test_disabled_client_shm_refuses_register_and_unregister_with_501(
    serve: Any, repo: RepoBuilder, regions: list[Any]
) -> None:
    repo.add("identity", IDENTITY)
    server = serve(repo.root, "--allow-client-shm", "false", "--allow-metrics", "false")
    key, _ = make_region(regions, "off", 16)
    for url, body in (
        ("/v2/systemsharedmemory/region/off/register", {"key": key, "byte_size": 16}),
        ("/v2/systemsharedmemory/unregister", None),
        ("/v2/systemsharedmemory/region/off/unregister", None),
        ("/v2/cudasharedmemory/region/off/register", {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8}),
        ("/v2/cudasharedmemory/unregister", None),
    ):
        reply = httpx.post(server.http + url, json=body)
        assert (reply.status_code, reply.json()) == (501, {"error": DISABLED}), url
    assert httpx.get(f"{server.http}/v2/systemsharedmemory/status").json() == []
    good_infer(server)


# -- perf_analyzer ------------------------------------------------------------------------

PERF_ANALYZER = ROOT / "perf" / "perf_analyzer"


@pytest.mark.perf
@pytest.mark.timeout(300)
def test_perf_analyzer_runs_clean_with_system_shared_memory(server: RunningServer) -> None:
    if not (ROOT / ".tools" / "perf_analyzer" / "bin" / "perf_analyzer").exists() and not os.environ.get(
        "NEREID_PERF_ANALYZER_DIR"
    ):
        pytest.skip("perf_analyzer is not installed (make perf-analyzer)")
    with httpclient.InferenceServerClient(server.url) as one_off:
        before = one_off.get_inference_statistics("identity")["model_stats"][0]
    # checks correctness over shared memory, not speed
    run = subprocess.run(
        [str(PERF_ANALYZER), "-m", "identity", "-u", server.url, "-i", "http", "--shared-memory", "system",
         "--concurrency-range", "2", *SMOKE_WINDOWS],
        capture_output=True, text=True, timeout=240,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "error" not in output.lower(), output
    with httpclient.InferenceServerClient(server.url) as one_off:
        after = one_off.get_inference_statistics("identity")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] > before["inference_stats"]["success"]["count"]
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    # perf_analyzer unregisters its regions on exit.
    assert httpx.get(f"{server.http}/v2/systemsharedmemory/status").json() == []
    good_infer(server)
