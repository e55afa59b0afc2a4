"""TLS on both protocols against a real server, with certificates the tests make: stock
tritonclient.http over HTTPS (each HTTP engine) and tritonclient.grpc over TLS (both gRPC
engines), mutual TLS, a plaintext client at a TLS port refused cleanly while the server
goes on, an unfinished TLS handshake timed out, and a flood of unfinished handshakes that
does not keep a normal client waiting."""

from __future__ import annotations

import socket
import ssl
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import conftest
from tests.certificates import Certificates, make_certificates
from tests.conftest import RepoBuilder, RunningServer, start_server
from tests.e2e.test_grpc import CONFIG, ENGINES
from tests.waiting import START_TIMEOUT_S, wait_until

HTTP_ENGINES = ["native", "uvicorn", "hypercorn", "granian"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


def _tls_flags(certs: Certificates, protocol: str, *, mutual: bool = False) -> list[str]:
    flags = [f"--{protocol}-use-ssl", "true", f"--{protocol}-server-cert", str(certs.server_cert),
             f"--{protocol}-server-key", str(certs.server_key)]
    if mutual:
        flags += [f"--{protocol}-root-cert", str(certs.ca), f"--{protocol}-use-ssl-mutual", "true"]
    return flags


def _serve(repo: RepoBuilder, tmp_path: Path, certs: Certificates, *flags: str, mutual: bool = False,
           engine: str | None = None) -> Iterator[RunningServer]:
    repo.add("identity", CONFIG)
    https = "--http-use-ssl" in flags
    server = start_server(repo.root, *flags, log_dir=tmp_path, engine=engine,
                          ssl_context=certs.client_context(mutual=mutual) if https else None)
    try:
        yield server
    finally:
        server.stop()


def _http_client(server: RunningServer, certs: Certificates, *, mutual: bool = False) -> httpclient.InferenceServerClient:
    options: dict[str, Any] = {"ca_certs": str(certs.ca)}
    if mutual:
        options.update(certfile=str(certs.client_cert), keyfile=str(certs.client_key))
    return httpclient.InferenceServerClient(server.url, ssl=True, ssl_options=options)


def _grpc_client(server: RunningServer, certs: Certificates, *, mutual: bool = False,
                 stranger: bool = False) -> grpcclient.InferenceServerClient:
    extra: dict[str, Any] = {}
    if mutual:
        cert, key = (certs.other_client_cert, certs.other_client_key) if stranger else (certs.client_cert, certs.client_key)
        extra = {"private_key": str(key), "certificate_chain": str(cert)}
    return grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(certs.ca), **extra,
    )


def _http_infer(client: httpclient.InferenceServerClient) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    infer_input = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(data)
    return client.infer("identity", [infer_input]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def _grpc_infer(client: grpcclient.InferenceServerClient) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    infer_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(data)
    return client.infer("identity", [infer_input]).as_numpy("OUTPUT0")  # type: ignore[no-any-return]


def _plaintext_http_fails(server: RunningServer) -> None:
    """A plaintext HTTP request to the TLS port gets no HTTP answer: the connection is closed."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert not received.startswith(b"HTTP/1.1 200")


# -- HTTPS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", HTTP_ENGINES)
def test_https_serves_stock_tritonclient_on_every_engine(repo: RepoBuilder, tmp_path: Path, certs: Certificates,
                                                           engine: str) -> None:
    for server in _serve(repo, tmp_path, certs, *_tls_flags(certs, "http"), "--allow-grpc", "false", engine=engine):
        client = _http_client(server, certs)
        assert client.is_server_ready()
        np.testing.assert_array_equal(_http_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
        _plaintext_http_fails(server)
        assert client.is_server_live()  # the server goes on
        client.close()
    assert str(certs.server_key.parent) not in server.log()  # no certificate path in the log, whatever the engine


def test_https_plaintext_client_fails_cleanly_and_server_goes_on(repo: RepoBuilder, tmp_path: Path,
                                                                  certs: Certificates) -> None:
    for server in _serve(repo, tmp_path, certs, *_tls_flags(certs, "http"), "--allow-grpc", "false"):
        plain = httpclient.InferenceServerClient(server.url, network_timeout=30)
        with pytest.raises(Exception):
            plain.is_server_live()
        plain.close()
        client = _http_client(server, certs)
        np.testing.assert_array_equal(_http_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
        client.close()


def test_https_mutual_accepts_a_signed_client_and_refuses_others(repo: RepoBuilder, tmp_path: Path,
                                                                  certs: Certificates) -> None:
    flags = _tls_flags(certs, "http", mutual=True)
    for server in _serve(repo, tmp_path, certs, *flags, "--allow-grpc", "false", mutual=True):
        client = _http_client(server, certs, mutual=True)
        assert client.is_server_ready()
        client.close()
        for context in (certs.client_context(), _context_with(certs, certs.other_client_cert, certs.other_client_key)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
                    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                        tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                        if not tls.recv(4096):  # TLS 1.3: the refusal comes after the handshake
                            raise ConnectionError("closed")
        client = _http_client(server, certs, mutual=True)
        assert client.is_server_live()
        client.close()


def _tls_worker(server: RunningServer, context: ssl.SSLContext) -> int:
    """Answer one request on a new TLS connection: the pid of the front-end worker that
    held it (read from /proc while the connection is open)."""
    from tests.e2e.test_frontend_workers import serving_worker

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = tls.recv(4096)
            if not answer:  # TLS 1.3: a refused client certificate shows after the handshake
                raise ConnectionError("closed")
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            port = tls.getsockname()[1]
            pid: int = wait_until(lambda: serving_worker(server, port), "the connection's worker")
            return pid


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see which worker holds a connection")
def test_https_through_two_front_end_workers_each_with_the_same_tls_settings(
        repo: RepoBuilder, tmp_path: Path, certs: Certificates) -> None:
    import shutil
    import signal

    from tests.e2e.test_frontend_workers import worker_pids

    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(certs.server_cert, live_cert)
    shutil.copy(certs.server_key, live_key)
    flags = ["--http-use-ssl", "true", "--http-server-cert", str(live_cert), "--http-server-key", str(live_key),
             "--http-root-cert", str(certs.ca), "--http-use-ssl-mutual", "true"]
    for server in _serve(repo, tmp_path, certs, *flags, "--http-workers", "2", "--allow-grpc", "false", mutual=True):
        assert len(worker_pids(server)) == 2
        served: set[int] = set()
        for _ in range(200):  # until the kernel has handed a connection to each worker
            served.add(_tls_worker(server, certs.client_context(mutual=True)))
            if len(served) == 2:
                break
        assert served == worker_pids(server)
        for _ in range(4):  # stock tritonclient, its connections wherever the kernel puts them
            client = _http_client(server, certs, mutual=True)
            assert client.is_server_ready()
            np.testing.assert_array_equal(_http_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
            client.close()
        for context in (certs.client_context(), _context_with(certs, certs.other_client_cert, certs.other_client_key)):
            for _ in range(4):  # no client certificate, or a stranger's: refused by every worker
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    _tls_worker(server, context)
        # SIGHUP to the main process: every worker reads the renewed certificate
        renewed = make_certificates(tmp_path / "renewed")
        shutil.copy(renewed.server_cert, live_cert)
        shutil.copy(renewed.server_key, live_key)
        server.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "read again" in server.log(), "the certificates read again")
        renewed_client = ssl.create_default_context(cafile=str(renewed.ca))
        renewed_client.load_cert_chain(certs.client_cert, certs.client_key)  # the root of clients is unchanged

        def renewed_on_both() -> bool:
            seen = set()
            for _ in range(40):
                try:
                    seen.add(_tls_worker(server, renewed_client))
                except ssl.SSLError:
                    return False  # a worker still serves the old certificate
                if len(seen) == 2:
                    return True
            return False

        wait_until(renewed_on_both, "both workers serving the renewed certificate")
        assert "still serving the certificate read before" not in server.log()  # no worker failed to reload


def _context_with(certs: Certificates, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(cert, key)
    return context


def test_unfinished_tls_handshake_is_timed_out(repo: RepoBuilder, tmp_path: Path, certs: Certificates) -> None:
    flags = [*_tls_flags(certs, "http"), *_tls_flags(certs, "grpc"), "--http-header-timeout-secs", "1",
             "--grpc-handshake-timeout-secs", "1"]
    for server in _serve(repo, tmp_path, certs, *flags):
        for port in (server.port, server.grpc_port):
            assert port is not None
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"\x16\x03\x01\x00")  # the start of a ClientHello, never finished
                # The server closes it (the 30 s socket timeout would fail the test first).
                assert sock.recv(4096) == b""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_flood_of_unfinished_handshakes_does_not_starve_a_client(repo: RepoBuilder, tmp_path: Path,
                                                                 certs: Certificates, protocol: str) -> None:
    for server in _serve(repo, tmp_path, certs, *_tls_flags(certs, "http"), *_tls_flags(certs, "grpc")):
        port = server.port if protocol == "http" else server.grpc_port
        assert port is not None
        half_open = []
        try:
            for _ in range(200):
                sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                sock.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello's first bytes, then nothing
                half_open.append(sock)
            if protocol == "http":
                client = _http_client(server, certs)
                np.testing.assert_array_equal(_http_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
                client.close()
            else:
                with _grpc_client(server, certs) as grpc_client:
                    np.testing.assert_array_equal(_grpc_infer(grpc_client), np.arange(4, dtype=np.float32).reshape(1, 4))
        finally:
            for sock in half_open:
                sock.close()


# -- gRPC over TLS --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_grpc_tls_serves_stock_tritonclient(repo: RepoBuilder, tmp_path: Path, certs: Certificates,
                                            engine: str) -> None:
    flags = [*_tls_flags(certs, "grpc"), "--grpc-server", engine]
    for server in _serve(repo, tmp_path, certs, *flags):
        with _grpc_client(server, certs) as client:
            assert client.is_server_ready()
            np.testing.assert_array_equal(_grpc_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
        with grpcclient.InferenceServerClient(server.grpc_url) as plain:  # plaintext to the TLS port
            with pytest.raises(InferenceServerException):
                plain.is_server_live(client_timeout=10)
        with _grpc_client(server, certs) as client:
            assert client.is_server_live()  # the server goes on


@pytest.mark.parametrize("engine", ENGINES)
def test_grpc_mutual_tls_accepts_a_signed_client_and_refuses_a_stranger(repo: RepoBuilder, tmp_path: Path,
                                                                         certs: Certificates, engine: str) -> None:
    flags = [*_tls_flags(certs, "grpc", mutual=True), "--grpc-server", engine]
    for server in _serve(repo, tmp_path, certs, *flags):
        with _grpc_client(server, certs, mutual=True) as client:
            np.testing.assert_array_equal(_grpc_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
        with _grpc_client(server, certs, mutual=True, stranger=True) as stranger:
            with pytest.raises(InferenceServerException):
                stranger.is_server_live(client_timeout=10)
        with _grpc_client(server, certs) as anonymous:  # no client certificate at all
            with pytest.raises(InferenceServerException):
                anonymous.is_server_live(client_timeout=10)


def test_missing_certificate_stops_the_server_naming_the_flag(repo: RepoBuilder, tmp_path: Path) -> None:
    import subprocess
    import sys

    repo.add("identity", CONFIG)
    missing = tmp_path / "secret-place" / "cert.pem"
    result = subprocess.run(
        [sys.executable, "-m", "nereid", "serve", "--model-repository", str(repo.root), "--http-port", "0",
         "--allow-grpc", "false", "--allow-metrics", "false", "--http-use-ssl", "true",
         "--http-server-cert", str(missing), "--http-server-key", str(missing)],
        capture_output=True, text=True, timeout=START_TIMEOUT_S,
    )
    assert result.returncode == 1
    assert "--http-server-cert / --http-server-key: No such file or directory" in result.stderr
    assert "secret-place" not in result.stderr + result.stdout  # no certificate path in what it says


def test_failed_handshakes_do_not_use_up_the_connection_limits(repo: RepoBuilder, tmp_path: Path,
                                                               certs: Certificates) -> None:
    flags = [*_tls_flags(certs, "http"), *_tls_flags(certs, "grpc"), "--http-max-connections", "4",
             "--grpc-max-connections", "4"]
    for server in _serve(repo, tmp_path, certs, *flags):
        for port in (server.port, server.grpc_port):
            assert port is not None
            for _ in range(10):  # plaintext clients: each handshake fails and the server drops it
                with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" if port == server.port else b"PRI * HTTP/2.0\r\n\r\n")
                    while sock.recv(4096):
                        pass
        client = _http_client(server, certs)
        np.testing.assert_array_equal(_http_infer(client), np.arange(4, dtype=np.float32).reshape(1, 4))
        client.close()
        with _grpc_client(server, certs) as grpc_client:
            np.testing.assert_array_equal(_grpc_infer(grpc_client), np.arange(4, dtype=np.float32).reshape(1, 4))


def test_sighup_reloads_the_server_certificate_of_the_native_engines(repo: RepoBuilder, tmp_path: Path,
                                                                     certs: Certificates) -> None:
    import shutil
    import signal
    import time

    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(certs.server_cert, live_cert)
    shutil.copy(certs.server_key, live_key)
    flags = ["--http-use-ssl", "true", "--http-server-cert", str(live_cert), "--http-server-key", str(live_key),
             "--grpc-use-ssl", "true", "--grpc-server-cert", str(live_cert), "--grpc-server-key", str(live_key)]
    renewed = make_certificates(tmp_path / "renewed")  # another CA: a client trusting only it tells them apart
    # HTTP and gRPC in the main process, and HTTP again in each front-end worker (--workers)
    reloads = 2 + (conftest.WORKERS if conftest.WORKERS > 1 else 0)
    for server in _serve(repo, tmp_path, certs, *flags):
        with pytest.raises(ssl.SSLError):
            _handshake(server.port, renewed)
        shutil.copy(renewed.server_cert, live_cert)
        shutil.copy(renewed.server_key, live_key)
        server.process.send_signal(signal.SIGHUP)
        # until every reload is logged (the signal is handled on each process's loop)
        wait_until(lambda: server.log().count("read again") == reloads,
                   lambda: f"the certificates read again {reloads} times: {server.log()}")
        assert server.log().count("-server-cert and --") == reloads, server.log()
        _handshake(server.port, renewed)
        with _grpc_client(server, renewed) as client:
            assert client.is_server_live()
        assert str(live_cert) not in server.log()  # no certificate path in the log


def _handshake(port: int, certs: Certificates) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1"):
            pass


def test_sighup_with_an_asgi_engine_says_its_certificates_are_read_at_start_only(
        repo: RepoBuilder, tmp_path: Path, certs: Certificates) -> None:
    import signal
    import time

    for server in _serve(repo, tmp_path, certs, *_tls_flags(certs, "http"), "--allow-grpc", "false", engine="uvicorn"):
        server.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "read at start only" in server.log(), "the SIGHUP answered in the log")
        assert "TLS: --http certificates are read at start only by this engine (restart to replace them)" in server.log()
        client = _http_client(server, certs)
        assert client.is_server_live()  # still serving, with the certificate it started with
        client.close()
