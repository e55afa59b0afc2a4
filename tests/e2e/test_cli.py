"""`nereid serve` as users run it: a subprocess on a free loopback port."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, RepoBuilder, RunningServer

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
    deadline = time.monotonic() + 30
    while "server is" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert get(server, "/v2/health/live") == 200
    assert get(server, "/v2/health/ready") == 400
    assert get(server, "/v2/models/good/ready") == 200


def test_missing_repository_folder_is_a_clear_cli_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "nereid", "serve", "--model-repository", str(tmp_path / "nope")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert f"--model-repository {tmp_path / 'nope'}: not a folder" in result.stderr
