"""Content-Encoding both ways (protocol.md §3.8): inflating a gzip/deflate request body
within the size limit, choosing the response compression an ``Accept-Encoding`` asks
for, and compressing a response body."""

from __future__ import annotations

import functools
import math
import re
import zlib
from typing import Any

from nereid.errors import InvalidInputError, UnsupportedError

__all__ = ["ENCODING_HEADERS", "compress", "decode_body", "parse_accept_encoding"]

#: The ``content-encoding`` response header of each compression.
ENCODING_HEADERS = {"gzip": (b"content-encoding", b"gzip"), "deflate": (b"content-encoding", b"deflate")}


def decode_body(body: bytes, content_encoding: str | None, *, max_size: int) -> bytes:
    """The request body after ``Content-Encoding`` (§3.8).

    ``identity``, empty or None: returned as is. ``gzip`` / ``deflate`` (exact, case
    sensitive, as Triton): inflated with zlib/gzip auto-detection, streaming, never past
    ``max_size`` bytes (a zip bomb costs at most ``max_size + 1`` bytes). Anything else:
    UnsupportedError "Unsupported compression type" (the HTTP layer adds Triton's
    ``Accept-Encoding: gzip, deflate`` header).
    """
    if not content_encoding or content_encoding == "identity":
        return body
    if content_encoding != "gzip" and content_encoding != "deflate":
        raise UnsupportedError("Unsupported compression type")
    if not body:
        raise InvalidInputError(
            f"request body with Content-Encoding '{content_encoding}' is empty: nothing to be decompressed"
        )
    inflater = zlib.decompressobj(47)  # 32 + 15: accept both zlib and gzip framing
    parts: list[bytes] = []
    size = 0
    pending: bytes = body
    try:
        # In steps: a body past the limit is refused holding only what was inflated (one
        # call would gather blocks and join them, twice the limit at its peak).
        while size <= max_size:
            step = min(_INFLATE_STEP, max_size + 1 - size)
            part = inflater.decompress(pending, step)
            parts.append(part)
            size += len(part)
            pending = inflater.unconsumed_tail
            if inflater.eof or (not pending and len(part) < step):
                break  # the end, or all input taken and no output held back
    except zlib.error as exc:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': {exc}"
        ) from None
    if size > max_size:
        parts.clear()
        raise InvalidInputError(
            f"request body of more than {max_size} bytes exceeds the maximum allowed size "
            f"({max_size} bytes, --max-request-size)"
        )
    if not inflater.eof:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': "
            "the compressed data is truncated"
        )
    if inflater.unused_data:
        raise InvalidInputError(
            f"failed to decompress the request body with Content-Encoding '{content_encoding}': "
            f"{len(inflater.unused_data)} unexpected bytes after the end of the compressed data"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)


#: How much ``decode_body`` inflates per step.
_INFLATE_STEP = 4 << 20

_STRTOD = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=64)
def parse_accept_encoding(value: str | None) -> str | None:
    """The response compression Triton picks for an ``Accept-Encoding`` value (§3.8).

    Comma list; ``;q=`` weights (C ``stod`` prefix parse, bad weights skip the entry);
    only ``identity``, ``gzip``, ``deflate`` count; the highest weight wins and ties go to
    the first listed. Returns "gzip", "deflate" or None (identity). Memoised: clients
    send the same few values over and over.
    """
    if not value:
        return None
    best = "identity"
    best_weight = 0.0
    for entry in value.split(","):
        start = len(entry) - len(entry.lstrip(" "))
        weight_pos = entry.find(";q=")
        if start == len(entry) or (weight_pos != -1 and start >= weight_pos):
            continue
        coding = entry[start:] if weight_pos == -1 else entry[start:weight_pos]
        weight = 1.0
        if weight_pos != -1:
            match = _STRTOD.match(entry, weight_pos + 3)
            if match is None:
                continue
            weight = float(match.group(1))
            if math.isinf(weight) and "inf" not in match.group(1).lower():
                continue  # stod: out_of_range
        if coding in ("identity", "deflate", "gzip") and weight > best_weight:
            best, best_weight = coding, weight
    return None if best == "identity" else best


def compress(parts: list[Any], encoding: str) -> bytes:
    """``parts`` joined and compressed with ``encoding`` ("gzip" or "deflate")."""
    compressor = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    compressed = [compressor.compress(part) for part in parts]
    compressed.append(compressor.flush())
    return b"".join(compressed)
