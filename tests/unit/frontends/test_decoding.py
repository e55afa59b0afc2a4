"""frontends.decoding: which infer requests a worker decodes itself, and which it hands
to the main process as a raw body (decode returns None)."""

from __future__ import annotations

import json

from nereid.config.load import parse_model_config
from nereid.frontends.decoding import Announced, decode
from nereid.http.infer import InferHeaders

CONFIG = parse_model_config(
    {
        "name": "acc",
        "max_batch_size": 4,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
    },
    source="config.toml",
    folder_name="acc",
)


def _body(parameters: dict[str, object] | None = None) -> bytes:
    request: dict[str, object] = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [3]}]}
    if parameters:
        request["parameters"] = parameters
    return json.dumps(request).encode()


def _decode(body: bytes) -> object:
    return decode(Announced.of(1, 1, CONFIG, {}), "acc", InferHeaders([]), body, 1 << 20)


def test_a_plain_json_request_is_decoded_in_the_worker() -> None:
    decoded = _decode(_body())
    assert decoded is not None
    assert decoded.request.inputs["INPUT"].tolist() == [[3]]  # type: ignore[attr-defined]


def test_a_request_with_sequence_parameters_goes_raw_to_the_main_process() -> None:
    """Its id and flags differ each request (no template); the main process's own infer
    flow keeps them for the sequence batcher."""
    assert _decode(_body({"sequence_id": 7, "sequence_start": True})) is None


def test_a_bad_request_goes_raw_so_the_main_process_words_its_error() -> None:
    assert _decode(b'{"inputs": [{"name": "NOPE"}]}') is None
