"""perf/request_path.py's count of the modules one infer request crosses (issue #28's
"short request path"): at most 6 packages for HTTP and for gRPC, and no more modules than
today (HTTP binary 12, HTTP JSON 16, gRPC 12: these bounds only go down), the HTTP
surface's own part (connection, request reader, infer, its memo) 4, gRPC's (connection,
its control frames, sender, infer) 4.

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
MAX_MODULES = {"http": 12, "http_json": 16, "grpc": 12}
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


def _grpc_modules(modules: list[str]) -> list[str]:
    return [module for module in modules if module.startswith("nereid.grpc.")]


@pytest.mark.timeout(360)
def test_an_http_binary_infer_crosses_four_http_modules(paths: dict[str, Any]) -> None:
    assert _http_modules(paths["http"]["modules"]) == [
        "nereid.http.h1.connection", "nereid.http.h1.request_reader", "nereid.http.infer", "nereid.http.infer_memo",
    ]


@pytest.mark.timeout(360)
def test_an_http_json_infer_adds_only_the_full_parser(paths: dict[str, Any]) -> None:
    extra = set(_http_modules(paths["http_json"]["modules"])) - set(_http_modules(paths["http"]["modules"]))
    assert extra <= {"nereid.http.infer_request", "nereid.http.request_json", "nereid.http.infer_response"}


@pytest.mark.timeout(360)
def test_a_grpc_infer_crosses_four_grpc_modules(paths: dict[str, Any]) -> None:
    assert _grpc_modules(paths["grpc"]["modules"]) == [
        "nereid.grpc.h2.connection", "nereid.grpc.h2.control", "nereid.grpc.h2.sender", "nereid.grpc.infer",
    ]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("surface", ["http", "http_json", "grpc"])
def test_an_infer_crosses_few_modules_in_at_most_6_packages(paths: dict[str, Any], surface: str) -> None:
    found = paths[surface]
    assert len(found["modules"]) <= MAX_MODULES[surface], found["modules"]
    assert len(found["packages"]) <= MAX_PACKAGES, found["packages"]
