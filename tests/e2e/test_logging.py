"""The logging extension (GET/POST /v2/logging) changes what the running server logs;
trace settings are accepted and reported in Triton's shape."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import IDENTITY_CONFIG, RepoBuilder, RunningServer, start_server
from tests.waiting import wait_until

IDENTITY = IDENTITY_CONFIG

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


@pytest.fixture
def server(repo: RepoBuilder, tmp_path: Path) -> Iterator[RunningServer]:
    repo.add("identity", IDENTITY)
    running = start_server(repo.root, "--allow-metrics", "false", log_dir=tmp_path)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def unchanged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the tests that only read the settings or send ones it must refuse
    (each checks that nothing changed): a server start per test cost more than the tests."""
    repo = RepoBuilder(tmp_path_factory.mktemp("logging") / "models")
    repo.add("identity", IDENTITY)
    running = start_server(repo.root, "--allow-metrics", "false", log_dir=tmp_path_factory.mktemp("logging-logs"))
    yield running
    running.stop()


@pytest.fixture
def shm_object(tmp_path: Path) -> Iterator[str]:
    """A 16-byte object in /dev/shm; registering it makes the server log a DEBUG line."""
    name = f"nereid_logging_{tmp_path.name}"
    path = Path("/dev/shm") / name
    path.write_bytes(bytes(16))
    yield "/" + name
    path.unlink()


def post(server: RunningServer, settings: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.http}/v2/logging", json=settings)


def register(server: RunningServer, region: str, key: str) -> None:
    reply = httpx.post(f"{server.http}/v2/systemsharedmemory/region/{region}/register", json={"key": key, "byte_size": 16})
    assert reply.status_code == 200, reply.text


def wait_for_line(server: RunningServer, pattern: str) -> str:
    def matching() -> str | None:
        return next((line for line in server.log().splitlines() if re.search(pattern, line)), None)

    return wait_until(matching, lambda: f"a log line matching {pattern!r}:\n{server.log()}", every=0.05)


def test_settings_have_triton_shape_and_defaults(unchanged_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(unchanged_server.url)
    assert client.get_log_settings() == DEFAULTS
    assert "logging" in client.get_server_metadata()["extensions"]
    client.close()


def test_post_round_trip_returns_and_keeps_the_new_settings(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    changed = client.update_log_settings({"log_verbose_level": 2, "log_warning": False, "log_file": None})
    assert changed == {**DEFAULTS, "log_verbose_level": 2, "log_warning": False}
    assert client.get_log_settings() == changed
    client.close()


def test_verbose_level_switches_debug_lines_on_and_off(server: RunningServer, shm_object: str) -> None:
    register(server, "quiet_before", shm_object)
    assert post(server, {"log_verbose_level": 1}).status_code == 200
    register(server, "chatty", shm_object)
    line = wait_for_line(server, r"region 'chatty' registered")
    assert line.startswith("D")  # Triton-style one-letter level prefix
    assert post(server, {"log_verbose_level": 0}).status_code == 200
    register(server, "quiet_after", shm_object)
    wait_for_line(server, r"log settings updated: log_verbose_level=0")
    assert "quiet_before" not in server.log()
    assert "quiet_after" not in server.log()


def test_info_switch_and_iso8601_format_apply_at_once(server: RunningServer) -> None:
    assert post(server, {"log_info": False}).status_code == 200
    assert post(server, {"log_format": "ISO8601"}).status_code == 200
    assert "log_format=ISO8601" not in server.log()  # that INFO line was switched off
    assert post(server, {"log_info": True}).json()["log_format"] == "ISO8601"
    line = wait_for_line(server, r"log settings updated: log_info=True")
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d INFO ", line), line


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param({"log_file": "/tmp/x.log"}, 501, "log file location can not be updated through network protocol",
                     id="log-file"),
        pytest.param({"log_format": "json"}, 503, "invalid argument for --log_format, got: json", id="bad-format"),
        pytest.param({"log_info": "yes"}, 500, "Unable to parse 'log_info': attempt to access JSON non-boolean as boolean",
                     id="info-not-bool"),
        pytest.param({"log_verbose_level": -1}, 500,
                     "Unable to parse 'log_verbose_level': attempt to access JSON non-unsigned-integer as unsigned-integer",
                     id="negative-level"),
        pytest.param({"log_verbose_level": 3, "log_format": "bad"}, 503, "invalid argument for --log_format, got: bad",
                     id="nothing-applied-when-one-value-is-bad"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    unchanged_server: RunningServer, body: dict[str, Any], status: int, message: str
) -> None:
    server = unchanged_server
    reply = post(server, body)
    assert (reply.status_code, reply.json()) == (status, {"error": message})
    assert httpx.get(f"{server.http}/v2/logging").json() == DEFAULTS


def test_empty_logging_body_is_a_json_error(unchanged_server: RunningServer) -> None:
    server = unchanged_server
    reply = httpx.post(f"{server.http}/v2/logging", content=b"")
    assert reply.status_code == 500
    assert "The document is empty" in reply.json()["error"]
    assert httpx.put(f"{server.http}/v2/logging").status_code == 405


# -- trace settings -----------------------------------------------------------------------

TRACE_DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}


def test_trace_settings_are_accepted_and_reported_per_model(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_trace_settings() == TRACE_DEFAULTS
    # perf_analyzer's --trace-level/--trace-rate request:
    updated = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "10"})
    assert updated == {**TRACE_DEFAULTS, "trace_level": ["TIMESTAMPS"], "trace_rate": "10"}
    model = client.update_trace_settings("identity", {"trace_count": "5", "trace_level": ["TENSORS", "TIMESTAMPS"]})
    assert model == {**updated, "trace_count": "5", "trace_level": ["TIMESTAMPS", "TENSORS"]}
    cleared = client.update_trace_settings("identity", {"trace_count": None})
    assert cleared["trace_count"] == "-1" and cleared["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert client.get_trace_settings() == updated
    with pytest.raises(InferenceServerException) as unknown:
        client.get_trace_settings("nope")
    assert unknown.value.status() == "404"
    client.close()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param({"trace_file": "x"}, 501, "trace file location can not be updated through network protocol",
                     id="trace-file"),
        pytest.param({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified",
                     id="off-plus-level"),
        pytest.param({"trace_rate": "fast"}, 400, "Unable to parse 'trace_rate', got: fast", id="rate-not-a-number"),
        pytest.param({"trace_count": "-2"}, 400, "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: -2",
                     id="count-below-minus-one"),
        pytest.param({"trace_rate": 10}, 500, "Unable to parse 'trace_rate': attempt to access JSON non-string as string",
                     id="rate-not-a-string"),
    ],
)
def test_bad_trace_settings_are_refused(unchanged_server: RunningServer, body: dict[str, Any], status: int,
                                       message: str) -> None:
    server = unchanged_server
    reply = httpx.post(f"{server.http}/v2/trace/setting", json=body)
    assert (reply.status_code, reply.json()) == (status, {"error": message})
    assert httpx.get(f"{server.http}/v2/trace/setting").json() == TRACE_DEFAULTS
