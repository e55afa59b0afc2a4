"""Hostile and careless clients against the native engine, on real sockets: memory let go
when connections close, head limits answered, timeouts, the connection limit, heavy
bodies decoded off the loop, back-pressure, bounded shutdown with a stuck model, and
statistics for requests whose client left. Memory is read from the server's /proc."""

from __future__ import annotations

import gzip
import json
import os
import select
import signal
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import RepoBuilder, RunningServer
from tests.waiting import MODEL_GATE, wait_until

pytestmark = pytest.mark.thread_only("the HTTP front end is the subject: one isolation is enough")

MiB = 1 << 20

VECTOR = """
max_batch_size = 0
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [-1]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [-1]
"""


def _status(server: RunningServer, key: str) -> int:
    """A /proc/PID/status figure of the server, in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc status")


def _exchange(server: RunningServer, request: bytes, *, timeout: float = 30.0) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(request)
        return _read_to_close(sock)


def _read_to_close(sock: socket.socket) -> bytes:
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk


def _infer_post(model: str, body: bytes, *extra: str) -> bytes:
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    return (head + "".join(line + "\r\n" for line in extra) + "\r\n").encode() + body


def _json_body(values: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)], "data": values}]}).encode()


def test_closed_connections_give_their_request_memory_back_at_once(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root)
    baseline = _status(server, "VmRSS")
    junk = b"x" * (48 * MiB)  # not JSON: refused (500, as Triton) once read whole
    for _ in range(6):
        answer = _exchange(server, _infer_post("vector", junk, "Connection: close"))
        assert answer.startswith(b"HTTP/1.1 500 ") and b"failed to parse the request JSON" in answer
    # Without the fix each closed connection kept its 48 MiB until a full collection.
    assert _status(server, "VmRSS") - baseline < 120 * MiB


def test_a_url_past_the_limit_gets_414_and_one_past_httptools_limit_too(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root)
    for length in (20_000, 70_000):
        answer = _exchange(server, b"GET /" + b"a" * length + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414 "), answer[:200]
        assert b"--http-max-url-size" in answer
    # refusals are answers, not log lines (the log's own port numbers may hold "414")
    assert "http-max-url-size" not in server.log() and "URI Too Long" not in server.log()


def test_a_huge_head_gets_431_without_being_read_whole(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--http-max-header-size", "8192", "--http-max-header-count", "20")
    many = b"GET /v2/health/live HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(21)) + b"\r\n"
    assert _exchange(server, many).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Big: ")
        try:
            for _ in range(100):  # 100 MB offered; the server answers and closes long before
                sock.sendall(b"y" * MiB)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"--http-max-header-size" in answer


def test_a_slow_head_a_stalled_body_and_an_idle_connection_are_closed(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--http-header-timeout-secs", "1", "--http-body-timeout-secs", "1",
                   "--http-keepalive-timeout-secs", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as head, \
            socket.create_connection(("127.0.0.1", server.port), timeout=30) as body, \
            socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle:
        head.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")
        body.sendall(_infer_post("vector", _json_body([1.0, 2.0]))[:-5])
        idle.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        slow_head, stalled_body, after_idle = (_read_to_close(s) for s in (head, body, idle))
    assert slow_head.startswith(b"HTTP/1.1 408 ") and b"--http-header-timeout-secs" in slow_head
    assert stalled_body.startswith(b"HTTP/1.1 408 ") and b"--http-body-timeout-secs" in stalled_body
    assert after_idle.startswith(b"HTTP/1.1 200 ") and after_idle.count(b"HTTP/1.1") == 1  # answered, then closed
    # the server itself goes on
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live()
    client.close()


def test_tritonclient_survives_the_keep_alive_timeout(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    """A client idle past the keep-alive timeout finds its connection closed by the server:
    tritonclient (geventhttpclient) reconnects and the next call works."""
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--http-keepalive-timeout-secs", "0.2")
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    client.infer("vector", [tensor])
    wait_until(lambda: "connection" not in _open_connections(server), "the idle connection to close")
    np.testing.assert_array_equal(client.infer("vector", [tensor]).as_numpy("OUTPUT0"), [0, 1, 2])
    client.close()


def _open_connections(server: RunningServer) -> str:
    """'connection' when the server holds an established TCP connection on its port."""
    out = subprocess.run(["ss", "-Htn", "state", "established", f"sport = :{server.port}"],
                         capture_output=True, text=True).stdout
    return "connection" if out.strip() else ""


def test_connections_past_the_limit_get_503_and_a_log_line(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--http-max-connections", "3")
    held: list[socket.socket] = []

    def one_more_held() -> bool:
        # The connection of start_server's readiness check counts until the server has seen
        # it close (later with --http-workers: another process may hold it), so a first
        # connection may still be refused; once taken, each is served: the server knows it.
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        try:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = sock.recv(65536)
        except ConnectionResetError:
            answer = b""
        if answer.startswith(b"HTTP/1.1 200 "):
            held.append(sock)
            return len(held) == 3
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503 "), answer
        sock.close()
        return False

    try:
        wait_until(one_more_held, "three connections held")
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as extra:
            answer = _read_to_close(extra)  # told at once, before it sends anything
        assert answer.startswith(b"HTTP/1.1 503 ") and b"--http-max-connections" in answer
        wait_until(lambda: "open connections, the limit (--http-max-connections)" in server.log(), "the log line")
    except BaseException:
        for sock in held:
            sock.close()
        raise
    held.pop().close()

    def taken_again() -> bool:
        # Until the server has seen that close, a new connection is still refused: with a
        # 503, or reset when the refusal closes it before reading the request (likelier
        # with --http-workers, where another process may refuse it).
        try:
            answer = _exchange(server, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        except ConnectionResetError:
            return False
        return answer.startswith(b"HTTP/1.1 200 ")

    try:
        wait_until(taken_again, "a connection to be taken again")
    finally:
        for sock in held:
            sock.close()


def test_a_huge_json_request_does_not_stall_other_clients(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    """The 60 MB JSON body is parsed off the loop: small requests sent after it is
    delivered are answered while it is still being parsed."""
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--http-max-input-size", str(128 * MiB))
    values = np.random.default_rng(0).random(5_000_000, dtype=np.float32).round(6).tolist()
    heavy = _infer_post("vector", _json_body(values))
    assert len(heavy) > 60 * MiB
    client = httpclient.InferenceServerClient(server.url)
    small = httpclient.InferInput("INPUT0", [2], "FP32")
    small.set_data_from_numpy(np.array([1, 2], np.float32))
    client.infer("vector", [small])
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as sock:
        sock.sendall(heavy)
        sock.setblocking(False)
        answered_meanwhile = 0
        while True:
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except BlockingIOError:
                pass
            client.infer("vector", [small])
            answered_meanwhile += 1
        sock.setblocking(True)
        sock.settimeout(120)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
    client.close()
    assert received.startswith(b"HTTP/1.1 200 ")
    assert answered_meanwhile >= 5, f"only {answered_meanwhile} small requests were answered during the parse"


@pytest.mark.parametrize("mistake", ["shape", "datatype", "name"])
def test_a_huge_json_request_is_refused_as_a_small_one_is(serve, repo: RepoBuilder, mistake: str) -> None:  # type: ignore[no-untyped-def]
    """The decode process runs the loop's parser: the same mistake gets the same answer."""
    repo.add("vector", VECTOR)
    server = serve(repo.root)

    def body(count: int) -> bytes:
        entry = {"name": "INPUT0", "datatype": "FP32", "shape": [count + 1 if mistake == "shape" else count],
                 "data": [0.5] * count}
        if mistake == "datatype":
            entry["datatype"] = "INT32"
        if mistake == "name":
            entry["name"] = "INPUT9"
        return json.dumps({"inputs": [entry]}).encode()

    heavy = body(400_000)
    assert len(heavy) > 1 * MiB  # parsed in the decode process
    heavy_answer = _exchange(server, _infer_post("vector", heavy, "Connection: close"))
    small_answer = _exchange(server, _infer_post("vector", body(4), "Connection: close"))
    assert heavy_answer.split(b"\r\n")[0] == small_answer.split(b"\r\n")[0]
    assert heavy_answer.split(b"\r\n\r\n")[1].replace(b"400001", b"5").replace(b"400000", b"4") == \
        small_answer.split(b"\r\n\r\n")[1]


def test_a_gzip_bomb_is_refused_holding_no_more_than_the_limit(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root, "--max-request-size", str(96 * MiB))
    bomb = gzip.compress(b"\0" * (1024 * MiB), compresslevel=9)
    assert len(bomb) < 2 * MiB
    peak = _status(server, "VmHWM")
    answer = _exchange(server, _infer_post("vector", bomb, "Content-Encoding: gzip", "Connection: close"))
    assert answer.startswith(b"HTTP/1.1 400 ") and b"--max-request-size" in answer
    # one inflation step past the limit at most (joining blocks would have doubled it)
    assert _status(server, "VmHWM") - peak < 150 * MiB


def test_a_client_that_never_reads_its_answers_is_not_buffered_for(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("vector", VECTOR)
    server = serve(repo.root)
    baseline = _status(server, "VmRSS")
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    flood = request * 25_000  # 1 MB of requests a write
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setblocking(False)
        sent = 0
        refused_in_a_row = 0
        while refused_in_a_row < 50 and sent < 400 * MiB:
            try:
                sent += sock.send(flood)
                refused_in_a_row = 0
            except BlockingIOError:
                refused_in_a_row += 1
                select.select([], [sock], [], 0.02)  # until the server reads some (if it ever does)
        # The server stopped reading: the client cannot push more than the socket buffers
        # and what is waiting to be answered.
        assert sent < 64 * MiB, f"the server took {sent} bytes of requests whose answers were not read"
        assert _status(server, "VmRSS") - baseline < 40 * MiB
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live()
    client.close()


HANG = """
import os, threading


class Model:
    def __init__(self, context):
        self.marker = os.environ["NEREID_TEST_MARKER"]

    def infer(self, inputs):
        open(self.marker, "w").close()
        threading.Event().wait()  # stuck for good
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def test_shutdown_is_bounded_by_the_exit_timeout_when_a_model_hangs(
    serve, repo: RepoBuilder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    marker = tmp_path / "in-infer"
    monkeypatch.setenv("NEREID_TEST_MARKER", str(marker))
    repo.add("hang", VECTOR, model=HANG)
    server = serve(repo.root, "--exit-timeout-secs", "1")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(_infer_post("hang", _json_body([1.0])))
    wait_until(marker.exists, "the model to be stuck in infer")
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(60)
    finally:
        sock.close()
    server.stopped = True
    assert code == 1
    log = server.log()
    assert "model 'hang' version 1: a batch was still running" in log and "--exit-timeout-secs" in log
    assert "exiting with status 1: work abandoned in hang:1" in log


GATED = """
import os, time


class Model:
    def __init__(self, context):
        self.marker = os.environ["NEREID_TEST_MARKER"]

    def infer(self, inputs):
        open(self.marker, "w").close()
        wait_for_file(self.marker + ".go")  # released by the test
        return {"OUTPUT0": inputs["INPUT0"]}
""" + MODEL_GATE


def test_a_request_executed_after_its_client_left_is_counted(
    serve, repo: RepoBuilder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    marker = tmp_path / "in-infer"
    monkeypatch.setenv("NEREID_TEST_MARKER", str(marker))
    repo.add("gated", VECTOR, model=GATED)
    server = serve(repo.root)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(_infer_post("gated", _json_body([1.0])))
        wait_until(marker.exists, "the model to run the request")
    Path(str(marker) + ".go").touch()
    client = httpclient.InferenceServerClient(server.url)

    def counted() -> bool:
        stats = client.get_inference_statistics("gated")["model_stats"][0]["inference_stats"]
        return bool(stats["success"]["count"] == 1)

    wait_until(counted, "the departed request to be counted as a success")
    client.close()


def test_the_server_answers_others_while_a_body_trickles_in(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    """Slowloris: 50 connections trickling heads do not keep others from being served."""
    repo.add("vector", VECTOR)
    server = serve(repo.root)
    trickling = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    try:
        for sock in trickling:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
        done = threading.Event()
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1, 2], np.float32))
        for _ in range(20):
            for sock in trickling:
                sock.sendall(b"y")
            np.testing.assert_array_equal(client.infer("vector", [tensor]).as_numpy("OUTPUT0"), [1, 2])
        done.set()
        client.close()
    finally:
        for sock in trickling:
            sock.close()
    assert os.path.exists(f"/proc/{server.process.pid}")
