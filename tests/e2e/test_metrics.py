"""The metrics port end to end: scrape before and after traffic and check the deltas,
labels and histogram buckets; Triton's answers for other paths and methods; the port
under every HTTP engine; --allow-metrics false; two servers in one process."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer, free_port, start_server

BATCHED = IDENTITY_CONFIG + """\
[dynamic_batching]
max_queue_delay_microseconds = 200000
"""

POISONED = """
import numpy as np
class Model:
    def __init__(self, context):
        pass
    def infer(self, inputs):
        x = inputs["INPUT0"]
        if np.any(x == -1):
            raise ValueError("negative one is poison")
        return {"OUTPUT0": x}
"""

SAMPLE = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``GET /metrics`` as {(name, labels): value}."""
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/plain; charset=utf-8"
    samples = {}
    for line in reply.text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def series(model: str, **extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({("model", model), ("version", "1"), *extra.items()})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("metrics-models")
    repo = RepoBuilder(root / "models")
    repo.root.mkdir()
    repo.add("batched", BATCHED, model=POISONED)
    port = free_port()
    running = start_server(repo.root, "--metrics-port", str(port), log_dir=root)
    running.metrics_port = port  # type: ignore[attr-defined]
    yield running
    running.stop()


def infer(url: str, value: float) -> Any:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
        return client.infer("batched", [tensor]).as_numpy("OUTPUT0")
    except InferenceServerException as exc:
        return exc
    finally:
        client.close()


def test_counters_and_histograms_move_with_traffic(server: RunningServer) -> None:
    port = server.metrics_port  # type: ignore[attr-defined]
    before = scrape(port)
    labels = series("batched")
    # Four requests at once wait out the 200 ms queue delay together: one batch of 4.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda v: infer(server.url, v), [1.0, 2.0, 3.0, 4.0]))
    assert all(isinstance(r, np.ndarray) for r in results), results
    assert isinstance(infer(server.url, -1.0), InferenceServerException)  # a backend failure
    after = scrape(port)

    def delta(name: str, which: frozenset[tuple[str, str]] = labels) -> float:
        return after[(name, which)] - before.get((name, which), 0.0)

    assert delta("nv_inference_request_success") == 4
    assert delta("nv_inference_request_failure", series("batched", reason="BACKEND")) == 1
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert delta("nv_inference_request_failure", series("batched", reason=reason)) == 0
    assert delta("nv_inference_count") == 4
    executions = delta("nv_inference_exec_count")
    assert 1 <= executions <= 4
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert delta(name) > 0, name
    # Batch sizes: every execution counted once, rows add up to the inference count.
    assert delta("nereid_batch_size_count") == executions
    assert delta("nereid_batch_size_sum") == 4
    assert delta("nereid_batch_size_bucket", series("batched", le="+Inf")) == executions
    assert delta("nereid_batch_size_bucket", series("batched", le="4")) == executions
    # Queue times: one observation per successful request, buckets cumulative.
    assert delta("nereid_queue_duration_us_count") == 4
    queue_buckets = [after[("nereid_queue_duration_us_bucket", series("batched", le=le))]
                     for le in ("50", "1000", "100000", "1000000", "+Inf")]
    assert queue_buckets == sorted(queue_buckets)
    assert after[("nv_inference_pending_request_count", labels)] == 0


def test_metrics_agree_with_the_statistics_endpoint(server: RunningServer) -> None:
    assert isinstance(infer(server.url, 5.0), np.ndarray)
    samples = scrape(server.metrics_port)  # type: ignore[attr-defined]
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("batched")["model_stats"][0]
    client.close()
    labels = series("batched")
    assert samples[("nv_inference_request_success", labels)] == stats["inference_stats"]["success"]["count"]
    assert samples[("nv_inference_count", labels)] == stats["inference_count"]
    assert samples[("nv_inference_exec_count", labels)] == stats["execution_count"]
    assert samples[("nv_inference_queue_duration_us", labels)] == stats["inference_stats"]["queue"]["ns"] // 1000


def test_metrics_port_answers_like_triton_for_other_paths_and_methods(server: RunningServer) -> None:
    base = f"http://127.0.0.1:{server.metrics_port}"  # type: ignore[attr-defined]
    assert "nv_inference_count" in httpx.get(base + "/metrics/").text
    other = httpx.get(base + "/v2/health/live")
    assert (other.status_code, other.content) == (200, b"")
    for method in ("POST", "PUT", "DELETE"):
        refused = httpx.request(method, base + "/metrics")
        assert (refused.status_code, refused.json()) == (405, {"error": "Method Not Allowed"})


@pytest.mark.parametrize("engine", ["uvicorn", "hypercorn", "granian"])
def test_metrics_are_served_under_every_http_engine(serve: Any, repo: RepoBuilder, engine: str) -> None:
    repo.add("batched", BATCHED, model=POISONED)
    port = free_port()
    running = serve(repo.root, "--metrics-port", str(port), engine=engine)
    assert isinstance(infer(running.url, 1.0), np.ndarray)
    assert scrape(port)[("nv_inference_request_success", series("batched"))] == 1


def test_allow_metrics_false_turns_the_port_off(serve: Any, repo: RepoBuilder) -> None:
    repo.add("batched", BATCHED, model=POISONED)
    port = free_port()
    serve(repo.root, "--metrics-port", str(port), "--allow-metrics", "false")
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_busy_metrics_port_is_logged_and_http_still_serves(serve: Any, repo: RepoBuilder) -> None:
    repo.add("batched", BATCHED, model=POISONED)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        running = serve(repo.root, "--metrics-port", str(port))
        assert isinstance(infer(running.url, 1.0), np.ndarray)
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in running.log()


@pytest.mark.without_workers("in process: no server")
def test_two_servers_in_one_process_never_share_counters(repo: RepoBuilder, tmp_path: Path) -> None:
    from nereid.options import ServerOptions
    from nereid.server import Server

    repo.add("batched", BATCHED, model=POISONED)
    servers = [
        Server(ServerOptions(model_repository=repo.root, http_port=free_port(), metrics_port=free_port(),
                             grpc_port=free_port()))
        for _ in range(2)
    ]
    loop = asyncio.new_event_loop()

    async def serve_both() -> None:
        await asyncio.gather(*(s.serve() for s in servers))

    thread = threading.Thread(target=loop.run_until_complete, args=(serve_both(),))
    thread.start()
    try:
        for server in servers:
            url = f"http://127.0.0.1:{server.options.http_port}/v2/health/ready"
            for _ in range(200):
                try:
                    if httpx.get(url).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                threading.Event().wait(0.05)
        first, second = servers
        assert isinstance(infer(f"127.0.0.1:{first.options.http_port}", 1.0), np.ndarray)
        labels = series("batched")
        assert scrape(first.options.metrics_port)[("nv_inference_request_success", labels)] == 1
        assert scrape(second.options.metrics_port)[("nv_inference_request_success", labels)] == 0
    finally:
        for server in servers:
            loop.call_soon_threadsafe(server.shutdown)
        thread.join(60)
        loop.close()
