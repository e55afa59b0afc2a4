"""The non-infer endpoints over raw HTTP against one real nereid server (protocol.md §1):
routing, health, server and model metadata, model config with every default, and the
statistics shape perf_analyzer parses."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import conftest
from tests.conftest import EXAMPLES, RepoBuilder, RunningServer, start_server, visible_gpu_ids
from tests.waiting import wait_until

IDENTITY_CONFIG = """
max_batch_size = {max_batch}
[[input]]
name = "INPUT0"
data_type = "TYPE_INT32"
dims = {dims}
[[output]]
name = "OUTPUT0"
data_type = "TYPE_INT32"
dims = {dims}
"""

VERSIONED_CONFIG = IDENTITY_CONFIG.format(max_batch=4, dims="[2]") + "[version_policy.all]\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("endpoints-repo")
    repo = RepoBuilder(root)
    shutil.copytree(EXAMPLES / "simple", root / "simple")
    shutil.copytree(EXAMPLES / "add_one", root / "add_one")
    repo.add("stats", IDENTITY_CONFIG.format(max_batch=0, dims="[3]"))  # shadowed at /v2/models/stats
    repo.add("flat", IDENTITY_CONFIG.format(max_batch=0, dims="[2, -1]"))
    repo.add("untouched", IDENTITY_CONFIG.format(max_batch=4, dims="[2]"))  # never gets a request
    repo.add("touched", IDENTITY_CONFIG.format(max_batch=4, dims="[2]"))  # gets exactly one
    repo.add("versioned", VERSIONED_CONFIG, version=1)
    repo.add("versioned", VERSIONED_CONFIG, version=3)
    running = start_server(root, log_dir=tmp_path_factory.mktemp("endpoints-logs"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http, timeout=30) as client:
        yield client


READY_MODELS = [("add_one", "1"), ("flat", "1"), ("simple", "1"), ("stats", "1"), ("touched", "1"),
                ("untouched", "1"), ("versioned", "1"), ("versioned", "3")]


def stats_infer(http: httpx.Client, model: str, rows: int = 1) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [rows, 2] if rows else [3],
                        "data": [5] * (rows * 2 if rows else 3)}]}
    response = http.post(f"/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text


# -- routing (§1.1) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/simple", "/v2/models/simple/versions/1",
     "/v2/models/simple/config", "/v2/models/simple/ready", "/v2/models/untouched/stats", "/v2/models/nope",
     "/v2/nowhere"],
    ids=["live", "ready", "server-metadata", "model-metadata", "versioned-metadata", "config", "model-ready",
         "model-stats", "unknown-model", "unknown-path"],
)
def test_query_string_is_ignored(http: httpx.Client, path: str) -> None:
    plain = http.get(path)
    queried = http.get(path + "?verbose=1&name=a%2Fb&flag")
    assert (queried.status_code, queried.content) == (plain.status_code, plain.content)


def test_query_string_on_infer_is_ignored(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT64", "shape": [1, 1], "data": [41]}]}
    response = http.post("/v2/models/add_one/infer?priority=1&x=%20", json=body)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [42]


def test_not_found_body_is_exactly_tritons(http: httpx.Client) -> None:
    response = http.get("/v2/models/simple/")
    assert response.status_code == 404
    assert response.content == b'{"error":"Not Found"}'
    assert response.headers["content-type"] == "application/json"


def test_method_not_allowed_body_is_exactly_tritons(http: httpx.Client) -> None:
    response = http.post("/v2/models/simple/config")
    assert response.status_code == 405
    assert response.content == b'{"error":"Method Not Allowed"}'
    assert response.headers["content-type"] == "application/json"


def test_model_names_are_case_sensitive(http: httpx.Client) -> None:
    response = http.get("/v2/models/Simple")
    assert response.status_code == 404
    assert response.json() == {"error": "Request for unknown model: 'Simple' is not found"}


def test_percent_encoded_model_name_reaches_the_model(http: httpx.Client) -> None:
    # tritonclient quotes model names; %73 is "s".
    assert http.get("/v2/models/%73imple").json()["name"] == "simple"


def test_models_stats_path_is_all_model_statistics_even_with_a_model_named_stats(http: httpx.Client) -> None:
    stats = http.get("/v2/models/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == READY_MODELS


@pytest.mark.parametrize(
    ("path", "check"),
    [
        ("/v2/models/stats/ready", lambda r: r.content == b""),
        ("/v2/models/stats/config", lambda r: r.json()["name"] == "stats"),
        ("/v2/models/stats/versions/1", lambda r: r.json()["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [3]}]),
        ("/v2/models/stats/stats", lambda r: [s["name"] for s in r.json()["model_stats"]] == ["stats"]),
    ],
    ids=["ready", "config", "versioned-metadata", "stats"],
)
def test_a_model_named_stats_is_reachable_below_its_name(http: httpx.Client, path: str, check: Callable[[httpx.Response], bool]) -> None:
    response = http.get(path)
    assert response.status_code == 200
    assert check(response)


def test_a_model_named_stats_can_infer(http: httpx.Client) -> None:
    response = http.post("/v2/models/stats/infer", json={"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}]})
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [1, 2, 3]


# -- health (§1.2 rows 1-2) --------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready"], ids=["live", "ready"])
def test_health_is_200_with_an_empty_body(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert (response.status_code, response.content) == (200, b"")


@pytest.mark.parametrize(
    "path", ["/v2/models/simple/ready", "/v2/models/versioned/versions/3/ready", "/v2/models/versioned/ready"],
    ids=["simple", "versioned-v3", "versioned-latest"],
)
def test_model_ready_is_200_with_an_empty_body(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert (response.status_code, response.content) == (200, b"")


def test_ready_is_400_with_an_empty_body_while_a_model_is_unavailable(tmp_path: Path, serve: Callable[..., RunningServer]) -> None:
    repo = RepoBuilder(tmp_path / "models")
    repo.add("good", IDENTITY_CONFIG.format(max_batch=0, dims="[2]"))
    repo.add("bad", IDENTITY_CONFIG.format(max_batch=0, dims="[2]"), "raise RuntimeError('cannot load')\n")
    server = serve(repo.root, wait_ready=False)
    wait_until(lambda: "server is NOT ready" in server.log(), lambda: f"the initial load to finish:\n{server.log()}",
               every=0.05)
    with httpx.Client(base_url=server.http) as http:
        ready = http.get("/v2/health/ready")
        assert (ready.status_code, ready.content) == (400, b"")
        live = http.get("/v2/health/live")
        assert (live.status_code, live.content) == (200, b"")
        assert http.get("/v2/models/good/ready").status_code == 200


# -- server metadata (§1.3.1) ------------------------------------------------------------


def test_server_metadata_has_name_version_and_extensions(http: httpx.Client) -> None:
    response = http.get("/v2")
    assert response.headers["content-type"] == "application/json"
    metadata = response.json()
    assert list(metadata) == ["name", "version", "extensions"]
    assert isinstance(metadata["name"], str) and metadata["name"]
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert isinstance(metadata["extensions"], list)
    assert all(isinstance(extension, str) for extension in metadata["extensions"])
    assert len(set(metadata["extensions"])) == len(metadata["extensions"])


# How to show that an advertised extension is really there: a request that only succeeds
# when its endpoints exist.
EXTENSION_PROBES: dict[str, tuple[str, str]] = {
    "model_repository": ("POST", "/v2/repository/index"),
    "model_configuration": ("GET", "/v2/models/simple/config"),
    "statistics": ("GET", "/v2/models/stats"),
    "system_shared_memory": ("GET", "/v2/systemsharedmemory/status"),
    "cuda_shared_memory": ("GET", "/v2/cudasharedmemory/status"),
    "trace": ("GET", "/v2/trace/setting"),
    "logging": ("GET", "/v2/logging"),
}


def test_every_advertised_extension_with_endpoints_answers(http: httpx.Client) -> None:
    extensions = http.get("/v2").json()["extensions"]
    failures = {}
    for extension in extensions:
        if extension in EXTENSION_PROBES:
            method, path = EXTENSION_PROBES[extension]
            status = http.request(method, path).status_code
            if status != 200:
                failures[extension] = f"{method} {path} -> {status}"
    assert failures == {}


@pytest.mark.parametrize(
    "path", ["/v2", "/v2/models/simple", "/v2/models/simple/config", "/v2/models/stats", "/v2/models/nope"],
    ids=["server-metadata", "model-metadata", "config", "stats", "error"],
)
def test_non_infer_replies_are_never_compressed(server: RunningServer, path: str) -> None:
    with httpx.stream("GET", server.http + path, headers={"Accept-Encoding": "gzip, deflate"}) as response:
        raw = b"".join(response.iter_raw())
    assert "content-encoding" not in response.headers
    assert raw.startswith(b"{")


# -- model metadata (§1.3.2) -------------------------------------------------------------


def io(name: str, shape: list[int], datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v2/models/simple", {"name": "simple", "versions": ["1"], "platform": "python",
                               "inputs": [io("INPUT0", [-1, 16]), io("INPUT1", [-1, 16])],
                               "outputs": [io("OUTPUT0", [-1, 16]), io("OUTPUT1", [-1, 16])]}),
        ("/v2/models/add_one", {"name": "add_one", "versions": ["1"], "platform": "python",
                                "inputs": [io("INPUT0", [-1, 1], "INT64")], "outputs": [io("OUTPUT0", [-1, 1], "INT64")]}),
        ("/v2/models/flat", {"name": "flat", "versions": ["1"], "platform": "python",
                             "inputs": [io("INPUT0", [2, -1])], "outputs": [io("OUTPUT0", [2, -1])]}),
        ("/v2/models/versioned", {"name": "versioned", "versions": ["1", "3"], "platform": "python",
                                  "inputs": [io("INPUT0", [-1, 2])], "outputs": [io("OUTPUT0", [-1, 2])]}),
        ("/v2/models/versioned/versions/3", {"name": "versioned", "versions": ["3"], "platform": "python",
                                            "inputs": [io("INPUT0", [-1, 2])], "outputs": [io("OUTPUT0", [-1, 2])]}),
    ],
    ids=["batching", "batching-int64", "not-batching-variable-dim", "all-ready-versions", "one-version"],
)
def test_model_metadata_is_exactly_the_protocol_shape(http: httpx.Client, path: str, expected: dict[str, Any]) -> None:
    response = http.get(path)
    assert response.headers["content-type"] == "application/json"
    assert list(response.json().items()) == list(expected.items())  # key order too


# -- model config (§1.3.3) ---------------------------------------------------------------


def config_input(name: str, dims: list[int], data_type: str = "TYPE_INT32") -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "format": "FORMAT_NONE", "dims": dims, "is_shape_tensor": False,
            "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}


def config_output(name: str, dims: list[int], data_type: str = "TYPE_INT32") -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims, "label_filename": "", "is_shape_tensor": False,
            "is_non_linear_format_io": False}


def full_config(name: str, max_batch_size: int, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
                **extra: Any) -> dict[str, Any]:
    """A config as Triton prints it after normalisation: every default present."""
    gpus = list(visible_gpu_ids())
    config: dict[str, Any] = {
        "name": name, "platform": "", "backend": "python", "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size, "input": inputs, "output": outputs,
        "batch_input": [], "batch_output": [],
        "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
                         "output_pinned_memory": {"enable": True}, "gather_kernel_buffer_threshold": 0,
                         "eager_batching": False},
        # No [[instance_group]]: KIND_AUTO, placed on the GPUs when the host has any.
        "instance_group": [{"name": name, "kind": "KIND_GPU" if gpus else "KIND_CPU", "count": 1, "gpus": gpus,
                            "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}],
        "default_model_filename": "model.py", "cc_model_filenames": {}, "metric_tags": {}, "parameters": {},
        "model_warmup": [], "model_transaction_policy": {"decoupled": False},
    }
    if conftest.ISOLATION != "thread":  # pytest --isolation process: the group's isolation, nereid's parameter
        config["parameters"] = {f"instance_group.{name}.isolation": {"string_value": conftest.ISOLATION}}
    config.update(extra)
    return config


def test_config_of_a_model_without_a_batcher_has_every_default_and_no_scheduler(http: httpx.Client) -> None:
    response = http.get("/v2/models/simple/config")
    assert response.headers["content-type"] == "application/json"
    assert response.json() == full_config(
        "simple", 8,
        [config_input("INPUT0", [16]), config_input("INPUT1", [16])],
        [config_output("OUTPUT0", [16]), config_output("OUTPUT1", [16])],
    )


def test_config_of_a_model_with_dynamic_batching_has_every_batcher_default(http: httpx.Client) -> None:
    expected = full_config(
        "add_one", 4, [config_input("INPUT0", [1], "TYPE_INT64")], [config_output("OUTPUT0", [1], "TYPE_INT64")],
        dynamic_batching={"preferred_batch_size": [], "max_queue_delay_microseconds": 20000, "preserve_ordering": False,
                          "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {}},
    )
    assert http.get("/v2/models/add_one/config").json() == expected


def test_config_keeps_the_version_policy_and_variable_dims(http: httpx.Client) -> None:
    config = http.get("/v2/models/versioned/versions/1/config").json()
    assert config == full_config(
        "versioned", 4, [config_input("INPUT0", [2])], [config_output("OUTPUT0", [2])], version_policy={"all": {}},
    )


# -- statistics (§1.3.4) -----------------------------------------------------------------

ZERO = {"count": 0, "ns": 0}


def zero_stats(name: str, version: str) -> dict[str, Any]:
    return {
        "name": name, "version": version, "last_inference": 0, "inference_count": 0, "execution_count": 0,
        "inference_stats": {key: ZERO for key in ("success", "fail", "queue", "compute_input", "compute_infer",
                                                  "compute_output", "cache_hit", "cache_miss")},
        "response_stats": {}, "batch_stats": [], "memory_usage": [],
        "scheduling": {key: ZERO for key in SCHEDULING}, **PROCESS_STATS,
    }


#: nereid's scheduling figures, in every model's stats (not over gRPC).
SCHEDULING = ("instance_busy", "instance_idle_between_batches", "batch_formation", "batch_answer")


#: What the stats of a model with process instances add (pytest --isolation process).
PROCESS_STATS: dict[str, Any] = {"instance_restarts": 0} if conftest.ISOLATION == "process" else {}


def test_stats_of_a_ready_model_before_any_traffic_are_all_zero(http: httpx.Client) -> None:
    response = http.get("/v2/models/untouched/stats")
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"model_stats": [zero_stats("untouched", "1")]}


@pytest.mark.parametrize(
    ("path", "versions"),
    [("/v2/models/versioned/stats", ["1", "3"]), ("/v2/models/versioned/versions/3/stats", ["3"])],
    ids=["every-ready-version", "one-version"],
)
def test_stats_list_the_ready_versions_asked_for(http: httpx.Client, path: str, versions: list[str]) -> None:
    assert http.get(path).json() == {"model_stats": [zero_stats("versioned", v) for v in versions]}


def test_stats_after_one_request_count_it_everywhere(http: httpx.Client) -> None:
    started_ms = time.time_ns() // 1_000_000
    stats_infer(http, "touched", rows=3)
    finished_ms = time.time_ns() // 1_000_000
    (stats,) = http.get("/v2/models/touched/stats").json()["model_stats"]
    assert list(stats) == ["name", "version", "last_inference", "inference_count", "execution_count",
                           "inference_stats", "response_stats", "batch_stats", "memory_usage", "scheduling",
                           *PROCESS_STATS]
    assert (stats["name"], stats["version"]) == ("touched", "1")
    assert started_ms <= stats["last_inference"] <= finished_ms
    assert (stats["inference_count"], stats["execution_count"]) == (3, 1)
    inference = stats["inference_stats"]
    assert list(inference) == ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                               "cache_hit", "cache_miss"]
    assert {key: value["count"] for key, value in inference.items()} == {
        "success": 1, "fail": 0, "queue": 1, "compute_input": 1, "compute_infer": 1, "compute_output": 1,
        "cache_hit": 0, "cache_miss": 0}
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert list(inference[key]) == ["count", "ns"]
        assert type(inference[key]["ns"]) is int and inference[key]["ns"] > 0
    assert inference["success"]["ns"] >= inference["compute_infer"]["ns"]
    (batch,) = stats["batch_stats"]
    assert list(batch) == ["batch_size", "compute_input", "compute_infer", "compute_output"]
    assert batch["batch_size"] == 3
    assert [batch[key]["count"] for key in ("compute_input", "compute_infer", "compute_output")] == [1, 1, 1]
    scheduling = stats["scheduling"]
    assert list(scheduling) == list(SCHEDULING)
    assert {key: value["count"] for key, value in scheduling.items()} == {
        "instance_busy": 1, "instance_idle_between_batches": 0, "batch_formation": 1, "batch_answer": 1}
    assert 0 < scheduling["instance_busy"]["ns"]
    assert stats["response_stats"] == {} and stats["memory_usage"] == []


def test_all_model_stats_have_one_entry_per_ready_version(http: httpx.Client) -> None:
    response = http.get("/v2/models/stats")
    stats = response.json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == READY_MODELS
    untouched = next(s for s in stats if s["name"] == "untouched")
    assert untouched == zero_stats("untouched", "1")
