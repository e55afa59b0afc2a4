"""Every error is JSON, whatever escapes: Triton's ``{"error": "..."}`` with a message
naming what was wrong, on every route and every engine. A model name too long for the
filesystem is refused before the filesystem (like the other names that are not folder
names); an OSError met reading a model folder names the model and the OS error; and an
unexpected exception in any handler is logged with its traceback and answered as a JSON
500 ``internal error in <what>: <ExceptionType>: <message>``, the server serving on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid.http.app import NereidApp, create_app
from nereid.http.h1.asgi_bridge import AsgiExchange
from nereid.http.generate import GenerateHandler
from nereid.models.manager import ModelManager
from nereid.options import ServerOptions
from nereid.repository.scan import read_model
from tests.conftest import IDENTITY_CONFIG, ROOT, RepoBuilder, RunningServer, free_port
from tests.waiting import START_TIMEOUT_S, wait_until

ENGINES = ["native", "uvicorn"]
LONG = "m" * 300
LONG_REFUSAL = (
    f"invalid model name '{LONG}': expected the name of a folder in the model repository, "
    "but it is 300 bytes long, and a folder name has at most 255"
)


def request(server: RunningServer, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) of one request, whatever its status."""
    call = urllib.request.Request(server.http + path, data=body, method=method)
    try:
        with urllib.request.urlopen(call, timeout=30) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def error_of(server: RunningServer, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    """(status, message) of a request that must fail with a JSON error body."""
    status, content_type, payload = request(server, method, path, body)
    assert status >= 400, (method, path, status, payload)
    assert content_type == "application/json", (method, path, content_type, payload)
    obj = json.loads(payload)
    assert list(obj) == ["error"], obj
    return status, obj["error"]


# -- the long name, 404 and 405, on each engine -------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_an_over_long_model_name_is_refused_before_the_filesystem(serve, repo: RepoBuilder, engine: str) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", IDENTITY_CONFIG)
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "m", engine=engine)
    for action in ("load", "unload"):
        assert error_of(server, "POST", f"/v2/repository/models/{LONG}/{action}") == (400, LONG_REFUSAL)
    # Multi-byte characters count in bytes, as the filesystem counts them.
    wide = "é" * 128  # 256 bytes in UTF-8
    status, message = error_of(server, "POST", f"/v2/repository/models/{urllib.parse.quote(wide)}/load")
    assert (status, message) == (400, f"invalid model name '{wide}': expected the name of a folder in the model "
                                      "repository, but it is 256 bytes long, and a folder name has at most 255")
    # 255 bytes is a name like any other: not in the repository, so not loaded.
    status, message = error_of(server, "POST", f"/v2/repository/models/{'n' * 255}/load")
    assert status == 500 and message.startswith(f"failed to load '{'n' * 255}', ") and "not found" in message
    # Routes that only look the name up say it is unknown, in Triton's words.
    assert error_of(server, "GET", f"/v2/models/{LONG}") == (404, f"Request for unknown model: '{LONG}' is not found")
    assert error_of(server, "GET", f"/v2/models/{LONG}/ready") == (
        400, f"Model version not ready: Request for unknown model: '{LONG}' is not found")
    assert request(server, "GET", "/v2/health/ready")[0] == 200
    assert "Traceback" not in server.log()
    assert server.stop() == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_routes_and_methods_are_tritons_json(serve, repo: RepoBuilder, engine: str) -> None:  # type: ignore[no-untyped-def]
    repo.add("m", IDENTITY_CONFIG)
    server = serve(repo.root, engine=engine)
    for method, path in (("GET", "/nope"), ("GET", "/v2/models/m/"), ("POST", "/v2/health"),
                         ("DELETE", "/v2/unknown"), ("GET", "/v2/models/m/versions/x")):
        assert error_of(server, method, path) == (404, "Not Found"), (method, path)
    for method, path in (("POST", "/v2"), ("GET", "/v2/repository/models/m/load"), ("PUT", "/v2/models/m"),
                         ("DELETE", "/v2/health/live"), ("GET", "/v2/models/m/infer"), ("OPTIONS", "/v2")):
        assert error_of(server, method, path) == (405, "Method Not Allowed"), (method, path)


# -- an unexpected exception in a handler, over a real server -------------------------------

#: Starts nereid with some handlers replaced by one that raises (a bug stand-in).
LAUNCHER = """
import sys

from nereid.http.endpoints import Endpoints
from nereid.http.generate import GenerateHandler
from nereid.http.infer import InferEndpoint
from nereid.http.operations import Operations


async def boom(*args, **kwargs):
    raise RuntimeError("boom")


Endpoints.server_metadata = boom
Endpoints.repository_index = boom
Operations.logging = boom
GenerateHandler.__call__ = boom
InferEndpoint.asgi = boom  # the ASGI engines' infer (the native engine answers infer itself)

from nereid.cli import main

sys.exit(main(sys.argv[1:]))
"""


def start_patched(repository: Path, tmp_path: Path, engine: str) -> RunningServer:
    launcher = tmp_path / "launch_patched.py"
    launcher.write_text(textwrap.dedent(LAUNCHER))
    port = free_port()
    log_path = tmp_path / f"nereid-{port}.log"
    command = [sys.executable, str(launcher), "serve", "--model-repository", str(repository), "--http-port", str(port), "--grpc-port", str(free_port()),
               "--metrics-port", str(free_port()), "--http-server", engine]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    server = RunningServer(process, port, log_path)

    def ready() -> bool:
        assert process.poll() is None, server.log()
        try:
            with urllib.request.urlopen(server.http + "/v2/health/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    wait_until(ready, f"the patched server ready (its log: {log_path})", timeout=START_TIMEOUT_S, every=0.05)
    return server


@pytest.mark.parametrize("engine", ENGINES)
def test_an_exception_in_any_handler_is_a_logged_json_500(repo: RepoBuilder, tmp_path: Path, engine: str) -> None:
    repo.add("m", IDENTITY_CONFIG)
    server = start_patched(repo.root, tmp_path, engine)
    try:
        cases = [
            ("GET", "/v2", None),  # an endpoint
            ("POST", "/v2/repository/index", b"{}"),
            ("POST", "/v2/logging", b"{}"),  # an operation
            ("POST", "/v2/models/m/generate", b'{"INPUT0": [1, 2, 3, 4]}'),  # a raw ASGI route
        ]
        if engine != "native":
            cases.append(("POST", "/v2/models/m/infer", b"{}"))  # the ASGI fast path
        for method, path, body in cases:
            assert error_of(server, method, path, body) == (500, f"internal error in {method} {path}: RuntimeError: boom")
        log = server.log()
        for method, path, _ in cases:
            assert f"internal error in {method} {path}\nTraceback (most recent call last):" in log
        assert log.count('raise RuntimeError("boom")') == len(cases)  # once each: never logged twice
        # and the server serves on
        client = httpclient.InferenceServerClient(server.url)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        if engine == "native":
            assert client.infer("m", [x]).as_numpy("OUTPUT0").tolist() == [[1.0] * 4]
        assert client.is_server_ready()
        client.close()
    finally:
        if server.process.poll() is None:
            server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) == 0, server.log()


# -- in process: the app, the native bridge, the repository ---------------------------------


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def asgi_request(app: Any, method: str, path: str, body: bytes = b"") -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://nereid") as client:
        return await client.request(method, path, content=body)


def app_over(root: Path) -> NereidApp:
    manager = ModelManager(root, mode="explicit")
    return create_app(manager, ServerOptions(model_repository=root))


def test_an_exception_after_the_response_started_is_logged_and_cuts_the_response(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def half(self: Any, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise ValueError("mid-stream")

    monkeypatch.setattr(GenerateHandler, "__call__", half)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    path = "/v2/models/m/generate_stream"
    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [], "scheme": "http", "http_version": "1.1", "server": None, "client": None}
    run(app_over(tmp_path)(scope, receive, send))
    # Nothing after what was sent: the engine closes the connection (no second response).
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[-1]["more_body"]
    assert f"internal error in POST {path}" in caplog.text
    assert "ValueError: mid-stream" in caplog.text


def test_the_native_bridge_answers_another_apps_exception_as_json() -> None:
    class Connection:
        gone = False

        def __init__(self) -> None:
            self.replies: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []

        def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
            self.replies.append((status, headers, body))

        def close(self) -> None:
            raise AssertionError("not expected")

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise KeyError("k")

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def main(app: Callable[..., Any]) -> Connection:
        connection = Connection()
        scope = {"type": "http", "method": "GET", "path": "/x"}
        await AsgiExchange(connection, app, scope).run(b"")
        return connection

    (status, headers, body), = run(main(failing)).replies
    assert (status, headers, json.loads(body)) == (
        500, [(b"content-type", b"application/json")], {"error": "internal error in GET /x: KeyError: 'k'"}
    )
    (status, _, body), = run(main(silent)).replies
    assert (status, json.loads(body)) == (500, {"error": "internal error in GET /x: the app returned without a response"})


def test_an_os_error_reading_a_model_folder_names_the_model_and_the_error(tmp_path: Path) -> None:
    root = tmp_path / ("r" * 300)  # every path below it is too long for the filesystem
    source = read_model(root, "m")
    assert source.config is None
    assert source.error == f"{root / 'm'}: cannot read the model folder: File name too long"
    # through the load endpoint: 500, "failed to load 'm', <the OS error>"
    response = run(asgi_request(app_over(root), "POST", "/v2/repository/models/m/load"))
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert message.startswith("failed to load 'm', ") and "File name too long" in message, message
