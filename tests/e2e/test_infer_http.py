"""Inference over HTTP with the stock clients (tritonclient.http sync and async_infer,
tritonclient.http.aio) against one real nereid server: every datatype in JSON and binary,
Triton's simple client flow, output selection, request ids, compression both ways,
classification with label files, versions in the URL, metadata, config, readiness and
statistics as the clients read them."""

from __future__ import annotations

import asyncio
import gzip
import shutil
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, RepoBuilder, RunningServer, start_server

# -- the repository -----------------------------------------------------------------------

ECHO_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_{wire}"
dims = [-1]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_{wire}"
dims = [-1]
"""

# BYTES come back upper-cased (so an echo cannot pass by accident); everything else as sent.
ECHO_MODEL = """
import numpy as np

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        x = inputs["INPUT0"]
        if x.dtype == object:
            upper = [bytes(v).upper() for v in x.reshape(-1)]
            out = np.empty(len(upper), dtype=object)
            out[:] = upper
            return {"OUTPUT0": out.reshape(x.shape)}
        return {"OUTPUT0": x.copy()}
"""

CLASSIFY_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_FP32"
dims = [4]
[[output]]
name = "SCORES"
data_type = "TYPE_FP32"
dims = [4]
label_filename = "labels.txt"
[[output]]
name = "COUNTS"
data_type = "TYPE_INT32"
dims = [4]
"""

CLASSIFY_MODEL = """
import numpy as np

class Model:
    def __init__(self, context):
        pass

    def infer(self, inputs):
        x = inputs["INPUT0"]
        return {"SCORES": x.copy(), "COUNTS": (x * 10).astype(np.int32)}
"""

VERSIONED_CONFIG = """
max_batch_size = 0
[version_policy.all]
[[input]]
name = "INPUT0"
data_type = "TYPE_INT32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_INT32"
dims = [2]
"""

# Each version adds its own number, so the answer shows which version ran.
VERSIONED_MODEL = """
class Model:
    def __init__(self, context):
        self.version = context.model_version

    def infer(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"] + self.version}
"""

COUNTED_CONFIG = """
max_batch_size = 8
[[input]]
name = "INPUT0"
data_type = "TYPE_INT32"
dims = [2]
[[output]]
name = "OUTPUT0"
data_type = "TYPE_INT32"
dims = [2]
"""

WIRE_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
              "FP16", "BF16", "FP32", "FP64", "BYTES"]
JSON_TYPES = [wire for wire in WIRE_TYPES if wire not in ("FP16", "BF16")]


def echo_model(wire: str) -> str:
    return f"echo_{wire.lower()}"


def sample(wire: str) -> np.ndarray:
    """A [2, 3] array of ``wire`` with the type's extreme values in it."""
    if wire == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if wire == "BYTES":
        return np.array([[b"ab", b"", "h\u00e9llo".encode()], [b"x y", b"Zz", b"0"]], dtype=object)
    if wire == "BF16":
        return np.array([[1.5, -2.0, 0.0], [3.0e38, -1.0e-38, 256.0]], dtype=ml_dtypes.bfloat16)
    dtype: Any = np.dtype(wire.lower().replace("fp", "float"))
    if wire.startswith("FP"):
        finfo = np.finfo(dtype)
        return np.array([[0.1, -3.5, 0.0], [finfo.max, finfo.tiny, -1e-3]], dtype=dtype)
    iinfo = np.iinfo(dtype)
    return np.array([[iinfo.min, iinfo.max, 0], [1, iinfo.max - 1, 7]], dtype=dtype)


def expected_echo(wire: str, data: np.ndarray, *, as_json: bool = False) -> np.ndarray:
    if wire != "BYTES":
        return data
    upper = [bytes(v).upper() for v in data.reshape(-1)]
    if as_json:  # tritonclient turns JSON strings into str objects
        return np.array([v.decode() for v in upper], dtype=object).reshape(data.shape)
    return np.array(upper, dtype=object).reshape(data.shape)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("infer-repo")
    repo = RepoBuilder(root)
    for wire in WIRE_TYPES:
        repo.add(echo_model(wire), ECHO_CONFIG.format(wire="STRING" if wire == "BYTES" else wire), ECHO_MODEL)
    shutil.copytree(EXAMPLES / "add_one", root / "add_one")
    shutil.copytree(EXAMPLES / "simple", root / "simple")
    repo.add("classify", CLASSIFY_CONFIG, CLASSIFY_MODEL, files={"labels.txt": "alpha\nbravo\ncharlie\ndelta\n"})
    repo.add("versioned", VERSIONED_CONFIG, VERSIONED_MODEL, version=1)
    repo.add("versioned", VERSIONED_CONFIG, VERSIONED_MODEL, version=2)
    repo.add("counted", COUNTED_CONFIG)
    running = start_server(root, log_dir=tmp_path_factory.mktemp("infer-logs"))
    yield running
    running.stop()


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.url)
    yield triton
    triton.close()


def tensor(name: str, data: np.ndarray, wire: str, *, binary: bool = True) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(data.shape), wire)
    item.set_data_from_numpy(data, binary_data=binary)
    return item


def simple_inputs(binary: bool = True) -> tuple[list[httpclient.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    return [tensor("INPUT0", a, "INT32", binary=binary), tensor("INPUT1", b, "INT32", binary=binary)], a, b


def assert_same(got: np.ndarray | None, want: np.ndarray) -> None:
    assert got is not None
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    if want.dtype.kind == "f":
        np.testing.assert_array_equal(got, want)
    else:
        assert got.tolist() == want.tolist()


# -- every datatype ----------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRE_TYPES)
def test_every_datatype_round_trips_in_binary(client: httpclient.InferenceServerClient, wire: str) -> None:
    data = sample(wire)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = client.infer(echo_model(wire), [tensor("INPUT0", data, wire)], outputs=[output])
    expected = expected_echo(wire, data)
    assert_same(result.as_numpy("OUTPUT0"), expected)
    size = sum(4 + len(v) for v in expected.reshape(-1)) if wire == "BYTES" else expected.nbytes
    assert result.get_output("OUTPUT0") == {
        "name": "OUTPUT0", "datatype": wire, "shape": [2, 3], "parameters": {"binary_data_size": size},
    }


@pytest.mark.parametrize("wire", JSON_TYPES)
def test_every_json_capable_datatype_round_trips_in_json(client: httpclient.InferenceServerClient, wire: str) -> None:
    data = sample(wire)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer(echo_model(wire), [tensor("INPUT0", data, wire, binary=False)], outputs=[output])
    assert "parameters" not in result.get_output("OUTPUT0")
    assert_same(result.as_numpy("OUTPUT0"), expected_echo(wire, data, as_json=True))


@pytest.mark.parametrize("wire", ["FP16", "BF16"])
def test_half_precision_outputs_asked_for_as_json_are_refused_with_400(
    client: httpclient.InferenceServerClient, wire: str
) -> None:
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    with pytest.raises(InferenceServerException) as caught:
        client.infer(echo_model(wire), [tensor("INPUT0", sample(wire), wire)], outputs=[output])
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        f"sending {wire} data via JSON is not supported. Please use the binary data format for output "
        f"'OUTPUT0' of model '{echo_model(wire)}'"
    )


@pytest.mark.parametrize("wire", ["BYTES", "FP16", "BF16", "INT64", "BOOL"])
def test_aio_client_round_trips_binary_data(server: RunningServer, wire: str) -> None:
    data = sample(wire)

    async def run() -> Any:
        client = aioclient.InferenceServerClient(server.url)
        try:
            item = aioclient.InferInput("INPUT0", list(data.shape), wire)
            item.set_data_from_numpy(data)
            return await client.infer(echo_model(wire), [item])
        finally:
            await client.close()

    result = asyncio.run(run())
    assert_same(result.as_numpy("OUTPUT0"), expected_echo(wire, data))


def test_aio_client_round_trips_json_data(server: RunningServer) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)

    async def run() -> Any:
        client = aioclient.InferenceServerClient(server.url)
        try:
            inputs = []
            for name, value in (("INPUT0", a), ("INPUT1", b)):
                item = aioclient.InferInput(name, [1, 16], "INT32")
                item.set_data_from_numpy(value, binary_data=False)
                inputs.append(item)
            outputs = [aioclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
            return await client.infer("simple", inputs, outputs=outputs, request_id="aio-1")
        finally:
            await client.close()

    result = asyncio.run(run())
    assert result.get_response()["id"] == "aio-1"
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


# -- the example models ------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_returns_the_sum_and_the_difference(client: httpclient.InferenceServerClient, binary: bool) -> None:
    inputs, a, b = simple_inputs(binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple", inputs, outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    response = result.get_response()
    assert (response["model_name"], response["model_version"]) == ("simple", "1")
    assert "id" not in response


def test_simple_without_an_outputs_list_returns_every_output_in_binary(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = simple_inputs()
    result = client.infer("simple", inputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert all(o["parameters"] == {"binary_data_size": 64} for o in result.get_response()["outputs"])
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()


def test_a_16_mib_tensor_round_trips_in_binary(client: httpclient.InferenceServerClient) -> None:
    data = np.random.default_rng(3).standard_normal((1, 4 << 20)).astype(np.float32)
    result = client.infer("echo_fp32", [tensor("INPUT0", data, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_add_one_adds_one_to_each_row_of_a_batch(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[1], [2], [-7], [2**40]], dtype=np.int64)
    result = client.infer("add_one", [tensor("INPUT0", data, "INT64")])
    assert result.as_numpy("OUTPUT0").tolist() == [[2], [3], [-6], [2**40 + 1]]


def test_async_infer_with_a_concurrent_client_answers_every_request(server: RunningServer) -> None:
    triton = httpclient.InferenceServerClient(server.url, concurrency=4)
    try:
        pending = []
        for i in range(12):
            a = np.full((1, 16), i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            request = triton.async_infer(
                "simple", [tensor("INPUT0", a, "INT32"), tensor("INPUT1", b, "INT32")], request_id=f"req-{i}"
            )
            pending.append((request, a, b))
        for i, (request, a, b) in enumerate(pending):
            result = request.get_result(timeout=60)
            assert result.get_response()["id"] == f"req-{i}"
            assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
            assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    finally:
        triton.close()


def test_only_the_requested_output_is_returned(client: httpclient.InferenceServerClient) -> None:
    inputs, a, b = simple_inputs()
    result = client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def test_request_id_is_echoed_in_the_response(client: httpclient.InferenceServerClient) -> None:
    inputs, _, _ = simple_inputs()
    result = client.infer("simple", inputs, request_id="my request #7")
    assert result.get_response()["id"] == "my request #7"


def test_custom_request_parameters_are_accepted(client: httpclient.InferenceServerClient) -> None:
    # A model's infer() receives only its inputs, so nothing can show that parameters reach
    # it; this checks that every allowed parameter type is accepted and changes nothing.
    inputs, a, b = simple_inputs()
    result = client.infer("simple", inputs, parameters={"flag": True, "count": 3, "label": "x", "ratio": 0.5})
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()


# -- compression -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_algorithm", "response_algorithm"),
    [("gzip", None), ("deflate", None), (None, "gzip"), (None, "deflate"), ("gzip", "deflate"), ("deflate", "gzip")],
    ids=["gzip-request", "deflate-request", "gzip-response", "deflate-response", "gzip-then-deflate", "deflate-then-gzip"],
)
def test_compressed_requests_and_responses_round_trip(
    client: httpclient.InferenceServerClient, request_algorithm: str | None, response_algorithm: str | None
) -> None:
    inputs, a, b = simple_inputs()
    result = client.infer(
        "simple", inputs,
        request_compression_algorithm=request_algorithm, response_compression_algorithm=response_algorithm,
    )
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def simple_binary_body() -> tuple[bytes, int]:
    header = orjson.dumps({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })
    blobs = np.arange(16, dtype=np.int32).tobytes() + np.ones(16, dtype=np.int32).tobytes()
    return header + blobs, len(header)


@pytest.mark.parametrize(
    ("encoding", "decompress"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)], ids=["gzip", "deflate"]
)
def test_response_is_compressed_as_asked_with_the_uncompressed_header_length(
    server: RunningServer, encoding: str, decompress: Any
) -> None:
    body, header_length = simple_binary_body()
    headers = {"Inference-Header-Content-Length": str(header_length), "Accept-Encoding": encoding}
    with httpx.stream("POST", server.http + "/v2/models/simple/infer", content=body, headers=headers) as response:
        raw = b"".join(response.iter_raw())  # as sent: httpx would otherwise decode it
    assert response.status_code == 200
    assert response.headers["content-encoding"] == encoding
    assert response.headers["content-length"] == str(len(raw))
    plain = decompress(raw)  # gzip framing for gzip, zlib framing for deflate (not raw deflate)
    json_length = int(response.headers["inference-header-content-length"])
    assert orjson.loads(plain[:json_length]) == {
        "model_name": "simple", "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}],
    }
    assert plain[json_length:] == (np.arange(16, dtype=np.int32) + 1).tobytes()


# -- the wire, as the C++ client and curl see it -----------------------------------------

SIMPLE_JSON = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ],
}
SUM = [i + 1 for i in range(16)]
DIFFERENCE = [i - 1 for i in range(16)]


def raw_post(server: RunningServer, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    # identity: httpx would otherwise ask for gzip and decode it behind our back
    headers = {"Accept-Encoding": "identity", **(headers or {})}
    return httpx.post(server.http + path, content=body, headers=headers)


def test_an_all_json_response_is_json_without_a_header_length(server: RunningServer) -> None:
    response = raw_post(server, "/v2/models/simple/infer", orjson.dumps(SIMPLE_JSON))
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    assert response.json() == {
        "model_name": "simple", "model_version": "1",
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": SUM},
                    {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": DIFFERENCE}],
    }


def test_a_binary_response_carries_the_json_length_and_the_blobs_in_output_order(server: RunningServer) -> None:
    body, header_length = simple_binary_body()
    header = orjson.loads(body[:header_length])
    header["outputs"] = [{"name": "OUTPUT1", "parameters": {"binary_data": True}},
                         {"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    new_header = orjson.dumps(header)
    response = raw_post(server, "/v2/models/simple/infer", new_header + body[header_length:],
                        {"Inference-Header-Content-Length": str(len(new_header))})
    assert response.headers["content-type"] == "application/octet-stream"
    json_length = int(response.headers["inference-header-content-length"])
    head = orjson.loads(response.content[:json_length])
    assert [o["name"] for o in head["outputs"]] == ["OUTPUT0", "OUTPUT1"]  # the model's order
    blobs = response.content[json_length:]
    assert blobs == np.array(SUM, dtype=np.int32).tobytes() + np.array(DIFFERENCE, dtype=np.int32).tobytes()


def test_a_header_length_covering_an_all_json_body_is_accepted(server: RunningServer) -> None:
    # The C++ client (perf_analyzer) always sends the header, even without blobs.
    body = orjson.dumps(SIMPLE_JSON)
    response = raw_post(server, "/v2/models/simple/infer", body, {"Inference-Header-Content-Length": str(len(body))})
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == SUM


@pytest.mark.parametrize(("request_id", "echoed"), [("", False), ("42", True), ("é☃ \"x\"", True)],
                         ids=["empty", "digits", "unicode-and-quotes"])
def test_request_id_is_echoed_only_when_not_empty(server: RunningServer, request_id: str, echoed: bool) -> None:
    response = raw_post(server, "/v2/models/simple/infer", orjson.dumps({"id": request_id, **SIMPLE_JSON}))
    assert response.status_code == 200
    assert response.json().get("id") == (request_id if echoed else None)
    assert ("id" in response.json()) is echoed


@pytest.mark.parametrize(("flag", "binary"), [(True, True), (False, False)], ids=["true", "false"])
def test_binary_data_output_sets_the_encoding_of_unlisted_outputs(server: RunningServer, flag: bool, binary: bool) -> None:
    body = orjson.dumps({**SIMPLE_JSON, "parameters": {"binary_data_output": flag}})
    response = raw_post(server, "/v2/models/simple/infer", body)
    assert ("inference-header-content-length" in response.headers) is binary


def test_a_listed_output_without_binary_data_is_json_even_with_binary_data_output(server: RunningServer) -> None:
    body = orjson.dumps({**SIMPLE_JSON, "parameters": {"binary_data_output": True}, "outputs": [{"name": "OUTPUT1"}]})
    response = raw_post(server, "/v2/models/simple/infer", body)
    assert response.json()["outputs"] == [{"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": DIFFERENCE}]


def test_an_empty_binary_output_is_listed_with_size_zero_and_no_blob_follows(server: RunningServer) -> None:
    header = orjson.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 0], "parameters": {"binary_data_size": 0}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })
    response = raw_post(server, "/v2/models/echo_fp32/infer", header, {"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    assert response.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 0], "parameters": {"binary_data_size": 0}}]


def test_a_raw_binary_request_feeds_the_single_input_and_answers_in_binary(server: RunningServer) -> None:
    response = raw_post(server, "/v2/models/add_one/infer", np.array([41], dtype=np.int64).tobytes(),
                        {"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200, response.text
    json_length = int(response.headers["inference-header-content-length"])
    assert orjson.loads(response.content[:json_length])["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT64", "shape": [1, 1], "parameters": {"binary_data_size": 8}}]
    assert response.content[json_length:] == np.array([42], dtype=np.int64).tobytes()


@pytest.mark.parametrize("wire", ["FP32", "FP64"])
def test_nan_and_infinity_round_trip_in_json(client: httpclient.InferenceServerClient, wire: str) -> None:
    data = np.array([[np.nan, np.inf, -np.inf, 1.5]], dtype=wire.replace("FP", "float"))
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer(echo_model(wire), [tensor("INPUT0", data, wire, binary=False)], outputs=[output])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


# -- classification ----------------------------------------------------------------------

SCORES = np.array([[0.1, 0.4, 0.3, 0.2], [4.0, 3.0, 2.0, 1.0]], dtype=np.float32)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_returns_top_k_with_labels_from_the_label_file(
    client: httpclient.InferenceServerClient, binary: bool
) -> None:
    output = httpclient.InferRequestedOutput("SCORES", binary_data=binary, class_count=2)
    result = client.infer("classify", [tensor("INPUT0", SCORES, "FP32")], outputs=[output])
    expected = [["0.400000:1:bravo", "0.300000:2:charlie"], ["4.000000:0:alpha", "3.000000:1:bravo"]]
    got = result.as_numpy("SCORES").tolist()
    assert got == ([[s.encode() for s in row] for row in expected] if binary else expected)
    assert result.get_output("SCORES")["datatype"] == "BYTES"
    assert result.get_output("SCORES")["shape"] == [2, 2]


def test_classification_without_a_label_file_gives_value_and_index(client: httpclient.InferenceServerClient) -> None:
    output = httpclient.InferRequestedOutput("COUNTS", binary_data=False, class_count=3)
    result = client.infer("classify", [tensor("INPUT0", SCORES, "FP32")], outputs=[output])
    assert result.as_numpy("COUNTS").tolist() == [["4:1", "3:2", "2:3"], ["40:0", "30:1", "20:2"]]


def test_classification_count_above_the_class_count_returns_every_class(client: httpclient.InferenceServerClient) -> None:
    output = httpclient.InferRequestedOutput("COUNTS", binary_data=False, class_count=10)
    result = client.infer("classify", [tensor("INPUT0", SCORES[:1], "FP32")], outputs=[output])
    assert result.as_numpy("COUNTS").tolist() == [["4:1", "3:2", "2:3", "1:0"]]


# -- versions ----------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "added"), [("1", 1), ("2", 2), ("", 2)], ids=["v1", "v2", "latest"])
def test_version_in_the_url_selects_the_version_that_runs(
    client: httpclient.InferenceServerClient, version: str, added: int
) -> None:
    data = np.array([10, 20], dtype=np.int32)
    result = client.infer("versioned", [tensor("INPUT0", data, "INT32")], model_version=version)
    assert result.as_numpy("OUTPUT0").tolist() == [10 + added, 20 + added]
    assert result.get_response()["model_version"] == str(added)


def test_an_unknown_version_is_a_404_naming_it(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("versioned", [tensor("INPUT0", np.array([1, 2], dtype=np.int32), "INT32")], model_version="3")
    assert caught.value.status() == "404"
    assert caught.value.message() == "Request for unknown model: 'versioned' version 3 is not found"


# -- metadata, config, readiness, statistics ---------------------------------------------


def test_server_is_live_and_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


@pytest.mark.parametrize(
    ("model", "version", "ready"),
    [("simple", "", True), ("versioned", "1", True), ("versioned", "2", True), ("versioned", "3", False),
     ("no_such_model", "", False)],
    ids=["simple", "versioned-v1", "versioned-v2", "missing-version", "missing-model"],
)
def test_model_readiness_as_the_client_sees_it(
    client: httpclient.InferenceServerClient, model: str, version: str, ready: bool
) -> None:
    assert client.is_model_ready(model, version) is ready


def test_server_metadata_lists_the_extensions_the_clients_rely_on(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert sorted(metadata) == ["extensions", "name", "version"]
    assert isinstance(metadata["name"], str) and isinstance(metadata["version"], str)
    assert all(isinstance(e, str) for e in metadata["extensions"])
    assert {"binary_tensor_data", "classification", "model_configuration", "statistics"} <= set(metadata["extensions"])


def test_model_metadata_of_simple_has_the_batch_dimension(client: httpclient.InferenceServerClient) -> None:
    tensors = [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")]
    outputs = [{"name": n, "datatype": "INT32", "shape": [-1, 16]} for n in ("OUTPUT0", "OUTPUT1")]
    assert client.get_model_metadata("simple") == {
        "name": "simple", "versions": ["1"], "platform": "python", "inputs": tensors, "outputs": outputs,
    }


@pytest.mark.parametrize(("version", "versions"), [("", ["1", "2"]), ("1", ["1"])], ids=["all", "v1"])
def test_model_metadata_lists_the_ready_versions(
    client: httpclient.InferenceServerClient, version: str, versions: list[str]
) -> None:
    metadata = client.get_model_metadata("versioned", version)
    assert metadata["versions"] == versions
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [2]}]


def test_model_config_has_the_fields_perf_analyzer_reads_typed_right(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple")
    assert type(config["max_batch_size"]) is int and config["max_batch_size"] == 8
    assert config["model_transaction_policy"] == {"decoupled": False}
    assert "sequence_batching" not in config
    assert "dynamic_batching" not in config  # simple has none configured
    assert config["platform"] == "" and config["backend"] == "python"
    assert [(i["name"], i["is_shape_tensor"], i["optional"]) for i in config["input"]] == [
        ("INPUT0", False, False), ("INPUT1", False, False)]
    assert [(o["name"], o["is_shape_tensor"]) for o in config["output"]] == [("OUTPUT0", False), ("OUTPUT1", False)]


def test_model_config_has_dynamic_batching_only_when_configured(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_one")
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [], "max_queue_delay_microseconds": 20000, "preserve_ordering": False,
        "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {},
    }
    assert "sequence_batching" not in config


def test_model_config_of_a_version_is_that_versions_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("versioned", "1")
    assert config["name"] == "versioned"
    assert config["version_policy"] == {"all": {}}
    assert config["max_batch_size"] == 0


def test_statistics_count_the_requests_of_a_model(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("counted")["model_stats"]
    assert [(s["name"], s["version"], s["inference_count"]) for s in before] == [("counted", "1", 0)]
    for _ in range(3):
        client.infer("counted", [tensor("INPUT0", np.ones((2, 2), dtype=np.int32), "INT32")])
    (stats,) = client.get_inference_statistics("counted", "1")["model_stats"]
    assert (stats["inference_count"], stats["execution_count"]) == (6, 3)
    counts = {key: value["count"] for key, value in stats["inference_stats"].items()}
    assert counts == {"success": 3, "fail": 0, "queue": 3, "compute_input": 3, "compute_infer": 3,
                      "compute_output": 3, "cache_hit": 0, "cache_miss": 0}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(2, 3)]
    everything = client.get_inference_statistics()["model_stats"]
    assert ("counted", "1") in [(s["name"], s["version"]) for s in everything]
    assert ("versioned", "2") in [(s["name"], s["version"]) for s in everything]
