"""--http-workers: gRPC through the front-end workers. Each worker serves the gRPC port
too; ModelInfer is decoded there (or relayed), every other call relayed to the main
process: batches, statistics and errors are one server's.

Which worker holds a gRPC connection is read from outside, as in
test_frontend_workers.py: the server side of each established connection to the gRPC
port (/proc/net/tcp) and the worker holding its socket (/proc/<pid>/fd).
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder, RunningServer
from tests.e2e.test_frontend_workers import IDENTITY, infer_body, worker_pids
from tests.waiting import START_TIMEOUT_S, wait_until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see which worker holds a connection")

#: the batch leaves only when 8 requests are queued (a 1000 s delay otherwise)
GATHER = "[dynamic_batching]\npreferred_batch_size = [8]\nmax_queue_delay_microseconds = 1000000000"


def grpc_connections_by_worker(server: RunningServer) -> dict[int, int]:
    """How many established gRPC connections each worker holds (pid -> count)."""
    assert server.grpc_port is not None
    local = f"0100007F:{server.grpc_port:04X}"
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if line.split()[1] == local and line.split()[3] == "01"}
    held: dict[int, int] = {}
    for pid in worker_pids(server):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        count = sum(f"socket:[{inode}]" in links for inode in inodes)
        if count:
            held[pid] = count
    return held


def client(server: RunningServer) -> grpcclient.InferenceServerClient:
    """A client on a connection of its own (gRPC's channels share them by default)."""
    return grpcclient.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])


def tensor(value: float) -> grpcclient.InferInput:
    data = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    data.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    return data


def send(each: grpcclient.InferenceServerClient, index: int, answers: queue.Queue[Any]) -> None:
    """An infer of ``index`` on model gather; (index, result, error) into ``answers``."""
    each.async_infer("gather", [tensor(float(index))], lambda result, error: answers.put((index, result, error)))


def spread_clients(server: RunningServer, count: int) -> list[grpcclient.InferenceServerClient]:
    """``count`` clients, each on its own connection, until both workers hold some."""
    clients: list[grpcclient.InferenceServerClient] = []

    def settled() -> dict[int, int] | None:
        held = grpc_connections_by_worker(server)  # accepted by now, or both workers reached
        return held if sum(held.values()) >= len(clients) or len(held) == 2 else None

    for _ in range(100):
        while len(clients) < count:
            fresh = client(server)
            assert fresh.is_server_live()
            clients.append(fresh)
        held = wait_until(settled, lambda: f"the connections' workers: {grpc_connections_by_worker(server)}")
        if len(held) == 2:
            return clients
        clients.pop(0).close()
    raise AssertionError("gRPC connections reached only one worker")


def test_grpc_infer_metadata_and_statistics_through_two_workers(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra="[dynamic_batching]"))
    server = serve(repo.root, "--http-workers", "2")
    clients = spread_clients(server, 4)
    for index, each in enumerate(clients):
        for _ in range(3):  # the first is relayed (the model not yet announced), the next decoded in the worker
            result = each.infer("identity", [tensor(float(index))], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), index, dtype=np.float32))
    stats = clients[0].get_inference_statistics("identity").model_stats[0]
    assert stats.inference_stats.success.count == 12
    assert clients[1].is_model_ready("identity")
    assert clients[2].get_model_metadata("identity").inputs[0].name == "INPUT0"
    assert clients[3].get_model_config("identity").config.max_batch_size == 8
    for each in clients:
        each.close()
    assert server.stop() == 0
    decoded = server.log().split("decoded there: ")[1].split(")")[0]
    assert sum(int(count) for count in decoded.split(", ")) >= 4  # gRPC requests decoded in the workers


def _errors(server: RunningServer) -> list[tuple[str, str]]:
    each = client(server)
    outcomes = []
    bad_shape = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    bad_shape.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    calls: list[Any] = [
        lambda: each.infer("missing", [tensor(1.0)]),
        lambda: each.infer("identity", [bad_shape]),
        lambda: each.infer("identity", [bad_shape]),  # the model announced by now: refused by the worker's decoder, relayed
        lambda: each.infer("identity", [tensor(1.0)], model_version="7"),
        lambda: each.get_model_metadata("missing"),
        lambda: each.get_model_config("identity", model_version="3"),
        lambda: each.register_system_shared_memory("region", "/no-such-key", 64),
        lambda: each.get_inference_statistics("missing"),
    ]
    for call in calls:
        with pytest.raises(grpcclient.InferenceServerException) as raised:
            call()
        outcomes.append((str(raised.value.status()), raised.value.message()))
    each.close()
    return outcomes


def test_grpc_errors_through_workers_are_the_single_process_ones(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    alone = _errors(serve(repo.root, "--http-workers", "1"))
    through_workers = _errors(serve(repo.root, "--http-workers", "2"))
    assert through_workers == alone


def test_one_batch_holds_grpc_requests_that_came_through_different_workers(repo: RepoBuilder, serve) -> None:
    repo.add("gather", IDENTITY.format(name="gather", batch=8, extra=GATHER))
    server = serve(repo.root, "--http-workers", "2")
    clients = spread_clients(server, 8)
    answers: queue.Queue[Any] = queue.Queue()
    for index, each in enumerate(clients):
        send(each, index, answers)
    outcomes = sorted(answers.get(timeout=START_TIMEOUT_S) for _ in clients)
    for index, result, error in outcomes:
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), index, dtype=np.float32))
    stats = clients[0].get_inference_statistics("gather").model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (8, 1)
    assert len(grpc_connections_by_worker(server)) == 2
    for each in clients:
        each.close()


def test_one_batch_holds_http_and_grpc_requests(repo: RepoBuilder, serve) -> None:
    repo.add("gather", IDENTITY.format(name="gather", batch=8, extra=GATHER))
    server = serve(repo.root, "--http-workers", "2")
    outcomes: dict[str, Any] = {}

    def over_http(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=START_TIMEOUT_S)
        connection.request("POST", "/v2/models/gather/infer", body=infer_body([float(index)] * 4))
        outcomes[f"http{index}"] = json.loads(connection.getresponse().read())["outputs"][0]["data"]
        connection.close()

    clients = [client(server) for _ in range(4)]
    answers: queue.Queue[Any] = queue.Queue()
    for index, each in enumerate(clients):
        send(each, index, answers)
    threads = [threading.Thread(target=over_http, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for _ in clients:
        index, result, error = answers.get(timeout=START_TIMEOUT_S)
        assert error is None, error
        outcomes[f"grpc{index}"] = result.as_numpy("OUTPUT0").tolist()[0]
    for thread in threads:
        thread.join(START_TIMEOUT_S)
    assert outcomes == {f"{protocol}{index}": [float(index)] * 4 for protocol in ("http", "grpc") for index in range(4)}
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("gather")["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (8, 1)
    for each in clients:
        each.close()


def test_a_dead_worker_fails_only_the_grpc_calls_it_held(repo: RepoBuilder, serve) -> None:
    repo.add("gather", IDENTITY.format(name="gather", batch=8, extra=GATHER))
    server = serve(repo.root, "--http-workers", "2")
    clients = spread_clients(server, 4)
    held = grpc_connections_by_worker(server)
    answers: queue.Queue[Any] = queue.Queue()
    for index, each in enumerate(clients):
        send(each, index, answers)
    wait_until(lambda: server.gauge("nv_inference_pending_request_count", "gather") == 4, "4 requests queued")
    victim = min(held)
    os.kill(victim, signal.SIGKILL)
    # the dead worker's calls leave the queue and fail; the other worker's stay queued
    failed = [answers.get(timeout=START_TIMEOUT_S) for _ in range(held[victim])]
    assert all(error is not None and result is None for _, result, error in failed)
    survivors = 4 - held[victim]
    wait_until(lambda: server.gauge("nv_inference_pending_request_count", "gather") == survivors,
               "the dead worker's requests gone from the queue")
    assert answers.empty()
    fresh = [client(server) for _ in range(8 - survivors)]  # through any worker, the restarted one included
    for index, each in enumerate(fresh, 10):
        send(each, index, answers)
    done = [answers.get(timeout=START_TIMEOUT_S) for _ in range(8)]
    assert all(error is None for _, _, error in done), done
    for index, result, _ in done:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), index, dtype=np.float32))
    stats = fresh[0].get_inference_statistics("gather").model_stats[0]
    assert (stats.inference_count, stats.execution_count) == (8, 1)
    for each in clients + fresh:
        each.close()


def test_a_grpc_stream_is_relayed_both_ways_through_a_worker(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra="[dynamic_batching]"))
    server = serve(repo.root, "--http-workers", "2")
    each = client(server)
    answers: queue.Queue[Any] = queue.Queue()
    each.start_stream(callback=lambda result, error: answers.put((result, error)))
    for index in range(5):
        each.async_stream_infer("identity", [tensor(float(index))], request_id=str(index))
    each.async_stream_infer("missing", [tensor(0.0)], request_id="bad")
    got = [answers.get(timeout=START_TIMEOUT_S) for _ in range(6)]
    each.stop_stream()
    values = sorted(result.as_numpy("OUTPUT0")[0, 0] for result, error in got if error is None)
    errors = [str(error) for _, error in got if error is not None]
    assert values == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert len(errors) == 1 and "missing" in errors[0]
    stats = each.get_inference_statistics("identity").model_stats[0]
    assert stats.inference_stats.success.count == 5
    each.close()


def test_grpc_max_connections_holds_for_the_whole_server(repo: RepoBuilder, serve) -> None:
    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra=""))
    server = serve(repo.root, "--http-workers", "2", "--grpc-max-connections", "2")
    for _ in range(50):  # until the two connections are on different workers
        pair = [client(server) for _ in range(2)]
        assert all(each.is_server_live() for each in pair)
        held = wait_until(lambda: (lambda by: by if sum(by.values()) == 2 else None)(grpc_connections_by_worker(server)),
                          "both connections accepted")
        if len(held) == 2:
            break
        for each in pair:
            each.close()
        wait_until(lambda: not grpc_connections_by_worker(server), "the connections closed")
    else:
        raise AssertionError("gRPC connections reached only one worker")
    # each worker holds one, under the limit of 2 on its own: the server-wide count refuses a third
    assert server.grpc_port is not None
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=START_TIMEOUT_S) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:  # closed with our preface unread
            pass
    assert _goaway_code(received) == 0xB  # ENHANCE_YOUR_CALM, then closed
    assert all(each.is_server_live() for each in pair)
    for each in pair:
        each.close()


def _goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY frame in ``data`` (HTTP/2 frames from the server)."""
    position = 0
    while position + 9 <= len(data):
        length = int.from_bytes(data[position:position + 3], "big")
        if data[position + 3] == 0x7:
            return int.from_bytes(data[position + 13:position + 17], "big")
        position += 9 + length
    return None


def test_a_grpc_stream_whose_client_does_not_read_is_not_queued_in_the_worker(repo: RepoBuilder, serve) -> None:
    """ModelStreamInfer of 128 answers of 1 MiB that the client lets out only after the
    model produced them all (its HTTP/2 window stays at the 64 KiB default until then,
    then grows a MiB for each MiB it took, as a client's does):
    the main process sends the worker no more than the worker's window ahead of the
    client (send_windows.py), so no worker's peak memory (VmHWM) grows by the stream;
    the client then gets every answer."""
    from tritonclient.grpc import service_pb2

    from tests.e2e.test_frontend_workers import FLOOD_CONFIG, FLOOD_MODEL, MiB, _status
    from tests.e2e.test_grpc_hostile import DATA, HEADERS, Attacker, frame

    import hpack

    repo.add("flood", FLOOD_CONFIG, FLOOD_MODEL, version=1)
    server = serve(repo.root, "--http-workers", "2")
    produced = repo.root / "flood" / "1" / "produced"
    before = {pid: _status(pid, "VmRSS") for pid in worker_pids(server)}
    request = service_pb2.ModelInferRequest(model_name="flood")
    request.inputs.add(name="COUNT", datatype="INT32", shape=[1]).contents.int_contents.append(128)
    payload = request.SerializeToString()
    attacker = Attacker(int(server.grpc_url.rsplit(":", 1)[1]))
    block = hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"),
                                    (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
                                    (b":authority", b"x"), (b"content-type", b"application/grpc")])
    attacker.send(frame(HEADERS, 4, 1, block) + frame(DATA, 1, 1, b"\0" + len(payload).to_bytes(4, "big") + payload))
    wait_until(produced.exists, "the model produced its 128 answers while its client let none out")
    grant = MiB.to_bytes(4, "big")  # as a client reads: a MiB more of window for each MiB it took
    attacker.send(frame(8, 0, 0, grant) + frame(8, 0, 1, grant))
    received, at, data_bytes, granted, ended = bytearray(), 0, 0, 0, False
    attacker.sock.settimeout(60)
    while not ended:
        chunk = attacker.sock.recv(1 << 20)
        assert chunk, "the server closed the connection before the stream's end"
        received += chunk
        while len(received) - at >= 9 and len(received) - at >= 9 + int.from_bytes(received[at:at + 3], "big"):
            size, kind, flags = int.from_bytes(received[at:at + 3], "big"), received[at + 3], received[at + 4]
            if kind == DATA:
                data_bytes += size
            elif kind == HEADERS and flags & 1 and int.from_bytes(received[at + 5:at + 9], "big") == 1:
                ended = True
            at += 9 + size
        if data_bytes - granted >= MiB:
            granted += MiB
            attacker.send(frame(8, 0, 0, grant) + frame(8, 0, 1, grant))
        del received[:at]
        at = 0
    peaks = {pid: _status(pid, "VmHWM") - rss for pid, rss in before.items()}
    attacker.close()
    assert data_bytes > 128 * MiB
    assert max(peaks.values()) < 40 * MiB, f"a worker held {max(peaks.values()) / MiB:.0f} MiB of a stream its client did not read"


def test_grpc_statistics_answered_in_the_workers_are_the_main_processs_figures(repo: RepoBuilder, serve) -> None:
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2

    repo.add("identity", IDENTITY.format(name="identity", batch=8, extra="[dynamic_batching]"))
    # HTTP's statistics restricted: answered by the main process (the key checked there), gRPC's in the workers
    server = serve(repo.root, "--http-workers", "2", "--http-restricted-api", "statistics:admin-key=yes")
    clients = spread_clients(server, 4)
    http = httpclient.InferenceServerClient(server.url)
    for round in range(12):  # each answer counted in the next statistics, through whichever worker
        clients[round % 4].infer("identity", [tensor(float(round))])
        stats = clients[(round + 1) % 4].get_inference_statistics("identity").model_stats[0]
        assert (stats.inference_stats.success.count, stats.execution_count) == (round + 1, round + 1), round
    main = http.get_inference_statistics(headers={"admin-key": "yes"})
    for entry in main["model_stats"]:
        entry.pop("scheduling")  # nereid's: not in gRPC's message
    expected = json_format.ParseDict(main, service_pb2.ModelStatisticsResponse())
    assert expected.model_stats[0].inference_stats.success.count == 12
    for each in clients:
        assert each.get_inference_statistics() == expected
        each.close()
    http.close()
