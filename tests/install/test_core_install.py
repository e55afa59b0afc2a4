"""The core installs the way a user's machine installs it, and serves numpy models without
torch: ``pip install .`` (no extras) into a fresh virtual environment (no system site
packages, so nothing of this venv's torch is visible), then that venv's ``nereid serve``
answers the stock clients. Slow-ish (a pip install; pip's cache keeps it under a minute
here), so it runs once, in the whole suite, not again under --isolation / --repo-format."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, free_port
from tests.waiting import START_TIMEOUT_S, wait_until

#: What `pip install .` reads: the project file, the README it names, the package.
SOURCES = ("pyproject.toml", "README.md", "server")
#: Never in the core: the example models' extra brings these.
HEAVY = ("torch", "transformers", "sentence_transformers")


def venv_env() -> dict[str, str]:
    """The environment a user's shell has: none of this test run's PYTHONPATH (which
    points at the source tree and would hide the installed package)."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("core-install")
    source = work / "nereid-src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=venv_env())
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True, text=True, timeout=600, env=venv_env(), check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv


def test_the_core_installs_without_torch(core_venv: Path) -> None:
    python = str(core_venv / "bin" / "python")
    code = (
        "import importlib.util, nereid, nereid.server, nereid.grpc.service; "
        f"print(nereid.__file__); print([m for m in {HEAVY!r} if importlib.util.find_spec(m) is not None])"
    )
    probe = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=venv_env(), cwd=core_venv)
    assert probe.returncode == 0, probe.stderr
    where, heavy = probe.stdout.splitlines()
    assert Path(where).is_relative_to(core_venv), where  # the installed copy, not the source tree
    assert heavy == "[]", f"the core pulled in {heavy}"
    torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=60, env=venv_env())
    assert torch.returncode != 0 and "No module named 'torch'" in torch.stderr


def test_the_core_alone_serves_a_numpy_model(core_venv: Path, tmp_path: Path) -> None:
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "nereid.log"
    command = [
        str(core_venv / "bin" / "nereid"), "serve", "--model-repository", str(ROOT / "model_repository"),
        "--model-control-mode", "explicit", "--load-model", "add_one", "simple",
        "--http-port", str(port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                   env=dict(venv_env(), PYTHONUNBUFFERED="1"))

    def ready() -> bool:
        assert process.poll() is None, f"nereid exited with {process.returncode}:\n{log_path.read_text()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_until(ready, "the core venv's server ready", timeout=START_TIMEOUT_S, every=0.05)
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        x = httpclient.InferInput("INPUT0", [1, 1], "INT64")
        x.set_data_from_numpy(np.array([[41]], dtype=np.int64))
        np.testing.assert_array_equal(http.infer("add_one", [x]).as_numpy("OUTPUT0"), [[42]])
        http.close()
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        y = grpcclient.InferInput("INPUT0", [1, 1], "INT64")
        y.set_data_from_numpy(np.array([[1]], dtype=np.int64))
        np.testing.assert_array_equal(grpc.infer("add_one", [y]).as_numpy("OUTPUT0"), [[2]])
        grpc.close()
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(60)
    log = log_path.read_text()
    assert status == 0, log
    assert "Traceback" not in log, log
