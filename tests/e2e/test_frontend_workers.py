"""--http-workers: several front-end processes serve the HTTP port; the models, their
batches and the statistics stay in the main process.

Which worker serves a connection is read from outside, as an operator would: the
server-side socket of the connection (/proc/net/tcp) and the worker process that holds
it (/proc/<pid>/fd). Linux only, like SO_REUSEPORT's spreading.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder, RunningServer
from tests.waiting import START_TIMEOUT_S, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see which worker holds a connection")

MiB = 1 << 20

IDENTITY = """
name = "{name}"
max_batch_size = {batch}
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [4]
{extra}
"""


def worker_pids(server: RunningServer) -> set[int]:
    """The server's front-end worker processes (its children running the worker)."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server.process.pid and b"nereid.frontends.worker" in command:
            pids.add(int(entry))
    return pids


def serving_worker(server: RunningServer, client_port: int) -> int | None:
    """The pid of the worker holding the server side of the connection from ``client_port``."""
    wanted = (f"0100007F:{server.port:04X}", f"0100007F:{client_port:04X}")
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (fields[1], fields[2]) == wanted:
            inode = fields[9]
    if inode is None:
        return None
    for pid in worker_pids(server):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pid
    return None


def open_connections(server: RunningServer, per_worker: int) -> list[http.client.HTTPConnection]:
    """``per_worker`` live connections on each of the server's two workers (connections
    are opened, and each answered once, until the kernel has spread enough to each)."""
    by_worker: dict[int, list[http.client.HTTPConnection]] = {}
    spare = []
    for _ in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().read() == b""
        pid = wait_until(lambda: serving_worker(server, connection.sock.getsockname()[1]), "the connection's worker")
        held = by_worker.setdefault(pid, [])
        (held if len(held) < per_worker else spare).append(connection)
        if len(by_worker) == 2 and all(len(held) == per_worker for held in by_worker.values()):
            break
    for connection in spare:
        connection.close()
    assert len(by_worker) == 2, f"connections reached {len(by_worker)} worker(s)"
    return [connection for held in by_worker.values() for connection in held]


def infer_body(values: list[float]) -> bytes:
    shape = [1, len(values)]
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": values}]}).encode()


def test_infer_with_binary_and_json_tensors_through_two_workers(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra="[dynamic_batching]"))
    server = serve(repo.root, "--http-workers", "2")
    assert len(worker_pids(server)) == 2
    clients = [httpclient.InferenceServerClient(server.url) for _ in range(6)]
    for index, client in enumerate(clients):
        for binary in (True, False):
            data = np.full((1, 4), index, dtype=np.float32)
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data, binary_data=binary)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
            result = client.infer("identity", [tensor], outputs=[output])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    stats = clients[0].get_inference_statistics("identity")["model_stats"][0]
    assert stats["inference_count"] == 12
    assert clients[0].is_model_ready("identity")
    assert clients[0].get_model_metadata("identity")["inputs"][0]["name"] == "INPUT0"


def test_a_bad_infer_request_is_refused_through_a_worker_and_the_next_one_succeeds(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v2/models/identity/infer", body=infer_body([1.0, 2.0]))
    response = connection.getresponse()
    assert response.status == 400
    assert "unexpected shape for input 'INPUT0'" in json.loads(response.read())["error"]
    connection.request("POST", "/v2/models/identity/infer", body=infer_body([1.0, 2.0, 3.0, 4.0]))
    response = connection.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    connection.close()


def test_one_batch_holds_requests_that_came_through_different_workers(repo: RepoBuilder, serve) -> None:
    # the batch leaves only when all 8 requests are queued (a 1000 s delay otherwise)
    extra = "[dynamic_batching]\npreferred_batch_size = [8]\nmax_queue_delay_microseconds = 1000000000"
    repo.add("gather", IDENTITY.format(name="gather", batch=8, extra=extra))
    server = serve(repo.root, "--http-workers", "2")
    connections = open_connections(server, per_worker=4)
    answers: list[int] = []

    def infer(connection: http.client.HTTPConnection, value: float) -> None:
        connection.request("POST", "/v2/models/gather/infer", body=infer_body([value] * 4))
        response = connection.getresponse()
        body = json.loads(response.read())
        assert response.status == 200, body
        assert body["outputs"][0]["data"] == [value] * 4
        answers.append(response.status)

    threads = [threading.Thread(target=infer, args=(connection, float(index)))
               for index, connection in enumerate(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(START_TIMEOUT_S)
    for connection in connections:
        connection.close()
    assert answers == [200] * 8
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("gather")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (8, 1)
    assert {stats["batch_stats"][0]["batch_size"]} == {8}


def test_a_killed_worker_is_restarted_and_the_server_keeps_answering(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2")
    before = worker_pids(server)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | None:
        pids = worker_pids(server)
        return pids if len(pids) == 2 and victim not in pids else None

    after = wait_until(replaced, "a worker in place of the killed one", timeout=START_TIMEOUT_S)
    assert after - before and not (before - after) - {victim}
    wait_until(lambda: "exited with status -9" in server.log(), "the log saying the worker died")
    for index in range(12):  # new connections, spread over both workers, all answered
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", "/v2/models/identity/infer", body=infer_body([float(index)] * 4))
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["outputs"][0]["data"] == [float(index)] * 4
        connection.close()


def test_a_dead_worker_fails_only_the_requests_it_held(repo: RepoBuilder, serve) -> None:
    extra = "[dynamic_batching]\npreferred_batch_size = [8]\nmax_queue_delay_microseconds = 1000000000"
    repo.add("gather", IDENTITY.format(name="gather", batch=8, extra=extra))
    server = serve(repo.root, "--http-workers", "2")
    connections = open_connections(server, per_worker=3)  # 3 on one worker, then 3 on the other
    victim = serving_worker(server, connections[0].sock.getsockname()[1])
    outcomes: dict[int, object] = {}

    def infer(index: int, connection: http.client.HTTPConnection) -> None:
        try:
            connection.request("POST", "/v2/models/gather/infer", body=infer_body([float(index)] * 4))
            response = connection.getresponse()
            outcomes[index] = json.loads(response.read())["outputs"][0]["data"]
        except (ConnectionError, http.client.HTTPException) as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=infer, args=(index, connection)) for index, connection in enumerate(connections)]
    for thread in threads:
        thread.start()
    wait_until(lambda: server.gauge("nv_inference_pending_request_count", "gather") == 6, "6 requests queued")
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    # the dead worker's 3 requests leave the queue; the other worker's 3 stay
    wait_until(lambda: server.gauge("nv_inference_pending_request_count", "gather") == 3, "3 requests left queued")
    # 5 more, through any worker (the restarted one included), fill the batch
    fresh = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=60) for _ in range(5)]
    late = [threading.Thread(target=infer, args=(index, connection)) for index, connection in enumerate(fresh, 6)]
    for thread in late:
        thread.start()
    for thread in threads + late:
        thread.join(START_TIMEOUT_S)
    for connection in connections + fresh:
        connection.close()
    assert all(isinstance(outcomes[index], (ConnectionError, http.client.HTTPException)) for index in range(3))
    assert {index: outcomes[index] for index in range(3, 11)} == {index: [float(index)] * 4 for index in range(3, 11)}
    client = httpclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("gather")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (8, 1)


def test_sigterm_stops_the_workers_and_the_main_process_with_no_orphans(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "3")
    pids = worker_pids(server)
    assert len(pids) == 3
    assert server.stop() == 0
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    assert "HTTP front-end workers stopped" in server.log()


def test_workers_exit_when_the_main_process_is_killed(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2")
    pids = worker_pids(server)
    server.process.kill()
    server.process.wait()
    server.stopped = True
    wait_until(lambda: not [pid for pid in pids if os.path.exists(f"/proc/{pid}")], "the workers gone with their main process")


def test_model_control_and_the_repository_index_through_workers_are_one_servers(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2", "--model-control-mode", "explicit")
    clients = [httpclient.InferenceServerClient(server.url) for _ in range(4)]
    clients[0].load_model("identity")
    assert all(client.is_model_ready("identity") for client in clients)
    assert [entry["state"] for entry in clients[1].get_model_repository_index()] == ["READY"]
    clients[2].unload_model("identity")
    wait_until(lambda: not clients[3].is_model_ready("identity"), "the model unloaded, as every worker sees")
    with pytest.raises(Exception, match="unknown model|not ready|unavailable"):
        clients[3].infer("identity", [_tensor()])


def test_a_model_reloaded_with_another_config_is_decoded_by_the_new_one(repo: RepoBuilder, serve) -> None:
    # The workers decode requests with the config the main process announced; after a
    # reload, a request decoded with the old one is sent again (raw) and checked by the new.
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2", "--model-control-mode", "explicit", "--load-model", "identity",
                   "--log-verbose", "1")
    connections = open_connections(server, per_worker=1)

    def infer(values: list[float]) -> tuple[int, dict[str, object]]:
        statuses = []
        for connection in connections:  # each worker, twice: the second is decoded there
            for _ in range(2):
                connection.request("POST", "/v2/models/identity/infer", body=infer_body(values))
                response = connection.getresponse()
                statuses.append((response.status, json.loads(response.read())))
        assert all(status == statuses[0] for status in statuses), statuses
        return statuses[0]

    assert infer([1.0, 2.0, 3.0, 4.0])[0] == 200
    narrower = {"name": "identity", "max_batch_size": 8,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]}
    httpclient.InferenceServerClient(server.url).load_model("identity", config=json.dumps(narrower))
    status, body = infer([1.0, 2.0, 3.0, 4.0])
    assert status == 400 and "unexpected shape for input 'INPUT0'" in str(body["error"])
    assert infer([5.0, 6.0]) == (200, {"model_name": "identity", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 2], "data": [5.0, 6.0]}]})
    assert "decoded for a version no longer served goes again raw" in server.log()
    for connection in connections:
        connection.close()


# -- health, metadata and config answered in the workers ----------------------------------------

#: every lookup route (health, metadata, config), with known, failed, unloaded and unknown
#: models and versions, and a version number past Triton's range
LOOKUPS = [
    "/v2/health/live", "/v2/health/ready", "/v2",
    "/v2/models/identity", "/v2/models/identity/versions/1", "/v2/models/identity/versions/2",
    "/v2/models/identity/versions/3", "/v2/models/identity/ready", "/v2/models/identity/versions/2/ready",
    "/v2/models/identity/versions/3/ready", "/v2/models/identity/config", "/v2/models/identity/versions/1/config",
    "/v2/models/identity/versions/99999999999999999999/config", "/v2/models/broken", "/v2/models/broken/ready",
    "/v2/models/broken/versions/1/config", "/v2/models/gone", "/v2/models/gone/ready",
    "/v2/models/gone/versions/1/ready", "/v2/models/nothing", "/v2/models/nothing/versions/1/config",
]

ALL_VERSIONS = "[version_policy]\nall = {}"


def raw_get(connection: socket.socket, path: str, method: str = "GET", body: bytes = b"") -> bytes:
    """The whole response (status line, headers, body) to one request on ``connection``."""
    connection.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return read_response(connection)


@contextlib.contextmanager
def main_process_stopped(server: RunningServer) -> Iterator[None]:
    """The server's main process stopped (SIGSTOP: it answers nothing) for the block, then
    let go on: what the workers answer meanwhile, they answer themselves."""
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


def read_response(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


def lookup_repository(repo: RepoBuilder) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=ALL_VERSIONS), version=1)
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=ALL_VERSIONS), version=2)
    repo.add("gone", IDENTITY.format(name="gone", batch=0, extra=""))
    repo.add("broken", "max_batch_size = 'eight'\n")


def test_health_metadata_and_config_are_the_bytes_one_process_answers(repo: RepoBuilder, serve) -> None:
    lookup_repository(repo)
    flags = ("--model-control-mode", "explicit", "--load-model", "*", "--strict-readiness", "false")
    servers = [serve(repo.root, "--http-workers", str(count), *flags) for count in (1, 2)]
    for server in servers:
        httpclient.InferenceServerClient(server.url).unload_model("gone")
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for server in servers]
    for path in LOOKUPS:
        one, workers = (raw_get(connection, path) for connection in connections)
        assert workers == one, path
    for connection in connections:
        connection.close()


def test_health_metadata_and_config_are_answered_in_the_worker_not_the_main_process(repo: RepoBuilder, serve) -> None:
    lookup_repository(repo)
    server = serve(repo.root, "--http-workers", "2", "--model-control-mode", "explicit", "--load-model", "identity")
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    expected = {path: raw_get(connection, path) for path in LOOKUPS}
    with main_process_stopped(server):
        for path in LOOKUPS:
            assert raw_get(connection, path) == expected[path], path
        connection.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n")  # forwarded: it waits
        connection.settimeout(0.5)
        with pytest.raises(TimeoutError):
            connection.recv(1)
    connection.settimeout(60)
    assert read_response(connection).startswith(b"HTTP/1.1 200 OK\r\n")  # answered once it runs again
    connection.close()


def test_a_change_confirmed_through_one_worker_is_in_the_next_answer_of_the_other(repo: RepoBuilder, serve) -> None:
    lookup_repository(repo)
    server = serve(repo.root, "--http-workers", "2", "--model-control-mode", "explicit")
    first, second = open_connections(server, per_worker=1)
    pids = [serving_worker(server, connection.sock.getsockname()[1]) for connection in (first, second)]
    sockets = [connection.sock for connection in (first, second)]
    # a config the size of a big model's (its picture spans many reads of the worker's link)
    inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}] + [
        {"name": f"EXTRA{index}", "data_type": "TYPE_FP32", "dims": [4], "optional": True} for index in range(3000)]
    narrower = json.dumps({"name": "identity", "max_batch_size": 4, "version_policy": {"all": {}}, "input": inputs,
                           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]})
    steps = [  # (change, then what the other worker answers at once)
        ("POST", "/v2/repository/models/identity/load", b"", "/v2/models/identity/ready", b"HTTP/1.1 200 OK"),
        ("POST", "/v2/repository/models/identity/load", json.dumps({"parameters": {"config": narrower}}).encode(),
         "/v2/models/identity/config", b'"max_batch_size":4'),
        ("POST", "/v2/repository/models/identity/unload", b"", "/v2/models/identity/versions/2/ready",
         b"it is UNAVAILABLE: unloaded"),
    ]
    for round in range(3):
        for index, (method, path, body, question, answer) in enumerate(steps):
            changer, asker = sockets[(round + index) % 2], pids[(round + index + 1) % 2]
            asked = sockets[(round + index + 1) % 2]
            assert asker is not None
            # the asking worker is held while the change is made and confirmed, then wakes with
            # the question and the main process's new picture both waiting for it
            os.kill(asker, signal.SIGSTOP)
            try:
                assert raw_get(changer, path, method, body).startswith(b"HTTP/1.1 200 OK\r\n")
                asked.sendall(f"GET {question} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            finally:
                os.kill(asker, signal.SIGCONT)
            assert answer in read_response(asked), (round, question)
    first.close()
    second.close()


# -- statistics answered in the workers --------------------------------------------------------

#: every statistics route, with served, unloaded, failed and unknown models and versions,
#: and a version number past Triton's range
STATISTICS = [
    "/v2/models/stats", "/v2/models/identity/stats", "/v2/models/identity/versions/1/stats",
    "/v2/models/identity/versions/2/stats", "/v2/models/identity/versions/3/stats",
    "/v2/models/identity/versions/99999999999999999999/stats", "/v2/models/gone/stats",
    "/v2/models/gone/versions/1/stats", "/v2/models/broken/stats", "/v2/models/nothing/stats",
    "/v2/models/apart/stats",
]
#: a model whose instance runs in a process of its own (its statistics say how often it restarted)
APART = '[[instance_group]]\ncount = 1\nkind = "KIND_CPU"\nisolation = "process"'


def _counts_only(response: bytes) -> object:
    """A statistics answer with what timing decides masked (durations' ns, the last
    inference's time, nereid's scheduling figures, the length); an error answer whole."""
    head, body = response.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200 "):
        return response
    head = b"\r\n".join(line for line in head.split(b"\r\n") if not line.startswith(b"content-length:"))

    def masked(value: object) -> object:
        if isinstance(value, dict):
            return {key: 0 if key in ("ns", "last_inference") else masked(item)
                    for key, item in value.items() if key != "scheduling"}
        if isinstance(value, list):
            return [masked(item) for item in value]
        return value

    return head, masked(json.loads(body))


def test_statistics_through_workers_are_what_one_process_answers(repo: RepoBuilder, serve) -> None:
    lookup_repository(repo)
    repo.add("apart", IDENTITY.format(name="apart", batch=8, extra=APART))
    flags = ("--model-control-mode", "explicit", "--load-model", "*", "--strict-readiness", "false")
    servers = [serve(repo.root, "--http-workers", str(count), *flags) for count in (1, 2)]
    connections = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for server in servers]

    def both(method: str, path: str, body: bytes = b"") -> None:
        for connection in connections:
            assert raw_get(connection, path, method, body).startswith(b"HTTP/1.1 200 OK\r\n"), path

    def compare(step: str) -> None:
        for path in STATISTICS:
            one, workers = (_counts_only(raw_get(connection, path)) for connection in connections)
            assert workers == one, (step, path)

    compare("loaded, nothing inferred")
    both("POST", "/v2/repository/models/gone/unload")
    for values in ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]):
        both("POST", "/v2/models/identity/infer", infer_body(values))
        both("POST", "/v2/models/identity/versions/1/infer", infer_body(values))
        both("POST", "/v2/models/apart/infer", infer_body(values))
    compare("inferred")
    assert b'"instance_restarts":0' in raw_get(connections[1], "/v2/models/apart/stats")
    both("POST", "/v2/repository/models/identity/load")
    compare("loaded again")
    both("POST", "/v2/repository/models/identity/unload")
    compare("unloaded")
    for connection in connections:
        connection.close()


def test_statistics_are_answered_in_the_worker_not_the_main_process(repo: RepoBuilder, serve) -> None:
    import tritonclient.grpc as grpcclient

    lookup_repository(repo)
    server = serve(repo.root, "--http-workers", "2", "--model-control-mode", "explicit", "--load-model", "identity")
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    raw_get(connection, "/v2/models/identity/infer", "POST", infer_body([1.0, 2.0, 3.0, 4.0]))
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    expected = {path: raw_get(connection, path) for path in STATISTICS}
    expected_grpc = grpc.get_inference_statistics("identity")
    with main_process_stopped(server):
        for path in STATISTICS:
            assert raw_get(connection, path) == expected[path], path
        assert grpc.get_inference_statistics("identity", client_timeout=30) == expected_grpc
        with pytest.raises(grpcclient.InferenceServerException, match="requested model 'gone' is not available"):
            grpc.get_inference_statistics("gone", client_timeout=30)
    assert b'"inference_count":1,' in expected["/v2/models/identity/stats"]
    assert expected_grpc.model_stats[-1].inference_stats.success.count == 1  # version 2, the latest
    grpc.close()
    connection.close()


def test_a_request_answered_through_one_worker_is_counted_in_the_next_statistics_of_the_other(
    repo: RepoBuilder, serve,
) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra="[dynamic_batching]"))
    server = serve(repo.root, "--http-workers", "2")
    first, second = open_connections(server, per_worker=1)
    for round in range(40):
        inferring, asking = (first, second) if round % 2 else (second, first)
        values = [float(round)] * (1 + round % 3)
        inferring.request("POST", "/v2/models/identity/infer", body=json.dumps({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [len(values), 4], "data": values * 4}]}).encode())
        response = inferring.getresponse()
        assert response.status == 200, response.read()
        response.read()
        asking.request("GET", "/v2/models/identity/stats")
        stats = json.loads(asking.getresponse().read())["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == round + 1, round
        assert stats["execution_count"] == round + 1, round
        assert stats["inference_count"] == sum(1 + done % 3 for done in range(round + 1)), round
    first.close()
    second.close()


def _tensor() -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    return tensor


@pytest.mark.parametrize(("flags", "message"), [
    pytest.param(["--http-server", "uvicorn"], "--http-workers 2: needs --http-server native, got uvicorn", id="engine"),
    pytest.param(["--ray-replicas", "1"], "--http-workers: not available with --ray-replicas", id="ray"),
])
def test_workers_are_refused_where_they_cannot_serve(repo: RepoBuilder, flags: list[str], message: str) -> None:
    import subprocess

    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    done = subprocess.run(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo.root), "--http-workers", "2", *flags],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert message in done.stderr


FLOOD_CONFIG = """
max_batch_size = 0
[[input]]
name = "COUNT"
data_type = "TYPE_INT32"
dims = [1]
[[output]]
name = "OUT"
data_type = "TYPE_STRING"
dims = [1]
[model_transaction_policy]
decoupled = true
"""

#: COUNT steps of 1 MiB each, as fast as it can; then the file "produced"
FLOOD_MODEL = """
import numpy as np


class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        count = int(inputs["COUNT"].reshape(-1)[0])
        part = {"OUT": np.array([b"x" * (1 << 20)], dtype=object)}
        for _ in range(count):
            yield part
        (self.folder / "produced").write_text(str(count))
"""


def _status(pid: int, key: str) -> int:
    """A /proc/PID/status figure, in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def test_a_streamed_response_its_client_does_not_read_is_not_queued_in_the_worker(repo: RepoBuilder, serve) -> None:
    """generate_stream of 128 MiB that the client reads only after the model produced it
    all: the main process sends the worker no more than the worker's window ahead of the
    client (send_windows.py), so the worker's peak memory (VmHWM) stays far below the
    response; the client then gets every event."""
    repo.add("flood", FLOOD_CONFIG, FLOOD_MODEL, version=1)
    server = serve(repo.root, "--http-workers", "2")
    produced = repo.root / "flood" / "1" / "produced"
    payload = json.dumps({"COUNT": 128}).encode()
    request = (f"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n"
               .encode() + payload)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        pid = wait_until(lambda: serving_worker(server, sock.getsockname()[1]), "the connection's worker")
        before = _status(pid, "VmRSS")
        sock.sendall(request)
        wait_until(produced.exists, "the model produced its 128 parts while its client read nothing")
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's end
            chunk = sock.recv(1 << 20)
            assert chunk, f"the server closed the stream early: {bytes(received[:200])!r}"
            received += chunk
        peak = _status(pid, "VmHWM")
    assert received.startswith(b"HTTP/1.1 200") and received.count(b"data: ") == 128
    assert peak - before < 40 * MiB, f"the worker held {(peak - before) / MiB:.0f} MiB of a response its client did not read"
