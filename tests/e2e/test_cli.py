"""`nereid serve` as users run it: a subprocess on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, RepoBuilder, RunningServer, free_port
from tests.waiting import START_TIMEOUT_S, wait_until

GOOD = """
max_batch_size = 4
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [2]
"""


def get(server: RunningServer, path: str) -> int:
    try:
        with urllib.request.urlopen(server.http + path, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_serve_starts_reports_ready_and_stops_quickly_on_sigterm(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(EXAMPLES)
    assert get(server, "/v2/health/live") == 200
    assert get(server, "/v2/health/ready") == 200
    assert get(server, "/v2/models/add_one/ready") == 200
    assert get(server, "/v2/models/simple/ready") == 200
    assert server.stop() == 0  # stop() fails the test if SIGTERM does not end the server
    rows = [line.split("|")[1:4] for line in server.log().splitlines() if line.startswith("| ")]
    table = {name.strip(): (version.strip(), status.strip()) for name, version, status in rows}
    for model in ("add_one", "simple", "text_embedder", "text_generator"):
        assert table[model] == ("1", "READY")


@pytest.mark.without_workers("runs the command line itself")
def test_python_dash_m_nereid_shows_the_tritonserver_flags() -> None:
    result = subprocess.run([sys.executable, "-m", "nereid", "serve", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--model-repository", "--http-address", "--http-port", "--metrics-port", "--model-control-mode",
                 "--repository-poll-secs", "--load-model", "--strict-readiness", "--log-verbose", "--http-server"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("name", "config", "model", "reason"),
    [
        pytest.param("bad_toml", "max_batch_size = [", None, "bad_toml/config.toml: invalid TOML", id="bad-toml"),
        pytest.param("bad_key", "max_batch_sise = 3\n" + GOOD, None,
                     'unknown key "max_batch_sise" (did you mean "max_batch_size"?)', id="unknown-key"),
        pytest.param("no_file", GOOD, "", "model.py: model file not found", id="missing-model-file"),
        pytest.param("import_error", GOOD, "import not_a_module_abc\n", "No module named 'not_a_module_abc'", id="import-error"),
        pytest.param("init_error", GOOD, "class Model:\n    def __init__(self, context):\n        raise ValueError('no weights')\n"
                     "    def infer(self, inputs):\n        return {}\n", "ValueError: no weights", id="init-raises"),
    ],
)
def test_a_broken_model_is_unavailable_with_its_reason_and_the_others_serve(
    serve, repo: RepoBuilder, name: str, config: str, model: str | None, reason: str  # type: ignore[no-untyped-def]
) -> None:
    repo.add("good", GOOD)
    folder = repo.add(name, config, model=None)
    if model:
        (folder / "model.py").write_text(model)
    elif model is None:
        (folder / "model.py").write_text("class Model:\n    def infer(self, inputs):\n        return inputs\n")
    server = serve(repo.root, "--strict-readiness", "false")
    assert get(server, "/v2/models/good/ready") == 200
    assert get(server, f"/v2/models/{name}/ready") != 200
    # strict readiness (the default) would say not ready; with false the server is ready
    assert get(server, "/v2/health/ready") == 200
    server.stop()
    log = server.log()
    row = next(line for line in log.splitlines() if line.startswith(f"| {name} "))
    assert "UNAVAILABLE: " in row
    assert reason in row


def test_strict_readiness_is_not_ready_while_a_model_is_unavailable(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("good", GOOD)
    repo.add("broken", "max_batch_size = -1\n")
    server = serve(repo.root, wait_ready=False)
    wait_until(lambda: "server is" in server.log(), "the initial load to finish", every=0.05)
    assert get(server, "/v2/health/live") == 200
    assert get(server, "/v2/health/ready") == 400
    assert get(server, "/v2/models/good/ready") == 200


@pytest.mark.without_workers("runs the command line itself")
def test_missing_repository_folder_is_a_clear_cli_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "nereid", "serve", "--model-repository", str(tmp_path / "nope")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == f"nereid: --model-repository {tmp_path / 'nope'}: no such folder\n"
    (tmp_path / "file").write_text("")
    result = run_cli("serve", "--model-repository", str(tmp_path / "file"))
    assert (result.returncode, result.stderr) == (2, f"nereid: --model-repository {tmp_path / 'file'}: not a folder\n")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nereid", *args], capture_output=True, text=True, timeout=START_TIMEOUT_S,
                          cwd=ROOT)


@pytest.mark.without_workers("runs the command line itself")
@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(("--bogus",), "nereid: unrecognized arguments: --bogus (see 'nereid serve --help')", id="unknown-flag"),
        pytest.param(("--http-port", "x"), "nereid serve: argument --http-port: expected a port 0..65535, got 'x' "
                     "(see 'nereid serve --help')", id="bad-port"),
        pytest.param(("--model-control-mode", "sometimes"), "nereid serve: argument --model-control-mode: invalid choice: "
                     "'sometimes' (choose from 'none', 'poll', 'explicit') (see 'nereid serve --help')", id="bad-choice"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(args: tuple[str, ...], error: str) -> None:
    result = run_cli("serve", "--model-repository", str(EXAMPLES), *args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", error + "\n")


@pytest.mark.without_workers("runs the command line itself")
def test_a_busy_http_port_is_one_line_and_a_non_zero_exit_before_any_model_loads(repo: RepoBuilder) -> None:
    repo.add("good", GOOD)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--model-repository", str(repo.root), "--http-port", str(port),
                         "--metrics-port", str(free_port()))
    assert result.returncode == 1
    assert result.stderr == (
        f"nereid: cannot listen on 127.0.0.1:{port}: address already in use "
        "(another server is running there? choose another --http-port)\n"
    )


def test_serving_is_logged_once_the_port_is_bound(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    repo.add("good", GOOD)
    server = serve(repo.root)
    lines = server.log().splitlines()
    serving = next(i for i, line in enumerate(lines) if "nereid serving" in line)
    loaded = next(i for i, line in enumerate(lines) if "successfully loaded 'good'" in line)
    assert f"on 127.0.0.1:{server.port} (HTTP engine: native)" in lines[serving]
    assert serving < loaded  # bound first, so a busy port fails before any model loads


def test_load_model_takes_several_names_like_tritonserver(serve, repo: RepoBuilder) -> None:  # type: ignore[no-untyped-def]
    for name in ("a", "b", "c", "d"):
        repo.add(name, GOOD)
    server = serve(repo.root, "--model-control-mode", "explicit", "--load-model", "a", "b", "--load-model", "c")
    assert [get(server, f"/v2/models/{name}/ready") for name in ("a", "b", "c", "d")] == [200, 200, 200, 400]
