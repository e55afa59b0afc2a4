"""Stock perf_analyzer against a real nereid server: short smoke runs over HTTP (binary
tensors, JSON tensors, async) that must finish cleanly and show the server-side latency
breakdown, which perf_analyzer computes from the statistics endpoint."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ROOT, RepoBuilder, RunningServer, start_server

pytestmark = pytest.mark.perf

PERF_ANALYZER = ROOT / "perf" / "perf_analyzer"
#: The measurement flags of the smoke runs of perf_analyzer in the tests: windows of 300 ms,
#: any three readings in a row within 10x of each other counted as stable. These runs check
#: the protocol (perf_analyzer finishes cleanly and reads the server-side statistics),
#: never speed: on a quiet machine a run is three windows, about a second; on a loaded
#: one (a window with a handful of requests, then one with hundreds) perf_analyzer takes
#: up to ten windows to find three alike.
SMOKE_WINDOWS = ["-p", "300", "--stability-percentage", "1000", "--max-trials", "10"]
PerfRun = Callable[[str], "subprocess.CompletedProcess[str]"]

IDENTITY_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [16]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [16]
[dynamic_batching]
max_queue_delay_microseconds = 100
"""

MODES = {
    "binary": [],
    "json": ["--input-tensor-format=json", "--output-tensor-format=json"],
    "async": ["--async"],
}


def perf_analyzer_missing() -> str | None:
    """Why perf_analyzer cannot run here, or None when it can."""
    if not PERF_ANALYZER.is_file():
        return f"{PERF_ANALYZER} not found"
    try:
        result = subprocess.run([str(PERF_ANALYZER), "--version"], check=False, capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"{PERF_ANALYZER}: {exc}"
    if result.returncode != 0:
        return (result.stderr or result.stdout).strip() or f"perf_analyzer --version exited {result.returncode}"
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    missing = perf_analyzer_missing()
    if missing is not None:
        # make test installs it (make perf-analyzer); a suite without it must not pass quietly
        pytest.fail(f"perf_analyzer is not installed (make perf-analyzer): {missing}")
    repo = RepoBuilder(tmp_path_factory.mktemp("perf-repo"))
    repo.add("identity", IDENTITY_CONFIG)
    running = start_server(repo.root, log_dir=tmp_path_factory.mktemp("perf-logs"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def perf_run(server: RunningServer) -> PerfRun:
    """``perf_run(mode)``: one short perf_analyzer run per mode, shared by the tests."""

    @functools.cache
    def run(mode: str) -> subprocess.CompletedProcess[str]:
        command = [
            str(PERF_ANALYZER), "-m", "identity", "-u", server.url, "-i", "http", "-b", "1",
            "--concurrency-range", "4", *SMOKE_WINDOWS, *MODES[mode],
        ]
        return subprocess.run(command, check=False, capture_output=True, text=True, timeout=100)

    return run


@pytest.mark.parametrize("mode", list(MODES))
def test_perf_analyzer_run_finishes_cleanly(perf_run: PerfRun, mode: str) -> None:
    result = perf_run(mode)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "error" not in output.lower(), output
    assert "Thread [" not in output, output
    assert "Request concurrency: 4" in output, output


def test_perf_analyzer_shows_the_server_side_breakdown(perf_run: PerfRun) -> None:
    result = perf_run("binary")
    assert result.returncode == 0, result.stdout + result.stderr
    _, server_part = result.stdout.split("  Server: \n", 1)
    latency = next(line for line in server_part.splitlines() if "Avg request latency" in line)
    for part in ("queue", "compute input", "compute infer", "compute output"):
        assert part in latency, latency
    assert "Successful request count" in server_part
