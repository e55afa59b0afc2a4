"""The generate extension (POST .../generate and .../generate_stream) over a real server:
the example text_generator (batched, decoupled), a non-decoupled model, and a small
decoupled test model whose steps the test controls."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import EXAMPLES, ROOT, RepoBuilder, RunningServer, start_server
from tests.waiting import MODEL_GATE, wait_until

SSE = "text/event-stream; charset=utf-8"

# A decoupled, non-batching model whose behaviour the request picks (input MODE):
#   "gate"       one step, then waits for the file "go" in its folder, then a second step
#   "count3"     three steps: OUT "a", "b", "c" with STEP 1, 2, 3
#   "fail_first" raises before its first step
#   "fail_later" one step, then raises
#   "forever"    a step every 20 ms until closed; on close writes the file "closed"
#   anything else: one step, finished
GATE_CONFIG = """
max_batch_size = 0
[[input]]
name = "MODE"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "OUT"
data_type = "TYPE_STRING"
dims = [1]
[[output]]
name = "STEP"
data_type = "TYPE_INT32"
dims = [1]
[model_transaction_policy]
decoupled = true
"""

GATE_MODEL = """
import time

import numpy as np

import nereid


def step(text, n, finished=False):
    out = {"OUT": np.array([text.encode()], dtype=object), "STEP": np.array([n], dtype=np.int32)}
    if finished:
        out[nereid.FINISHED] = np.array([True])
    return out


class Model:
    def __init__(self, context):
        self.folder = context.model_dir

    def infer(self, inputs):
        mode = inputs["MODE"].reshape(-1)[0].decode()
        if mode == "fail_first":
            raise RuntimeError("boom before the first step")
        if mode == "count3":
            yield step("a", 1)
            yield step("b", 2)
            yield step("c", 3, finished=True)
            return
        if mode == "forever":
            n = 0
            try:
                while True:
                    n += 1
                    yield step(f"tick {n}", n)
                    time.sleep(0.02)
            finally:
                (self.folder / "closed").write_text(str(n))
        yield step("first", 1)
        if mode == "fail_later":
            raise RuntimeError("boom after the first step")
        if mode == "gate":
            wait_for_file(self.folder / "go")
            yield step("second", 2, finished=True)
""" + MODEL_GATE

#: Prompts of different lengths (left padding in a batch matters).
PROMPTS = ["Hi", "Once upon a time,", "My name is Clara and I am a", "The quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def test_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """A server with the gate model and a text_generator copy whose queue waits 60 s for a
    full batch of 4 (so four concurrent requests always form one batch)."""
    root = tmp_path_factory.mktemp("generate-repo")
    repo = RepoBuilder(root)
    repo.add("gate", GATE_CONFIG, GATE_MODEL, version=1)
    config = (ROOT / "model_repository" / "text_generator" / "config.toml").read_text()  # RepoBuilder adapts it
    config = config.replace("max_queue_delay_microseconds = 20000", "max_queue_delay_microseconds = 60000000")
    assert "60000000" in config
    model = (EXAMPLES / "text_generator" / "1" / "model.py").read_text()
    repo.add("text_generator", config, model, version=1)
    server = start_server(root, log_dir=tmp_path_factory.mktemp("generate-server"))
    yield server, root
    server.stop()


def post(server: RunningServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.http + path, content=content, timeout=60, **kwargs)


def events_of(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The objects of a server-sent-event response, as they arrive."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])
        else:
            assert line == "", f"unexpected line in the event stream: {line!r}"


def stream(server: RunningServer, model: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    with httpx.stream("POST", f"{server.http}/v2/models/{model}/generate_stream", json=body, timeout=60) as response:
        return response, list(events_of(response))


def stats_of(server: RunningServer, model: str) -> dict[str, Any]:
    response = httpx.get(f"{server.http}/v2/models/{model}/stats", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["model_stats"][0]  # type: ignore[no-any-return]


def assert_error(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    for fragment in fragments:
        assert fragment in message, f"expected {fragment!r} in the error, got {message!r}"


# -- /generate ---------------------------------------------------------------------------


def test_generate_answers_one_json_object_with_id_model_version_and_text(example_server: RunningServer) -> None:
    response = post(
        example_server,
        "/v2/models/text_generator/generate",
        {"id": "req-1", "text_input": "Once upon a time,", "max_tokens": 8, "parameters": {"temperature": 0}},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["id", "model_name", "model_version", "text_output"]
    assert body["id"] == "req-1"
    assert body["model_name"] == "text_generator"
    assert body["model_version"] == "1"
    assert isinstance(body["text_output"], str)
    assert 1 <= len(body["text_output"]) <= 8


def test_generate_is_deterministic_and_honours_max_tokens(example_server: RunningServer) -> None:
    def text(max_tokens: int) -> str:
        response = post(example_server, "/v2/models/text_generator/versions/1/generate",
                        {"text_input": "Once upon a time,", "max_tokens": max_tokens})
        assert response.status_code == 200, response.text
        return str(response.json()["text_output"])

    long, short = text(12), text(4)
    assert len(long) == 12  # this prompt does not reach end-of-text within 12 tokens
    assert long.startswith(short) and len(short) == 4
    assert text(12) == long


def test_generate_without_id_has_no_id_key(example_server: RunningServer) -> None:
    response = post(example_server, "/v2/models/text_generator/generate", {"text_input": "Hi", "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert "id" not in response.json()


def test_generate_on_a_non_decoupled_model_returns_its_outputs_unarrayed(example_server: RunningServer) -> None:
    response = post(example_server, "/v2/models/add_one/generate", {"INPUT0": 41, "id": "x"})
    assert response.status_code == 200, response.text
    assert response.json() == {"id": "x", "model_name": "add_one", "model_version": "1", "OUTPUT0": 42}


def test_generate_returns_multi_element_outputs_as_lists(example_server: RunningServer) -> None:
    response = post(example_server, "/v2/models/simple/generate", {"INPUT0": list(range(16)), "INPUT1": [1] * 16})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["OUTPUT0"] == [n + 1 for n in range(16)]
    assert body["OUTPUT1"] == [n - 1 for n in range(16)]


def test_generate_concatenates_string_steps_and_keeps_the_last_other_output(test_server: tuple[RunningServer, Path]) -> None:
    server, _ = test_server
    response = post(server, "/v2/models/gate/generate", {"MODE": "count3"})
    assert response.status_code == 200, response.text
    assert response.json() == {"model_name": "gate", "model_version": "1", "OUT": "abc", "STEP": 3}


# -- /generate_stream --------------------------------------------------------------------


def test_generate_stream_sends_one_event_per_token_in_order(example_server: RunningServer) -> None:
    body = {"text_input": "Once upon a time,", "max_tokens": 12, "id": "s1"}
    response, events = stream(example_server, "text_generator", body)
    assert response.status_code == 200
    assert response.headers["content-type"] == SSE
    assert len(events) == 12
    for event in events:
        assert list(event) == ["id", "model_name", "model_version", "text_output"]
        assert (event["id"], event["model_name"], event["model_version"]) == ("s1", "text_generator", "1")
    whole = post(example_server, "/v2/models/text_generator/generate", body).json()["text_output"]
    assert "".join(event["text_output"] for event in events) == whole


def test_generate_stream_delivers_each_step_before_the_next_exists(test_server: tuple[RunningServer, Path]) -> None:
    server, root = test_server
    go = root / "gate" / "1" / "go"
    go.unlink(missing_ok=True)
    try:
        with httpx.stream("POST", f"{server.http}/v2/models/gate/generate_stream", json={"MODE": "gate"}, timeout=30) as response:
            assert response.status_code == 200
            events = events_of(response)
            # The model waits for "go" before its second step: the first event must
            # have reached us already.
            assert next(events)["OUT"] == "first"
            go.write_text("go")
            assert [event["OUT"] for event in events] == ["second"]
    finally:
        go.unlink(missing_ok=True)


def test_generate_stream_on_a_non_decoupled_model_sends_one_event(example_server: RunningServer) -> None:
    response, events = stream(example_server, "add_one", {"INPUT0": [7]})
    assert response.status_code == 200
    assert response.headers["content-type"] == SSE
    assert events == [{"model_name": "add_one", "model_version": "1", "OUTPUT0": 8}]


def test_error_before_the_first_event_is_a_json_error_with_status(test_server: tuple[RunningServer, Path]) -> None:
    server, _ = test_server
    response = post(server, "/v2/models/gate/generate_stream", {"MODE": "fail_first"})
    assert_error(response, 500, 'model "gate"', "RuntimeError: boom before the first step")


def test_error_after_the_first_event_arrives_as_an_error_event(test_server: tuple[RunningServer, Path]) -> None:
    server, _ = test_server
    response, events = stream(server, "gate", {"MODE": "fail_later"})
    assert response.status_code == 200
    assert events[0]["OUT"] == "first"
    assert len(events) == 2
    assert list(events[1]) == ["error"]
    assert "RuntimeError: boom after the first step" in events[1]["error"]


# -- batching ------------------------------------------------------------------------------


def test_prompts_of_different_lengths_batched_together_each_get_their_own_text(
    example_server: RunningServer, test_server: tuple[RunningServer, Path]
) -> None:
    server, _ = test_server
    # Reference: each prompt alone, one after the other (the example server, same model).
    alone = {}
    for prompt in PROMPTS:
        response = post(example_server, "/v2/models/text_generator/generate", {"text_input": prompt, "max_tokens": 10})
        assert response.status_code == 200, response.text
        alone[prompt] = response.json()["text_output"]
    assert len(set(alone.values())) == len(PROMPTS), f"expected distinct texts, got {alone}"

    # Together: the test server's queue holds them until the batch of 4 is full.
    def together(prompt: str) -> str:
        response = post(server, "/v2/models/text_generator/generate", {"text_input": prompt, "max_tokens": 10})
        assert response.status_code == 200, response.text
        return str(response.json()["text_output"])

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = dict(zip(PROMPTS, pool.map(together, PROMPTS)))
    assert batched == alone
    stats = stats_of(server, "text_generator")
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(4, 1)]


# -- errors ----------------------------------------------------------------------------------


def test_infer_on_a_decoupled_model_is_501(example_server: RunningServer) -> None:
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["Hi"]}]}
    response = post(example_server, "/v2/models/text_generator/infer", body)
    assert_error(response, 501, "HTTP end point doesn't support models with decoupled transaction policy")


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        pytest.param({"max_tokens": 4}, ["model 'text_generator'", "missing required input(s) 'text_input'"], id="missing-input"),
        pytest.param({"text_input": 5}, ["input 'text_input' (BYTES", "expected a JSON string", "got JSON number 5"], id="number-for-string"),
        pytest.param({"text_input": "Hi", "max_tokens": "ten"}, ["input 'max_tokens' (INT32", "expected a JSON integer", 'got JSON string "ten"'], id="string-for-int32"),
        pytest.param({"text_input": "Hi", "max_tokens": 1 << 40}, ["input 'max_tokens' (INT32", "in [-2147483648, 2147483647]"], id="int32-overflow"),
        pytest.param({"text_input": "Hi", "max_tokens": [1, 2]}, ["input 'max_tokens'", "2 element(s) do not fit dims [1]"], id="two-elements-for-dims-1"),
        pytest.param({"text_input": "Hi", "style": {"a": 1}}, ["field 'style'", "request parameter", "expected a JSON string, number or boolean, got object"], id="object-field"),
        pytest.param({"text_input": "Hi", "parameters": {"top": [1]}}, ["parameter 'top'", "got array"], id="array-parameter"),
        pytest.param({"text_input": "Hi", "parameters": {"triton_x": 1}}, ["parameter keys starting with 'triton_' are reserved"], id="triton-parameter"),
        pytest.param({"text_input": "Hi", "parameters": {"priority": -1}}, ["parameter 'priority'", "unsigned integer"], id="negative-priority"),
        pytest.param({"text_input": "Hi", "parameters": 3}, ["field 'parameters': expected a JSON object"], id="parameters-not-object"),
        pytest.param({"text_input": "Hi", "id": 7}, ["field 'id': expected a JSON string"], id="id-not-string"),
    ],
)
def test_bad_generate_request_is_400_and_names_the_field(
    example_server: RunningServer, endpoint: str, body: dict[str, Any], fragments: list[str]
) -> None:
    response = post(example_server, f"/v2/models/text_generator/{endpoint}", body)
    assert_error(response, 400, *fragments)


def test_compressed_generate_request_is_400(example_server: RunningServer) -> None:
    body = gzip.compress(json.dumps({"text_input": "Hi", "max_tokens": 2}).encode())
    response = post(example_server, "/v2/models/text_generator/generate", body, headers={"Content-Encoding": "gzip"})
    assert_error(response, 400, "unsupported Content-Encoding 'gzip'", "identity")
    # identity is fine, and the server still answers
    plain = json.dumps({"text_input": "Hi", "max_tokens": 2}).encode()
    response = post(example_server, "/v2/models/text_generator/generate", plain, headers={"Content-Encoding": "identity"})
    assert response.status_code == 200, response.text


def test_malformed_json_is_500_like_infer(example_server: RunningServer) -> None:
    response = post(example_server, "/v2/models/text_generator/generate", b"{not json")
    assert_error(response, 500, "failed to parse the request JSON buffer")


def test_unknown_model_is_404_and_get_is_405(example_server: RunningServer) -> None:
    assert_error(post(example_server, "/v2/models/nope/generate", {"text_input": "Hi"}), 404,
                 "Request for unknown model: 'nope' is not found")
    assert_error(post(example_server, "/v2/models/text_generator/versions/9/generate_stream", {"text_input": "Hi"}),
                 404, "'text_generator' version 9 is not found")
    response = httpx.get(example_server.http + "/v2/models/text_generator/generate", timeout=10)
    assert_error(response, 405, "Method Not Allowed")


# -- disconnects -----------------------------------------------------------------------------


def _open_stream(server: RunningServer, model: str, body: dict[str, Any], events: int) -> None:
    """POST to generate_stream on a raw socket, read until ``events`` events came, then
    close the connection (the client goes away mid-stream)."""
    payload = json.dumps(body).encode()
    request = (
        f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while received.count(b"data: ") < events:
            chunk = sock.recv(65536)
            assert chunk, f"server closed the stream early: {received!r}"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200"), received[:200]


def test_disconnect_mid_stream_closes_the_models_generator(test_server: tuple[RunningServer, Path]) -> None:
    server, root = test_server
    closed = root / "gate" / "1" / "closed"
    closed.unlink(missing_ok=True)
    _open_stream(server, "gate", {"MODE": "forever"}, events=3)
    wait_until(closed.exists, "the generator closed after its only client left")
    # The instance is free again: the next request runs.
    response = post(server, "/v2/models/gate/generate", {"MODE": "count3"})
    assert response.status_code == 200, response.text
    assert response.json()["OUT"] == "abc"


def test_disconnect_mid_stream_leaves_text_generator_healthy(example_server: RunningServer) -> None:
    failed_before = stats_of(example_server, "text_generator")["inference_stats"]["fail"]["count"]
    _open_stream(example_server, "text_generator", {"text_input": "Once upon a time,", "max_tokens": 256}, events=2)
    # counted as cancelled once its batch stopped
    wait_until(lambda: stats_of(example_server, "text_generator")["inference_stats"]["fail"]["count"] == failed_before + 1,
               "the abandoned stream counted as failed (cancelled)", every=0.05)
    assert httpx.get(example_server.http + "/v2/health/ready", timeout=10).status_code == 200
    response = post(example_server, "/v2/models/text_generator/generate", {"text_input": "Hi", "max_tokens": 3})
    assert response.status_code == 200, response.text
