"""``compression``: Content-Encoding both ways (protocol.md §3.8): request bodies inflated
within the size limit, the response encoding an Accept-Encoding chooses, and garbage
bodies refused with a NereidError.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from nereid.errors import InvalidInputError, NereidError, UnsupportedError
from nereid.http import compression

from tests.unit.http.infer_bodies import (
    client_body,
    client_input,
    client_result,
    encode,
    fp32_input,
    parse,
    parse_json,
    raises,
)


# -- compression ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)], ids=["gzip", "deflate"]
)
def test_compressed_request_bodies_are_inflated(encoding: str, compress: Callable[[bytes], bytes]) -> None:
    body, header = client_body([client_input("INPUT0", np.ones((1, 16), np.float32), "FP32")])
    plain = compression.decode_body(compress(body), encoding, max_size=1 << 20)
    assert plain == body
    assert parse(plain, header).inputs["INPUT0"].sum() == 16


@pytest.mark.parametrize("encoding", [None, "", "identity"])
def test_identity_bodies_are_returned_as_is(encoding: str | None) -> None:
    body = b"\x00 anything"
    assert compression.decode_body(body, encoding, max_size=1) is body


@pytest.mark.parametrize("encoding", ["br", "GZIP", "gzip, deflate", "x-gzip"])
def test_unsupported_content_encoding_is_a_501(encoding: str) -> None:
    with raises(UnsupportedError, "Unsupported compression type"):
        compression.decode_body(gzip.compress(b"{}"), encoding, max_size=100)


def test_zip_bomb_stops_at_the_size_limit() -> None:
    bomb = gzip.compress(bytes(50_000_000))
    with raises(
        InvalidInputError,
        "request body of more than 1000 bytes exceeds the maximum allowed size (1000 bytes, --max-request-size)",
    ):
        compression.decode_body(bomb, "gzip", max_size=1000)
    assert compression.decode_body(gzip.compress(bytes(1000)), "gzip", max_size=1000) == bytes(1000)


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"not compressed at all", "Error -3 while decompressing data: incorrect header check"),
        (gzip.compress(b"x" * 100)[:-12], "the compressed data is truncated"),
        (gzip.compress(b"x") + b"junk", "4 unexpected bytes after the end of the compressed data"),
    ],
    ids=["garbage", "truncated", "trailing"],
)
def test_corrupt_compressed_bodies_are_400s_naming_the_encoding(data: bytes, detail: str) -> None:
    with raises(
        InvalidInputError, f"failed to decompress the request body with Content-Encoding 'deflate': {detail}"
    ):
        compression.decode_body(data, "deflate", max_size=1 << 20)


def test_empty_compressed_body_is_a_400() -> None:
    with raises(
        InvalidInputError, "request body with Content-Encoding 'gzip' is empty: nothing to be decompressed"
    ):
        compression.decode_body(b"", "gzip", max_size=10)


@pytest.mark.parametrize(
    ("value", "chosen"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate, br", "gzip"),
        ("deflate, gzip", "deflate"),
        ("br", None),
        ("identity", None),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("deflate;q=0.5,gzip;q=0.5", "deflate"),
        ("gzip;q=0, identity", None),
        ("identity;q=0.9, gzip", "gzip"),
        ("gzip;q=abc, deflate;q=0.1", "deflate"),
        ("gzip ;q=1", None),
        ("GZIP", None),
        ("*", None),
        ("  gzip", "gzip"),
        ("gzip;q=1e999, deflate", "deflate"),
    ],
)
def test_accept_encoding_follows_tritons_rules(value: str | None, chosen: str | None) -> None:
    assert compression.parse_accept_encoding(value) == chosen


@pytest.mark.parametrize(
    ("accept", "encoding", "decompress"),
    [("gzip, deflate, br", b"gzip", gzip.decompress), ("deflate", b"deflate", zlib.decompress)],
    ids=["gzip", "deflate"],
)
def test_responses_are_compressed_when_the_client_accepts_it(
    accept: str, encoding: bytes, decompress: Callable[[bytes], bytes]
) -> None:
    request = parse_json(
        {"id": "7", "inputs": [fp32_input(binary=False)], "parameters": {"binary_data_output": True}}
    )
    plain, plain_headers = encode({"OUTPUT0": np.ones((1, 16), np.float32)}, request)
    body, headers = encode({"OUTPUT0": np.ones((1, 16), np.float32)}, request, accept_encoding=accept)

    assert decompress(body) == plain
    assert headers == {**plain_headers, b"content-encoding": encoding}
    assert client_result(body, headers).as_numpy("OUTPUT0").tolist() == [[1.0] * 16]

@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), encoding=st.sampled_from(["gzip", "deflate", "br", "identity"]))
def test_garbage_compressed_bodies_only_raise_nereid_errors(data: bytes, encoding: str) -> None:
    try:
        compression.decode_body(data, encoding, max_size=1000)
    except NereidError:
        pass
