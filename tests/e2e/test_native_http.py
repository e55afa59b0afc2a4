"""HTTP/1.1 framing of the native engine (the default), over raw sockets: pipelining,
chunked bodies, Expect: 100-continue, HTTP/1.0 and Connection: close, HEAD, percent-encoded
and query-string infer paths, unparsable requests, withdrawn requests, graceful stop."""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer, start_server
from tests.waiting import GATED_IDENTITY, wait_until, wait_until_read

IDENTITY = IDENTITY_CONFIG + """\
[dynamic_batching]
"""

SLOW = IDENTITY + """
[[instance_group]]
count = 1
"""

SLOW_MODEL = """
import time
import zlib


class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        time.sleep(float(inputs["INPUT0"][0, 0]))
        return {"OUTPUT0": inputs["INPUT0"]}
"""

#: Holds its only instance until the test creates the file "open" beside model.py.
HELD_MODEL = GATED_IDENTITY

BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).encode()


@pytest.fixture(scope="module")
def native_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("native-repo")
    repo = RepoBuilder(root)
    repo.add("identity", IDENTITY)
    repo.add("slow", SLOW, model=SLOW_MODEL)
    repo.add("held", SLOW, model=HELD_MODEL)
    return root


@pytest.fixture(scope="module")
def server(native_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(native_repo, "--http-server", "native", log_dir=tmp_path_factory.mktemp("native-log"))
    yield server
    server.stop()


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``count`` Content-Length-framed responses (skipping 100 Continue)."""
    data = b""
    responses: list[tuple[int, dict[str, str], bytes]] = []
    while len(responses) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(responses)} responses"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        if status == 100:
            continue
        length = int(headers.get("content-length", "0"))
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
        responses.append((status, headers, data[:length]))
        data = data[length:]
    return responses


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra) + body


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def test_hundreds_of_pipelined_requests_in_one_write_are_answered_in_order(server: RunningServer) -> None:
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    missing = post("/v2/models/missing/infer", BODY)
    good = post("/v2/models/identity/infer", BODY)
    batch = (live + missing + good) * 300  # errors answer at once: no recursion, no reordering
    with connect(server) as sock:
        sock.sendall(batch)
        statuses = [status for status, _, _ in read_responses(sock, 900)]
    assert statuses == [200, 404, 200] * 300


def test_a_chunked_request_body_is_read_whole(server: RunningServer) -> None:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:30], BODY[30:])) + b"0\r\n\r\n"
    request = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    with connect(server) as sock:
        sock.sendall(request)
        [(status, _, body)] = read_responses(sock, 1)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [1, 2, 3, 4]


def test_a_chunked_body_over_the_size_limit_is_refused(tmp_path: Path, repo: RepoBuilder) -> None:
    repo.add("identity", IDENTITY)
    server = start_server(repo.root, "--max-request-size", "1000", log_dir=tmp_path)
    try:
        request = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        with connect(server) as sock:
            sock.sendall(request + b"400\r\n" + bytes(1024) + b"\r\n")
            [(status, headers, body)] = read_responses(sock, 1)
            assert sock.recv(100) == b""  # closed: the rest of the body is not read
        assert status == 400
        assert headers["connection"] == "close"
        assert "exceeds the maximum allowed size (1000 bytes, --max-request-size)" in json.loads(body)["error"]
        assert httpx.get(server.http + "/v2/health/live").status_code == 200
    finally:
        server.stop()


def test_expect_100_continue_gets_continue_before_the_body(server: RunningServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(BODY))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        [(status, _, _)] = read_responses(sock, 1)
    assert status == 200


@pytest.mark.parametrize("request_line, extra", [
    (b"GET /v2/health/live HTTP/1.0", b""),
    (b"GET /v2/health/live HTTP/1.1", b"Connection: close\r\n"),
])
def test_connection_closes_after_the_answer_when_the_client_asks(server: RunningServer, request_line: bytes, extra: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(request_line + b"\r\nHost: x\r\n" + extra + b"\r\n")
        [(status, headers, _)] = read_responses(sock, 1)
        assert sock.recv(100) == b""
    assert status == 200
    assert headers["connection"] == "close"


def test_http_1_0_keep_alive_is_honoured(server: RunningServer) -> None:
    with connect(server) as sock:
        for _ in range(2):
            sock.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            [(status, _, _)] = read_responses(sock, 1)
            assert status == 200


def test_head_answers_headers_without_a_body(server: RunningServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"\r\n\r\n"):
            data += sock.recv(65536)
    first, second = data.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"405")  # Triton answers only GET/POST
    assert int(re.search(rb"content-length: (\d+)", first).group(1)) > 0  # type: ignore[union-attr]
    assert first.endswith(b"\r\n\r\n")  # ... and no body follows: the next response starts right away
    assert second.startswith(b"200")


@pytest.mark.parametrize("path", ["/v2/models/%69dentity/infer", "/v2/models/identity/infer?x=1",
                                  "/v2/models/identity/versions/1/infer"])
def test_infer_paths_with_escapes_queries_and_versions_are_routed(server: RunningServer, path: str) -> None:
    with connect(server) as sock:
        sock.sendall(post(path, BODY))
        [(status, _, body)] = read_responses(sock, 1)
    assert status == 200, body
    assert json.loads(body)["model_name"] == "identity"


@pytest.mark.parametrize("garbage", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"GET / HTTP/9.9\r\n\r\n",
                                     b"POST /v2/models/identity/infer HTTP/1.1\r\nContent-Length: x\r\n\r\n"])
def test_an_unparsable_request_gets_400_and_the_connection_closes(server: RunningServer, garbage: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(garbage)
        [(status, headers, body)] = read_responses(sock, 1)
        assert sock.recv(100) == b""
    assert status == 400
    assert headers["connection"] == "close"
    assert json.loads(body) == {"error": "Invalid HTTP request received."}
    assert httpx.get(server.http + "/v2/health/live").status_code == 200


def test_an_upgrade_request_is_answered_and_the_connection_closed(server: RunningServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        [(status, _, _)] = read_responses(sock, 1)
        assert sock.recv(100) == b""
    assert status == 200


def send_in_reads(sock: socket.socket, *pieces: bytes) -> None:
    """Send ``pieces`` so that the server reads each on its own: the next goes once the
    server has read the one before (``wait_until_read``; every cut point is also covered
    on a fake transport in tests/unit/http/h1/)."""
    for piece in pieces:
        sock.sendall(piece)
        wait_until_read(sock)


def slow_body(seconds: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "data": [seconds, 0, 0, 0]}]}).encode()


def stats(server: RunningServer, model: str) -> dict:  # type: ignore[type-arg]
    return httpx.get(f"{server.http}/v2/models/{model}/stats").json()["model_stats"][0]  # type: ignore[no-any-return]


def test_a_queued_request_whose_client_hangs_up_is_never_executed(server: RunningServer, native_repo: Path) -> None:
    before = stats(server, "held")["inference_stats"]
    client = httpclient.InferenceServerClient(server.url)
    blocker = threading.Thread(target=lambda: client.infer("held", [_input(1.0)]))
    blocker.start()  # occupies the only instance until the file "open" exists
    wait_until(lambda: server.gauge("nereid_batches_executing", "held") == 1, "the blocker running")
    with connect(server) as sock:
        sock.sendall(post("/v2/models/held/infer", slow_body(0.0)))
        wait_until(lambda: server.gauge("nv_inference_pending_request_count", "held") == 1, "the request queued")
    wait_until(lambda: (now := stats(server, "held")["inference_stats"])["fail"]["count"] > before["fail"]["count"]
               and now, "the withdrawn request counted as failed")
    (native_repo / "held" / "open").touch()
    blocker.join()
    client.close()
    after = wait_until(lambda: (now := stats(server, "held")["inference_stats"])["success"]["count"]
                       > before["success"]["count"] and now, "the blocker counted as a success")
    assert after["success"]["count"] == before["success"]["count"] + 1  # only the blocker ran
    assert after["fail"]["count"] == before["fail"]["count"] + 1  # the other was withdrawn


def _input(value: float) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([[value, 0, 0, 0]], dtype=np.float32))
    return tensor


def test_stop_lets_a_request_in_flight_finish_and_then_exits(tmp_path: Path, repo: RepoBuilder) -> None:
    repo.add("slow", SLOW, model=SLOW_MODEL)
    server = start_server(repo.root, log_dir=tmp_path)
    with connect(server) as sock:
        sock.sendall(post("/v2/models/slow/infer", slow_body(1.0)))
        wait_until(lambda: server.gauge("nereid_batches_executing", "slow") == 1, "the request running")
        server.process.send_signal(2)  # SIGINT while the request runs
        [(status, headers, body)] = read_responses(sock, 1)
    assert status == 200, body
    assert headers["connection"] == "close"
    assert server.process.wait(20) == 0
    server.stopped = True


def test_a_refused_body_followed_by_pipelined_requests_gets_one_answer_and_a_close(tmp_path: Path, repo: RepoBuilder) -> None:
    repo.add("identity", IDENTITY)
    server = start_server(repo.root, "--max-request-size", "1000", log_dir=tmp_path)
    try:
        big = b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + bytes(2000)
        live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        with connect(server) as sock:
            sock.sendall(big + live + live)
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.count(b"HTTP/1.1 ") == 1, data
        assert data.startswith(b"HTTP/1.1 400 ")
        assert httpx.get(server.http + "/v2/health/live").status_code == 200
        assert "Traceback" not in server.log() and "Error" not in server.log(), server.log()
    finally:
        server.stop()


# -- the repeated request head (a connection answers repeats without its parser) -------------


def binary_infer(values: list[float], extra: bytes = b"") -> bytes:
    """A binary-data infer request of the identity model: same head for every 4 values."""
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    body = header + np.asarray(values, dtype=np.float32).tobytes()
    return post("/v2/models/identity/infer", body, b"Inference-Header-Content-Length: %d\r\n" % len(header) + extra)


def echoed(response: tuple[int, dict[str, str], bytes]) -> list[float]:
    status, headers, body = response
    assert status == 200, body
    if "inference-header-content-length" not in headers:  # a JSON answer
        return [float(x) for x in json.loads(body)["outputs"][0]["data"]]
    blob = body[int(headers["inference-header-content-length"]):]
    return np.frombuffer(blob, dtype=np.float32).tolist()


def test_repeated_heads_each_get_their_own_body(server: RunningServer) -> None:
    with connect(server) as sock:
        for index in range(20):  # one request per write: the first teaches the head
            sock.sendall(binary_infer([index, index + 1, index + 2, index + 3]))
            assert echoed(read_responses(sock, 1)[0]) == [index, index + 1, index + 2, index + 3]


def read_raw_response(sock: socket.socket) -> bytes:
    """One Content-Length-framed response, as the bytes that came (nothing may follow it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head = data[: data.index(b"\r\n\r\n")].decode("latin-1").lower()
    length = int(head.split("\r\ncontent-length:", 1)[1].split("\r\n", 1)[0])
    while len(data) < len(head) + 4 + length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    assert len(data) == len(head) + 4 + length, data
    return data


def test_repeated_answers_are_the_first_answer_byte_for_byte_with_their_own_values(server: RunningServer) -> None:
    # The first answer is encoded in full; its repeats reuse its remembered head and JSON
    # header (nereid's known answers): only the blob may differ.
    with connect(server) as sock:
        answers = []
        for index in range(8):
            sock.sendall(binary_infer([index, -index, 0.5, index * 2]))
            answers.append(read_raw_response(sock))
    first = answers[0]
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), first
    assert b"connection:" not in first.lower()
    for index, raw in enumerate(answers):
        assert raw[:-16] == first[:-16]
        assert np.frombuffer(raw[-16:], np.float32).tolist() == [index, -index, 0.5, index * 2]


def test_a_repeat_that_closes_its_connection_says_so(server: RunningServer) -> None:
    # A head taught by keep-alive requests, then the same request asking to close: a
    # different head, so the parser takes it and the answer carries connection: close.
    with connect(server) as sock:
        for index in range(3):
            sock.sendall(binary_infer([index] * 4))
            assert echoed(read_responses(sock, 1)[0]) == [index] * 4
        sock.sendall(binary_infer([7] * 4, b"Connection: close\r\n"))
        [response] = read_responses(sock, 1)
        assert echoed(response) == [7] * 4
        assert response[1]["connection"] == "close"
        assert sock.recv(1) == b""


def test_repeats_mixed_with_other_requests_split_anywhere_are_answered_in_order(server: RunningServer) -> None:
    requests = [binary_infer([k, k, k, k]) for k in range(6)]
    other = post("/v2/models/identity/infer", BODY)  # a JSON request: a different head
    longer = binary_infer([9, 9, 9, 9], b"X-Trace: 1\r\n")  # one more header
    stream = requests[0] + requests[1] + other + requests[2] + longer + requests[3] + requests[4] + requests[5]
    expected = [[0] * 4, [1] * 4, [1, 2, 3, 4], [2] * 4, [9] * 4, [3] * 4, [4] * 4, [5] * 4]
    head_length = requests[0].index(b"\r\n\r\n") + 4
    # cut points: inside a repeated head, right after it, inside a body, and between requests
    for cuts in ([], [head_length - 3], [head_length], [head_length + 7], [len(requests[0]) + head_length + 20],
                 [5, len(requests[0]) * 2 + len(other) + 3, len(stream) - 10]):
        with connect(server) as sock:
            sock.sendall(requests[0])  # learn the head first
            assert echoed(read_responses(sock, 1)[0]) == [0] * 4
            send_in_reads(sock, *(stream[start:end] for start, end in zip([0, *cuts], [*cuts, len(stream)])))
            answers = read_responses(sock, len(expected))
        assert [echoed(answer) for answer in answers] == expected, cuts


def test_line_breaks_after_a_body_do_not_teach_a_wrong_head(server: RunningServer) -> None:
    # A body of line breaks, then a stray line break in the same read: a head guessed as
    # "the read minus the body" would end two bytes into the body, and a pipelined pair of
    # these requests would then be cut in the wrong places.
    crlf_body = post("/v2/models/identity/infer", b"\r\n\r\n")
    with connect(server) as sock:
        sock.sendall(crlf_body + b"\r\n")
        ((status, _, first),) = read_responses(sock, 1)
        assert status in (400, 500), first
        sock.sendall(crlf_body + crlf_body)
        answers = read_responses(sock, 2)
        assert [(status, body) for status, _, body in answers] == [(status, first)] * 2
        sock.sendall(binary_infer([5] * 4))
        assert echoed(read_responses(sock, 1)[0]) == [5] * 4


def test_a_body_that_looks_like_a_repeat_is_still_a_body(server: RunningServer) -> None:
    repeat = binary_infer([3] * 4)
    carrier = post("/v2/models/missing/infer", repeat)  # its body is a whole infer request
    carrier_head = carrier[: carrier.index(b"\r\n\r\n") + 4]
    with connect(server) as sock:
        sock.sendall(repeat)
        assert echoed(read_responses(sock, 1)[0]) == [3] * 4
        send_in_reads(sock, carrier_head)  # the body comes in a read of its own, starting with the known head
        sock.sendall(repeat)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        statuses = [status for status, _, _ in read_responses(sock, 2)]
    assert statuses == [404, 200]


def test_a_head_that_closes_or_expects_continue_is_never_taken_as_a_repeat(server: RunningServer) -> None:
    with connect(server) as sock:
        for _ in range(3):  # Expect: 100-continue on every repeat gets its 100 Continue
            sock.sendall(binary_infer([1] * 4, b"Expect: 100-continue\r\n"))
            assert sock.recv(25).startswith(b"HTTP/1.1 100 Continue")
            assert echoed(read_responses(sock, 1)[0]) == [1] * 4
    with connect(server) as sock:
        sock.sendall(binary_infer([2] * 4, b"Connection: close\r\n"))
        assert echoed(read_responses(sock, 1)[0]) == [2] * 4
        assert sock.recv(100) == b""  # closed after the answer, not kept for repeats


def test_a_repeat_with_a_bad_body_fails_alone(server: RunningServer) -> None:
    good = binary_infer([1, 2, 3, 4])
    header_end = good.index(b"\r\n\r\n") + 4
    bad = good[:header_end] + b"!" + good[header_end + 1:]  # same head, broken JSON
    with connect(server) as sock:
        sock.sendall(good)
        assert echoed(read_responses(sock, 1)[0]) == [1, 2, 3, 4]
        sock.sendall(bad + good)
        (status, _, body), answer = read_responses(sock, 2)
        assert status == 400 or status == 500, body
        assert b"error" in body
        assert echoed(answer) == [1, 2, 3, 4]


def test_repeats_keep_their_heads_compression_both_ways(server: RunningServer) -> None:
    # The head's Content-Encoding and Accept-Encoding hold for every repeat of it.
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    # level 0 (stored blocks): every body compresses to the same length
    bodies = [gzip.compress(header + np.full(4, k, np.float32).tobytes(), compresslevel=0, mtime=0) for k in range(4)]
    assert len({len(body) for body in bodies}) == 1  # so every request has the same head
    extra = b"Inference-Header-Content-Length: %d\r\nContent-Encoding: gzip\r\nAccept-Encoding: gzip\r\n" % len(header)
    with connect(server) as sock:
        for k, body in enumerate(bodies):
            sock.sendall(post("/v2/models/identity/infer", body, extra))
            ((status, headers, answer),) = read_responses(sock, 1)
            assert status == 200, answer
            assert headers["content-encoding"] == "gzip"
            plain = gzip.decompress(answer)
            assert np.frombuffer(plain[int(headers["inference-header-content-length"]):], np.float32).tolist() == [k] * 4


def test_a_head_learnt_while_another_request_is_answered_serves_its_repeats(server: RunningServer) -> None:
    # The request that teaches the head waits behind a slow one (pipelined), so the head is
    # learnt before that request starts; its repeats are still read with its headers.
    slow = post("/v2/models/slow/infer", json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 0, 0, 0]}]}).encode())
    with connect(server) as sock:
        sock.sendall(slow)
        wait_until(lambda: server.gauge("nereid_batches_executing", "slow") == 1, "the slow request running")
        send_in_reads(sock, binary_infer([7] * 4, b"Accept-Encoding: deflate\r\n"),
                      binary_infer([8] * 4, b"Accept-Encoding: deflate\r\n"))
        answers = read_responses(sock, 3)
    assert answers[0][0] == 200
    for (status, headers, body), value in zip(answers[1:], (7, 8)):
        assert status == 200 and headers["content-encoding"] == "deflate", body
        plain = zlib.decompress(body)
        assert np.frombuffer(plain[int(headers["inference-header-content-length"]):], np.float32).tolist() == [value] * 4
