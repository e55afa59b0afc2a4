"""``raw_request``: a raw binary infer body (``Inference-Header-Content-Length: 0``) is the
model's single input, its shape deduced from the config; what cannot be deduced is
refused with Triton's texts."""

from __future__ import annotations

import numpy as np
import pytest

from nereid.config.schema import ModelConfig
from nereid.errors import InvalidInputError

from tests.unit.http.infer_bodies import config, parse, raises

def test_raw_binary_request_deduces_the_variable_dim_and_a_batch_of_one() -> None:
    cfg = config(inputs=(("X", "FP32", (2, -1)),))
    request = parse(np.arange(6, dtype=np.float32).tobytes(), "0", cfg)
    assert request.inputs["X"].shape == (1, 2, 3)
    assert request.rows == 1
    assert request.outputs is None and request.binary_data_output is True


def test_raw_binary_bytes_input_is_one_element() -> None:
    cfg = config(inputs=(("X", "BYTES", (1,)),), max_batch_size=0)
    assert parse(b"\x00raw", "0", cfg).inputs["X"].tolist() == [b"\x00raw"]


@pytest.mark.parametrize(
    ("cfg", "body", "message"),
    [
        (
            config(inputs=(("X", "FP32", (1,)), ("Y", "FP32", (1,)), ("Z", "FP32", (1,)))),
            b"1234",
            (
                "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got 3 "
                "inputs in 'm' model configuration"
            ),
        ),
        (
            config(inputs=(("X", "FP32", (-1, -1)),)),
            b"1234",
            (
                "[request id: <id_unknown>] The shape of the raw input 'X' can not be deduced because there are "
                "more than one variable-sized dimension"
            ),
        ),
        (
            config(inputs=(("X", "BYTES", (2,)),)),
            b"1234",
            "[request id: <id_unknown>] For BYTE datatype raw input 'X', the model must have input shape [1]",
        ),
        (
            config(inputs=(("X", "FP32", (2,)),)),
            b"123",
            "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'm'. Expected 8, got 3",
        ),
    ],
    ids=["many-inputs", "two-variable-dims", "bytes-shape", "size"],
)
def test_raw_binary_request_errors(cfg: ModelConfig, body: bytes, message: str) -> None:
    with raises(InvalidInputError, message):
        parse(body, "0", cfg)


def test_raw_binary_request_larger_than_the_input_size_limit_is_refused() -> None:
    cfg = config(inputs=(("X", "FP32", (-1,)),))
    message = (
        "Raw input has a byte_size (16 bytes) that exceeds the maximum allowed value of 8 bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    with raises(InvalidInputError, message):
        parse(bytes(16), "0", cfg, max_json_size=8)
    assert parse(bytes(8), "0", cfg, max_json_size=8).inputs["X"].shape == (1, 2)
