"""perf/request_path.py's count of the modules one infer request crosses (issue #28's
"short request path"): at most 12 modules in at most 6 packages for HTTP and for gRPC,
the HTTP surface's own part (connection, request reader, infer, its memo) at most 4.

The script starts a real server in a subprocess and traces one warm request per path; it
runs once for the whole module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 12
MAX_PACKAGES = 6


@pytest.fixture(scope="module")
def paths() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "perf" / "request_path.py"), "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _http_modules(modules: list[str]) -> list[str]:
    return [module for module in modules if module.startswith("nereid.http.")]


@pytest.mark.timeout(360)
def test_an_http_binary_infer_crosses_four_http_modules(paths: dict[str, Any]) -> None:
    assert _http_modules(paths["http"]["modules"]) == [
        "nereid.http.h1.connection", "nereid.http.h1.request_reader", "nereid.http.infer", "nereid.http.infer_memo",
    ]


@pytest.mark.timeout(360)
def test_an_http_json_infer_adds_only_the_full_parser(paths: dict[str, Any]) -> None:
    extra = set(_http_modules(paths["http_json"]["modules"])) - set(_http_modules(paths["http"]["modules"]))
    assert extra <= {"nereid.http.infer_request", "nereid.http.request_json", "nereid.http.infer_response"}


# The core's part (scheduling.clock, tensors.device, tensors.shared_memory, config.schema,
# datatypes, models.manager off the shared path) is the core helper's branch, merged by the
# lead later: remove this xfail then.
@pytest.mark.xfail(strict=False, reason="issue #28: the core's calls off the shared path land with the core branch")
@pytest.mark.timeout(360)
def test_an_http_infer_crosses_at_most_12_modules_in_6_packages(paths: dict[str, Any]) -> None:
    found = paths["http"]
    assert len(found["modules"]) <= MAX_MODULES, found["modules"]
    assert len(found["packages"]) <= MAX_PACKAGES, found["packages"]


# The gRPC surface's part is the grpc helper's branch, and the core's part the core
# helper's, both merged by the lead later: remove this xfail then.
@pytest.mark.xfail(strict=False, reason="issue #28: gRPC's and the core's shorter paths land with their branches")
@pytest.mark.timeout(360)
def test_a_grpc_infer_crosses_at_most_12_modules_in_6_packages(paths: dict[str, Any]) -> None:
    found = paths["grpc"]
    assert len(found["modules"]) <= MAX_MODULES, found["modules"]
    assert len(found["packages"]) <= MAX_PACKAGES, found["packages"]
