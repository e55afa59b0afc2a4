"""Bad and hostile infer requests over raw HTTP against one real nereid server: every
error case of protocol.md §4.2 answered with Triton's status and text, a corpus of
hostile requests answered with a JSON error, and after each one a good request still
succeeds (the server neither dies nor leaks memory)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import socket
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import EXAMPLES, RepoBuilder, RunningServer, start_server
from tests.waiting import MODEL_GATE, wait_until

#: the server's --max-request-size: small, so that the size limit is cheap to reach.
LIMIT = 1 << 20
#: the server's --http-max-input-size (JSON header, each JSON-decoded input).
JSON_LIMIT = 1 << 16

HALF_CONFIG = """
max_batch_size = 0
[[input]]
name = "INPUT0"
data_type = "TYPE_{wire}"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_{wire}"
dims = [2]
"""

WIDE_CONFIG = """
max_batch_size = 0
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [-1, -1]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [-1, -1]
"""

PARTIAL_CONFIG = """
max_batch_size = 0
[version_policy.all]
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [2]
"""

#: Why "partial" version 2 and "broken" are UNAVAILABLE ({root}: the repository folder).
PARTIAL_FAILURE = "{root}/partial/2/model.py: Model.__init__ failed for instance partial_0: RuntimeError: this version never loads"
BROKEN_FAILURE = "{root}/broken/model.py: Model.__init__ failed for instance broken_0: RuntimeError: this version never loads"

FAILING_INIT = """
class Model:
    def __init__(self, context):
        raise RuntimeError("this version never loads")

    def infer(self, inputs):
        return {}
"""


DECOUPLED_CONFIG = PARTIAL_CONFIG.replace("[version_policy.all]", "[model_transaction_policy]\ndecoupled = true")

STREAMING = """
class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        yield {"OUTPUT0": inputs["INPUT0"]}
"""

# One instance, a queue of one: while a request holds the instance, a second waits in
# the queue and a third finds it full.
GATED_CONFIG = """
max_batch_size = 1
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_FP32"
dims = [2]
[dynamic_batching]
[dynamic_batching.default_queue_policy]
max_queue_size = 1
allow_timeout_override = true
"""

# Holds the instance until the test creates the file "open" beside model.py.
GATED = """
class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        (self.folder / "entered").touch()
        wait_for_file(self.folder / "open")
        return {"OUTPUT0": inputs["INPUT0"]}
""" + MODEL_GATE


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input-repo")


@pytest.fixture(scope="module")
def server(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = repo_root
    repo = RepoBuilder(root)
    repo.add("decoupled", DECOUPLED_CONFIG, STREAMING)
    repo.add("gated", GATED_CONFIG, GATED)
    shutil.copytree(EXAMPLES / "simple", root / "simple")
    repo.add("fp16", HALF_CONFIG.format(wire="FP16"))
    repo.add("bf16", HALF_CONFIG.format(wire="BF16"))
    repo.add("wide", WIDE_CONFIG)
    repo.add("partial", PARTIAL_CONFIG, version=1)  # v1 serves, v2 fails to load
    repo.add("partial", PARTIAL_CONFIG, FAILING_INIT, version=2)
    repo.add("broken", PARTIAL_CONFIG, FAILING_INIT)  # no version ever loads
    running = start_server(
        root, "--strict-readiness", "false", "--max-request-size", str(LIMIT), "--http-max-input-size", str(JSON_LIMIT),
        log_dir=tmp_path_factory.mktemp("bad-input-logs"),
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    # One keep-alive connection for the module, as real clients do: an error must not
    # leave the connection unusable for the next request.
    with httpx.Client(base_url=server.http, timeout=30) as client:
        yield client


# -- request builders and checks ---------------------------------------------------------

A = list(range(16))
B = [1] * 16


def simple_json(**changes: Any) -> dict[str, Any]:
    """A good all-JSON request for ``simple``; ``changes`` replace top-level keys."""
    request: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B},
        ],
    }
    request.update(changes)
    return request


def with_input0(**changes: Any) -> dict[str, Any]:
    """simple_json() with keys of INPUT0 replaced (a value of None removes the key)."""
    request = simple_json()
    entry = request["inputs"][0]
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    return request


def dumps(obj: Any) -> bytes:
    """Compact JSON, as the clients send it (the stdlib: orjson refuses ints >= 2**64)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def binary_request(inputs: list[dict[str, Any]], blobs: bytes, **extra: Any) -> tuple[bytes, dict[str, str]]:
    header = dumps({"inputs": inputs, **extra})
    return header + blobs, {"Inference-Header-Content-Length": str(len(header))}


def binary_input(name: str, size: int, shape: list[int] | None = None, datatype: str = "INT32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape or [1, 16], "parameters": {"binary_data_size": size}}


INT32_16 = np.arange(16, dtype=np.int32).tobytes()


def post(http: httpx.Client, model_path: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    content = dumps(body) if isinstance(body, dict) else body
    return http.post(f"/v2/models/{model_path}/infer", content=content, headers=headers or {})


def assert_error(response: httpx.Response, status: int, message: str) -> None:
    assert (response.status_code, response.json()) == (status, {"error": message})
    assert response.headers["content-type"] == "application/json"


def assert_serving(http: httpx.Client) -> None:
    """A good request right after: it must succeed with the right answer."""
    response = post(http, "simple", simple_json())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs == {"OUTPUT0": [a + b for a, b in zip(A, B)], "OUTPUT1": [a - b for a, b in zip(A, B)]}


PREFIX = "[request id: <id_unknown>] "
SHAPE_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)

# -- §4.2: unknown models and versions ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("POST", "/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope", 404, "Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/config", 404, "Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/nope/ready", 400, "Model version not ready: Request for unknown model: 'nope' is not found"),
        ("GET", "/v2/models/simple/versions/3/ready", 400,
         "Model version not ready: Request for unknown model: 'simple' version 3 is not found"),
        ("GET", "/v2/models/partial/versions/2/ready", 400,
         "Model version not ready: Request for unknown model: 'partial' version 2 is not at ready state; "
         "it is UNAVAILABLE: " + PARTIAL_FAILURE),
        ("GET", "/v2/models/broken/ready", 400,
         "Model version not ready: Request for unknown model: 'broken' has no available versions; "
         "version 1 is UNAVAILABLE: " + BROKEN_FAILURE),
        ("GET", "/v2/models/simple/versions/99999999999999999999/ready", 400,
         "failed to get model version from specified version string '99999999999999999999'"),
        ("POST", "/v2/models/simple/versions/3/infer", 404, "Request for unknown model: 'simple' version 3 is not found"),
        ("GET", "/v2/models/simple/versions/3", 404, "Request for unknown model: 'simple' version 3 is not found"),
        ("POST", "/v2/models/partial/versions/2/infer", 503,
         "Request for unknown model: 'partial' version 2 is not at ready state; it is UNAVAILABLE: " + PARTIAL_FAILURE),
        ("GET", "/v2/models/partial/versions/2/config", 503,
         "Request for unknown model: 'partial' version 2 is not at ready state; it is UNAVAILABLE: " + PARTIAL_FAILURE),
        ("POST", "/v2/models/broken/infer", 404,
         "Request for unknown model: 'broken' has no available versions; version 1 is UNAVAILABLE: " + BROKEN_FAILURE),
        ("GET", "/v2/models/broken", 404,
         "Request for unknown model: 'broken' has no available versions; version 1 is UNAVAILABLE: " + BROKEN_FAILURE),
        ("POST", "/v2/models/simple/versions/99999999999999999999/infer", 400,
         "failed to get model version from specified version string '99999999999999999999'"),
        ("GET", "/v2/models/simple/versions/9223372036854775808", 400,
         "failed to get model version from specified version string '9223372036854775808'"),
        ("GET", "/v2/models/nope/stats", 400, "requested model 'nope' is not available"),
        ("GET", "/v2/models/simple/versions/3/stats", 400, "requested model version is not available for model 'simple'"),
    ],
    ids=["infer-unknown-model", "metadata-unknown-model", "config-unknown-model", "ready-unknown-model",
         "ready-unknown-version", "ready-version-not-ready", "ready-no-ready-version", "ready-version-overflow",
         "infer-unknown-version", "metadata-unknown-version", "infer-version-not-ready", "config-version-not-ready",
         "infer-no-ready-version", "metadata-no-ready-version", "infer-version-overflow", "metadata-version-overflow",
         "stats-unknown-model", "stats-unknown-version"],
)
def test_unknown_models_and_versions_get_tritons_status_and_text(
    http: httpx.Client, repo_root: Path, method: str, path: str, status: int, message: str
) -> None:
    """Triton's status and words; for a model or version that failed to load, followed by
    the reason the index holds (Triton says no more than its words)."""
    body = dumps(simple_json()) if method == "POST" else None
    assert_error(http.request(method, path, content=body), status, message.replace("{root}", str(repo_root)))
    assert_serving(http)


# -- §4.2: JSON that cannot be parsed or lacks required members (500) --------------------


@pytest.mark.parametrize(
    "body",
    [b'{"inputs": [', b'{"inputs": []}}', b"{'inputs': []}", b'{"inputs": [tru]}', b"\xff\xfe{}"],
    ids=["unterminated", "trailing-brace", "single-quotes", "bad-literal", "not-utf8"],
)
def test_malformed_json_is_a_500_with_the_parser_reason_and_offset(http: httpx.Client, body: bytes) -> None:
    response = post(http, "simple", body)
    assert response.status_code == 500
    message = response.json()["error"]
    assert re.fullmatch(r"failed to parse the request JSON buffer: .+ at \d+", message), message
    assert_serving(http)


def test_json_followed_by_binary_without_the_header_length_is_a_500(http: httpx.Client) -> None:
    body, _ = binary_request([binary_input("INPUT0", 64), binary_input("INPUT1", 64)], INT32_16 * 2)
    response = post(http, "simple", body)
    header_length = len(body) - 128
    assert_error(response, 500, "failed to parse the request JSON buffer: "
                 f"The document root must not be followed by other values. at {header_length}")
    assert_serving(http)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"outputs": []}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ({"inputs": {}}, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
        (with_input0(name=None), "Unable to parse 'name': attempt to access non-existing object member 'name'"),
        (with_input0(datatype=None), "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'"),
        (with_input0(shape=None), "Unable to parse 'shape': attempt to access non-existing object member 'shape'"),
        (with_input0(name=7), "Unable to parse 'name': attempt to access JSON non-string as string"),
        (with_input0(shape="1,16"), "Unable to parse 'shape': attempt to access JSON non-array as array"),
        (with_input0(shape=[1, -16]), "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (with_input0(shape=[1, 16.0]), "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (simple_json(id=42), "Unable to parse 'id': attempt to access JSON non-string as string"),
        (with_input0(data=A[:-1] + [1.5]), "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
        (with_input0(data=A + [16]), "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        (with_input0(data=A[:-1]), "Failed to parse 'data' field: shape does not match true shape"),
        (with_input0(data=5), "Unable to parse 'data': attempt to access JSON non-array as array"),
        (simple_json(parameters={"priority": -1}), "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ],
    ids=["missing-inputs", "inputs-not-array", "missing-name", "missing-datatype", "missing-shape", "name-not-string",
         "shape-not-array", "negative-dim", "float-dim", "id-not-string", "float-in-int-data", "too-many-elements",
         "too-few-elements", "data-not-array", "priority-negative"],
)
def test_missing_or_mistyped_request_members_are_500s(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    assert_error(post(http, "simple", body), 500, message)
    assert_serving(http)


# -- §4.2: requests that do not fit the model (400) --------------------------------------


def both_data_and_binary() -> tuple[bytes, dict[str, str]]:
    entry = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A, "parameters": {"binary_data_size": 64}}
    return binary_request([entry, binary_input("INPUT1", 64)], INT32_16 * 2)


def json_body(obj: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    return dumps(obj), {}


HALF_JSON = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [2], "data": [1.0, 2.0]}]}


@pytest.mark.parametrize(
    ("model", "request_", "message"),
    [
        ("simple", both_data_and_binary(),
         ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
         "'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'")),
        ("simple", json_body(with_input0(data=None)),
         ("Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
         "'shared_memory_region' in 'parameters'. But no field is set")),
        ("fp16", json_body(HALF_JSON),
         "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0"),
        ("bf16", json_body({"inputs": [dict(HALF_JSON["inputs"][0], datatype="BF16")]}),
         "receiving BF16 data via JSON is not supported. Please use the binary data format for input INPUT0"),
        ("fp16", binary_request([binary_input("INPUT0", 4, [2], "FP16")], b"\x00\x3c\x00\x40",
                                outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": False}}]),
         ("sending FP16 data via JSON is not supported. Please use the binary data format for output "
         "'OUTPUT0' of model 'fp16'")),
        ("simple", json_body(with_input0(shape=[1, 15], data=A[:15])),
         f"{PREFIX}unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]. {SHAPE_NOTE}"),
        ("simple", json_body(with_input0(datatype="FP32")),
         f"{PREFIX}inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
        ("simple", json_body(with_input0(datatype="FLOAT")),
         ("invalid datatype for input INPUT0: 'FLOAT' is not one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, "
         "INT16, INT32, INT64, FP16, BF16, FP32, FP64, BYTES (model 'simple')")),
        ("simple", json_body(simple_json(inputs=simple_json()["inputs"][:1])),
         (f"{PREFIX}expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but missing "
         "required input(s) ['INPUT1']. Please provide all required input(s).")),
        ("simple", json_body(simple_json(inputs=[simple_json()["inputs"][0], dict(simple_json()["inputs"][1], name="EXTRA")])),
         "unexpected inference input 'EXTRA' for model 'simple'"),
        ("simple", json_body(simple_json(outputs=[{"name": "OUTPUT9"}])),
         "unexpected inference output 'OUTPUT9' for model 'simple'"),
        ("simple", json_body(simple_json(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])),
         f"{PREFIX}output 'OUTPUT0' already exists in request"),
        ("simple", json_body(simple_json(inputs=[simple_json()["inputs"][0]] * 2)),
         f"{PREFIX}input 'INPUT0' already exists in request"),
        ("simple", json_body({"inputs": [{"name": n, "datatype": "INT32", "shape": [9, 16], "data": [0] * 144}
                                         for n in ("INPUT0", "INPUT1")]}),
         f"{PREFIX}inference request batch-size must be <= 8 for 'simple'"),
        ("simple", json_body(simple_json(parameters={"triton_enable_empty_final_response": True})),
         "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."),
        ("simple", json_body(simple_json(parameters={"custom": [1, 2]})),
         "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ("simple", json_body(simple_json(id="abc", inputs=simple_json()["inputs"][:1])),
         ("[request id: abc] expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
         "missing required input(s) ['INPUT1']. Please provide all required input(s).")),
    ],
    ids=["data-and-binary", "neither-data-nor-binary", "fp16-json-input", "bf16-json-input", "fp16-json-output",
         "bad-shape", "wrong-datatype", "unknown-datatype", "missing-input", "unknown-input", "unknown-output",
         "duplicate-output", "duplicate-input", "batch-too-large", "triton-parameter", "parameter-of-bad-type",
         "request-id-in-message"],
)
def test_requests_that_do_not_fit_the_model_are_400s_with_tritons_text(
    http: httpx.Client, model: str, request_: tuple[bytes, dict[str, str]], message: str
) -> None:
    body, headers = request_
    assert_error(post(http, model, body, headers), 400, message)
    assert_serving(http)


@pytest.mark.parametrize(
    ("inputs", "blobs", "message"),
    [
        ([binary_input("INPUT0", 64), binary_input("INPUT1", 64)], INT32_16 + INT32_16[:60],
         "unexpected size for input 'INPUT1', expecting 4 additional bytes for model 'simple'"),
        ([binary_input("INPUT0", 64), binary_input("INPUT1", 64)], INT32_16 * 2 + b"\0",
         "unexpected additional input data for model 'simple'"),
        ([binary_input("INPUT0", 60), binary_input("INPUT1", 64)], INT32_16[:60] + INT32_16,
         f"{PREFIX}input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"),
    ],
    ids=["blob-too-short", "bytes-left-over", "blob-size-not-the-shapes"],
)
def test_binary_blobs_of_the_wrong_size_are_400s(
    http: httpx.Client, inputs: list[dict[str, Any]], blobs: bytes, message: str
) -> None:
    body, headers = binary_request(inputs, blobs)
    assert_error(post(http, "simple", body, headers), 400, message)
    assert_serving(http)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc"),
        ("-5", "inference header size should be in range (0, {total}), got: -5"),
        ("{beyond}", "inference header size should be in range (0, {total}), got: {beyond}"),
        ("99999999999", ("Unable to parse Inference-Header-Content-Length, value is out of range "
                        "[ -2147483648, 2147483647 ], got: 99999999999")),
    ],
    ids=["not-an-integer", "negative", "beyond-the-body", "beyond-int32"],
)
def test_bad_inference_header_content_length_is_a_400(http: httpx.Client, value: str, message: str) -> None:
    body, _ = binary_request([binary_input("INPUT0", 64), binary_input("INPUT1", 64)], INT32_16 * 2)
    total = len(body)
    value = value.format(beyond=total + 10)
    response = post(http, "simple", body, {"Inference-Header-Content-Length": value})
    assert_error(response, 400, message.format(total=total, beyond=total + 10))
    assert_serving(http)


@pytest.mark.parametrize("encoding", ["br", "GZIP", "zstd", "gzip, deflate"], ids=["br", "upper-case-gzip", "zstd", "a-list"])
def test_unsupported_content_encoding_is_a_501_that_names_the_accepted_ones(http: httpx.Client, encoding: str) -> None:
    response = post(http, "simple", simple_json(), {"Content-Encoding": encoding})
    assert_error(response, 501, "Unsupported compression type")
    assert response.headers["accept-encoding"] == "gzip, deflate"
    assert_serving(http)


def test_a_json_header_over_the_input_size_limit_is_a_400(http: httpx.Client) -> None:
    body = dumps(simple_json(id="x" * JSON_LIMIT))
    assert_error(post(http, "simple", body), 400,
                 f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of {JSON_LIMIT} "
                 "bytes. Use --http-max-input-size to increase the limit.")
    assert_serving(http)


def test_json_data_that_decodes_over_the_input_size_limit_is_a_400(http: httpx.Client) -> None:
    count = JSON_LIMIT // 4 + 1  # FP32: one byte more than the limit once decoded
    body = dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, count], "data": [0] * count}]})
    assert len(body) < JSON_LIMIT  # the header itself is within the limit
    assert_error(post(http, "wide", body), 400,
                 f"JSON input 'INPUT0' has a byte_size ({count * 4} bytes) that exceeds the maximum allowed value of "
                 f"{JSON_LIMIT} bytes. Use --http-max-input-size to increase the limit.")
    assert_serving(http)


def test_a_decoupled_model_over_http_is_a_501(http: httpx.Client) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
    assert_error(post(http, "decoupled", body), 501,
                 "HTTP end point doesn't support models with decoupled transaction policy")
    assert_serving(http)


def test_a_full_queue_is_a_503_and_the_queued_requests_still_finish(
    http: httpx.Client, server: RunningServer, repo_root: Path
) -> None:
    folder = repo_root / "gated"
    body = dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]})

    def send() -> httpx.Response:
        with httpx.Client(base_url=server.http, timeout=60) as own:
            return own.post("/v2/models/gated/infer", content=body)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        holding = pool.submit(send)
        # the first request holds the instance
        wait_until(lambda: (folder / "entered").exists() or holding.done(), "the gated model to start")
        assert not holding.done(), f"the gated model never started: {holding.result()}"
        contenders = [pool.submit(send), pool.submit(send)]
        # While the instance is held, one contender queues and the other finds the queue full.
        first = next(concurrent.futures.as_completed(contenders, timeout=30)).result()
        (folder / "open").touch()
        assert_error(first, 503, "Exceeds maximum queue size")
        others = [holding.result(timeout=30)] + [c.result(timeout=30) for c in contenders]
    statuses = sorted(r.status_code for r in others)
    assert statuses == [200, 200, 503]
    assert_serving(http)


def test_errors_are_never_compressed_even_when_the_client_accepts_gzip(server: RunningServer, http: httpx.Client) -> None:
    # The aio client asks for gzip on every request but parses error bodies as they come.
    headers = {"Accept-Encoding": "gzip, deflate"}
    with httpx.stream("POST", server.http + "/v2/models/simple/infer", content=b"{", headers=headers) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 500
    assert "content-encoding" not in response.headers
    assert json.loads(raw)["error"].startswith("failed to parse the request JSON buffer: ")
    assert_serving(http)


# -- §4.2: router-level errors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v2/models/simple/infer"), ("PUT", "/v2/models/simple/infer"), ("PUT", "/v2"),
     ("POST", "/v2/health/live"), ("POST", "/v2/health/ready"), ("DELETE", "/v2/models/simple"),
     ("POST", "/v2/models/simple/config"), ("POST", "/v2/models/stats"), ("GET", "/v2/repository/index"),
     ("OPTIONS", "/v2/models/simple/infer"), ("PATCH", "/v2/models/simple/versions/1/ready")],
    ids=["get-infer", "put-infer", "put-server-metadata", "post-live", "post-ready", "delete-metadata", "post-config",
         "post-all-stats", "get-repository-index", "options-infer", "patch-versioned-ready"],
)
def test_wrong_method_on_a_known_route_is_a_405_json_error(http: httpx.Client, method: str, path: str) -> None:
    assert_error(http.request(method, path), 405, "Method Not Allowed")
    assert_serving(http)


@pytest.mark.parametrize(
    "path", ["/v2/health/live", "/v2", "/v2/models/simple", "/v2/models/simple/infer"],
    ids=["live", "server-metadata", "model-metadata", "infer"],
)
def test_head_is_a_405(http: httpx.Client, path: str) -> None:
    response = http.head(path)
    assert response.status_code == 405
    assert response.headers["content-type"] == "application/json"
    assert_serving(http)


@pytest.mark.parametrize(
    ("method", "path"),
    [("HEAD", "/v2/nowhere"), ("OPTIONS", "/v2/health"), ("HEAD", "/v2/models/simple/")],
    ids=["head-unknown-path", "options-unknown-path", "head-trailing-slash"],
)
def test_head_or_options_on_an_unknown_path_is_a_404(http: httpx.Client, method: str, path: str) -> None:
    response = http.request(method, path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    if method == "OPTIONS":
        assert response.json() == {"error": "Not Found"}
    assert_serving(http)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v2/models/simple/infer/"), ("GET", "/v2/models/simple/"), ("GET", "/v2/health"),
     ("GET", "/v2/health/live/"), ("POST", "/v2/models/simple/versions/1.0/infer"),
     ("GET", "/v2/models/simple/versions/abc"), ("POST", "/v2/models/simple/versions/-1/infer"),
     ("GET", "/V2/health/live"), ("GET", "/v2/Health/Live"), ("POST", "/v2/models/simple/Infer"),
     ("GET", "/v2/"), ("GET", "/"), ("POST", "/v2/models/simple/versions//infer"), ("GET", "/v2/models")],
    ids=["infer-trailing-slash", "metadata-trailing-slash", "health", "live-trailing-slash", "version-1.0",
         "version-abc", "version-negative", "upper-case-v2", "upper-case-health", "upper-case-infer", "v2-slash",
         "root", "empty-version", "models-list"],
)
def test_unknown_path_is_a_404_json_error(http: httpx.Client, method: str, path: str) -> None:
    body = dumps(simple_json()) if method == "POST" else None
    assert_error(http.request(method, path, content=body), 404, "Not Found")
    assert_serving(http)


# -- hostile requests ---------------------------------------------------------------------


def gzip_bomb() -> bytes:
    """64 MiB of zeros in about 64 KiB of gzip (the server's limit is 1 MiB)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()


def nested(depth: int) -> bytes:
    return (b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":'
            + b"[" * depth + b"1" + b"]" * depth + b"}]}")


def raw_exchange(server: RunningServer, request: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    """Send ``request`` as is on a new connection; read one response (status, body)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        length = int(match.group(1)) if match else 0
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    status = int(head.split(b" ", 2)[1])
    return status, body


@dataclass(frozen=True)
class Hostile:
    """One hostile request: a body and headers for the shared client, or raw bytes for a
    connection of its own (``raw``); the status and a part of the message expected."""

    model: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 400
    needle: str = ""
    raw: bytes | None = None

    def send(self, http: httpx.Client, server: RunningServer) -> tuple[int, bytes]:
        if self.raw is not None:
            return raw_exchange(server, self.raw)
        response = post(http, self.model, self.body, self.headers)
        return response.status_code, response.content


GARBAGE = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
GOOD_BINARY, GOOD_BINARY_HEADERS = binary_request([binary_input("INPUT0", 64), binary_input("INPUT1", 64)], INT32_16 * 2)
HOSTILE = {
    "garbage-bytes": Hostile("simple", GARBAGE, status=500, needle="failed to parse the request JSON buffer"),
    "garbage-after-a-header-length": Hostile(
        "simple", GARBAGE, {"Inference-Header-Content-Length": "100"}, 500, "failed to parse the request JSON buffer"),
    "truncated-json": Hostile("simple", dumps(simple_json())[:-20], status=500,
                              needle="failed to parse the request JSON buffer"),
    "truncated-blobs": Hostile("simple", GOOD_BINARY[:-30], GOOD_BINARY_HEADERS, 400,
                               "unexpected size for input 'INPUT1', expecting 30 additional bytes"),
    "header-length-beyond-the-body": Hostile(
        "simple", GOOD_BINARY, {"Inference-Header-Content-Length": str(len(GOOD_BINARY) + 1)}, 400,
        "inference header size should be in range"),
    "huge-shape-json": Hostile(
        "wide", dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2**62, 2**62], "data": [1.0]}]}),
        needle="causes total element count to exceed maximum size"),
    "huge-shape-binary": Hostile(
        "wide", *binary_request([binary_input("INPUT0", 16, [2**62, 2**62], "FP32")], bytes(16)),
        needle="input byte size mismatch for input 'INPUT0' for model 'wide'. Expected 85070591730234615865843651857942052864, got 16"),
    "shape-of-2-to-the-64": Hostile(
        "wide", *binary_request([binary_input("INPUT0", 16, [2**64, 1], "FP32")], bytes(16)), status=500,
        needle="Unable to parse 'shape'"),
    "negative-shape": Hostile("simple", dumps(with_input0(shape=[-1, 16])), status=500,
                              needle="Unable to parse 'shape'"),
    "huge-binary-data-size": Hostile(
        "simple", *binary_request([binary_input("INPUT0", 2**40), binary_input("INPUT1", 64)], INT32_16 * 2),
        needle="unexpected size for input 'INPUT0', expecting 1099511627648 additional bytes"),
    "binary-data-size-beyond-uint64": Hostile(
        "simple", *binary_request([binary_input("INPUT0", 2**64), binary_input("INPUT1", 64)], INT32_16 * 2),
        status=500, needle="Unable to parse 'binary_data_size'"),
    "data-nested-150-deep": Hostile("simple", nested(150), needle="JSON nesting depth exceeds maximum allowed limit (100)"),
    "data-nested-5000-deep": Hostile("simple", nested(5000), status=500, needle="failed to parse the request JSON buffer"),
    "root-is-an-array": Hostile("simple", b"[1, 2]", status=500, needle="non-existing object member 'inputs'"),
    "root-is-a-string": Hostile("simple", b'"inputs"', status=500, needle="non-existing object member 'inputs'"),
    "root-is-null": Hostile("simple", b"null", status=500, needle="non-existing object member 'inputs'"),
    "inputs-hold-a-number": Hostile("simple", b'{"inputs": [7]}', needle="Input must set only one of the following fields"),
    "outputs-hold-a-number": Hostile("simple", dumps(simple_json(outputs=[7])), status=500,
                                     needle="Unable to parse 'name'"),
    "gzip-bomb": Hostile("simple", gzip_bomb(), {"Content-Encoding": "gzip"},
                         needle=f"exceeds the maximum allowed size ({LIMIT} bytes, --max-request-size)"),
    "not-gzip": Hostile("simple", GARBAGE, {"Content-Encoding": "gzip"}, needle="failed to decompress the request body"),
    "body-over-the-size-limit": Hostile(
        "simple", bytes(2 * LIMIT), needle=f"request body of {2 * LIMIT} bytes exceeds the maximum allowed size ({LIMIT} bytes"),
    "300-MB-content-length-with-a-short-body": Hostile(
        "simple", raw=b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n{\"inputs\":",
        needle=f"request body of 300000000 bytes exceeds the maximum allowed size ({LIMIT} bytes, --max-request-size)"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_request_gets_a_json_error_and_the_server_keeps_serving(
    http: httpx.Client, server: RunningServer, case: str
) -> None:
    hostile = HOSTILE[case]
    status, body = hostile.send(http, server)
    error = json.loads(body)
    assert list(error) == ["error"] and isinstance(error["error"], str)
    assert status == hostile.status, error
    assert hostile.needle in error["error"]
    assert_serving(http)


def test_a_client_that_hangs_up_mid_body_leaves_the_server_healthy(http: httpx.Client, server: RunningServer) -> None:
    body = dumps(simple_json())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.sendall(body[: len(body) // 2])
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536) == b""  # no answer to half a request: the connection is just closed
    assert_serving(http)


def test_pipelined_requests_with_an_error_among_them_are_each_answered_in_order(server: RunningServer) -> None:
    good = dumps(simple_json())
    request = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(good) + good
    broken = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{{{{{"
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request + broken + request + live)
        data = b""
        while data.count(b"HTTP/1.1 ") < 4 or not data.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert re.findall(rb"HTTP/1\.1 (\d+)", data) == [b"200", b"500", b"200", b"200"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def test_memory_does_not_keep_growing_over_200_rounds_of_the_hostile_corpus(
    http: httpx.Client, server: RunningServer
) -> None:
    def round_() -> None:
        for hostile in HOSTILE.values():
            status, _ = hostile.send(http, server)
            assert status == hostile.status

    for _ in range(20):  # warm up: allocator pools, codec caches, connection buffers
        round_()
    before = rss_kib(server.process.pid)
    for _ in range(200):
        round_()
    after = rss_kib(server.process.pid)
    # Generous: this is about leaks (one leaked body per request would be gigabytes).
    assert after - before < 32 * 1024, f"RSS grew from {before} KiB to {after} KiB"
    assert_serving(http)
    assert server.process.poll() is None
