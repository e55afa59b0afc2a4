"""Hostile gRPC peers against a real server, each attack run against both engines (grpcio's
server is the reference): the server stays up, a stock tritonclient.grpc client is
served during and after the attack, and the native engine answers as RFC 9113 names."""

from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RepoBuilder, RunningServer, free_port, start_server
from tests.e2e.test_grpc import CONFIG, ENGINES

PATH = b"/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, CONTINUATION = 0, 1, 3, 4, 7, 9


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BHBBL", len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream_id) + payload


def request_block(extra: list[tuple[bytes, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    return hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH),
                                   (b":authority", b"x"), (b"content-type", b"application/grpc"),
                                   (b"te", b"trailers"), *extra])


def infer_message(model: str = "identity") -> bytes:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    payload = request.SerializeToString()
    return struct.pack(">BL", 0, len(payload)) + payload


class Attacker:
    """One raw connection; ``goaway()`` reads until the server's GOAWAY (its code) or a close."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def goaway(self, timeout: float = 20.0) -> int | None:
        buffer = b""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(1.0)
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buffer += chunk
            position = 0
            while len(buffer) - position >= 9:
                high, low, kind, _, _ = struct.unpack_from(">BHBBL", buffer, position)
                size = high << 16 | low
                if len(buffer) - position - 9 < size:
                    break
                if kind == GOAWAY:
                    return int(struct.unpack_from(">L", buffer, position + 13)[0])
                position += 9 + size
            buffer = buffer[position:]
        return None

    def close(self) -> None:
        self.sock.close()


def rapid_reset(attacker: Attacker) -> None:
    block, message = request_block(), infer_message()
    burst = b"".join(frame(HEADERS, 4, stream_id, block) + frame(DATA, 1, stream_id, message)
                     + frame(RST_STREAM, 0, stream_id, struct.pack(">L", 8)) for stream_id in range(1, 6001, 2))
    attacker.send(burst)


def continuation_flood(attacker: Attacker) -> None:
    block = request_block()
    attacker.send(frame(HEADERS, 0, 1, block[:4]) + frame(CONTINUATION, 0, 1) * 200_000)


def empty_data_flood(attacker: Attacker) -> None:
    attacker.send(frame(HEADERS, 4, 1, request_block()) + frame(DATA, 0, 1) * 200_000)


def gzip_bomb(attacker: Attacker) -> None:
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)  # 256 MiB in about 250 KiB
    message = struct.pack(">BL", 1, len(bomb)) + bomb
    frames = b"".join(frame(DATA, 1 if offset + 16384 >= len(message) else 0, 1, message[offset:offset + 16384])
                      for offset in range(0, len(message), 16384))
    attacker.send(frame(HEADERS, 4, 1, request_block([(b"grpc-encoding", b"gzip")])) + frames)


#: attack, the native engine's GOAWAY code (None: the call's own status, no GOAWAY)
ATTACKS: list[tuple[Callable[[Attacker], None], int | None]] = [
    (rapid_reset, 11), (continuation_flood, 11), (empty_data_flood, 11), (gzip_bomb, None),
]


@pytest.fixture(params=ENGINES)
def server(repo: RepoBuilder, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    repo.add("identity", CONFIG)
    running = start_server(repo.root, "--grpc-port", str(free_port()), "--grpc-server", request.param,
                           "--max-request-bytes-in-flight", str(64 << 20), log_dir=tmp_path)
    running.engine = request.param  # type: ignore[attr-defined]
    yield running
    running.stop()


@pytest.mark.parametrize("attack, code", ATTACKS, ids=[attack.__name__ for attack, _ in ATTACKS])
def test_a_client_is_served_while_an_attack_runs(server: RunningServer, attack: Callable[[Attacker], None],
                                                  code: int | None) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    client.infer("identity", [tensor])  # connected before the attack
    native = server.engine == "native"  # type: ignore[attr-defined]
    attacker = Attacker(int(server.grpc_url.rsplit(":", 1)[1]))
    thread = threading.Thread(target=attack, args=(attacker,), daemon=True)
    try:
        thread.start()
        answered = 0
        for _ in range(20):  # a normal client is served while the attack runs
            try:
                answer = client.infer("identity", [tensor], client_timeout=30)
            except InferenceServerException as exc:
                # grpcio, the reference, may cancel other clients' calls under rapid reset
                if native or attack is not rapid_reset or "CANCELLED" not in str(exc.status()):
                    raise
                continue
            np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))
            answered += 1
        thread.join(60)
        if native and code is not None:
            assert attacker.goaway() == code
    finally:
        attacker.close()
    assert (answered == 20 or not native) and client.is_server_live()
    fresh = grpcclient.InferenceServerClient(server.grpc_url)
    assert fresh.infer("identity", [tensor], client_timeout=30).as_numpy("OUTPUT0") is not None
    fresh.close()
    client.close()


def test_headers_and_reset_in_one_read_leave_no_coroutine_behind(repo: RepoBuilder, tmp_path: Path) -> None:
    """A streaming call opened and reset in the same read: its task never runs, and no
    'coroutine was never awaited' warning is left in the log."""
    repo.add("identity", CONFIG)
    server = start_server(repo.root, "--grpc-port", str(free_port()), log_dir=tmp_path)
    try:
        attacker = Attacker(int(server.grpc_url.rsplit(":", 1)[1]))
        stream_path = b"/inference.GRPCInferenceService/ModelStreamInfer"
        block = hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"), (b":path", stream_path),
                                        (b":authority", b"x"), (b"content-type", b"application/grpc")])
        attacker.send(b"".join(frame(HEADERS, 4, sid, block) + frame(RST_STREAM, 0, sid, struct.pack(">L", 8))
                               for sid in range(1, 41, 2)))
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_live()
        client.close()
        attacker.close()
    finally:
        server.stop()
    assert "never awaited" not in server.log()


@pytest.mark.workers_sensitive
def test_a_stream_that_never_reads_its_answers_stops_being_read(repo: RepoBuilder, tmp_path: Path) -> None:
    """ModelStreamInfer from a client that never reads: answers wait for its window, the
    requests read ahead of them are bounded, then its window is no longer given back, so
    it cannot make the server hold more and more; other clients are served meanwhile.
    Through front-end workers (the --workers pass) the same holds across the link: the
    main process stops answering once the worker holds a window of answers the client has
    not let out (send_windows.py), so it stops taking the requests too."""
    repo.add("identity", CONFIG)
    server = start_server(repo.root, "--grpc-port", str(free_port()), log_dir=tmp_path)
    try:
        attacker = Attacker(int(server.grpc_url.rsplit(":", 1)[1]))
        block = hpack.Encoder().encode([(b":method", b"POST"), (b":scheme", b"http"),
                                        (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
                                        (b":authority", b"x"), (b"content-type", b"application/grpc")])
        message = infer_message()
        attacker.send(frame(HEADERS, 4, 1, block))
        chunk = frame(DATA, 0, 1, message * (16000 // len(message)))
        granted, sent, buffer = 4 << 20, 0, b""  # the server's SETTINGS: a 4 MiB stream window
        attacker.sock.settimeout(3.0)
        while sent < 32 << 20:  # a client that honours its window, and never gives the server one
            if sent + len(chunk) - 9 <= granted:
                attacker.sock.sendall(chunk)
                sent += len(chunk) - 9
                continue
            try:  # wait for the server to give window back (reading, never acknowledging)
                data = attacker.sock.recv(1 << 16)
            except socket.timeout:
                break  # none came: the server stopped taking this stream's requests
            buffer += data
            while len(buffer) >= 9:
                high, low, kind, _, stream_id = struct.unpack_from(">BHBBL", buffer)
                size = high << 16 | low
                if len(buffer) < 9 + size:
                    break
                if kind == 8 and stream_id == 1:  # WINDOW_UPDATE
                    granted += struct.unpack_from(">L", buffer, 9)[0]
                buffer = buffer[9 + size:]
        assert sent < 16 << 20
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("identity", [tensor], client_timeout=30).as_numpy("OUTPUT0") is not None
        client.close()
        attacker.close()
    finally:
        server.stop()
