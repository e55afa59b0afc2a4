"""Compressed gRPC messages (grpc-encoding gzip or deflate): inflated within a cap.

A compressed message may inflate to no more than the message size limit, nor past what
the server's request budget admits now (``inflate_cap``): a small message that inflates
to gigabytes ("zip bomb") is refused with RESOURCE_EXHAUSTED (``TooLarge``) instead of
being held. The connection inflates small messages on the loop and large ones in a
thread (``INLINE_INFLATE``).
"""

from __future__ import annotations

import zlib

from nereid.network.request_budget import SMALL_REQUEST, RequestBudget

__all__ = ["INLINE_INFLATE", "TooLarge", "inflate", "inflate_cap"]

#: Compressed messages up to this size are inflated on the loop; larger ones in a thread.
INLINE_INFLATE = 8 << 10


class TooLarge(ValueError):
    """A compressed message inflates past what may be held (RESOURCE_EXHAUSTED)."""


def inflate_cap(max_message_size: int, budget: RequestBudget) -> tuple[int, str]:
    """How far a message may inflate, and the flag that says so: the message size limit,
    or what the server's budget admits now."""
    room = max(SMALL_REQUEST, budget.limit - budget.held)
    if room < max_message_size:
        return room, "--max-request-bytes-in-flight"
    return max_message_size, "--grpc-max-message-size"


def inflate(encoding: str | None, message: bytes, cap: tuple[int, str]) -> bytes | BaseException:
    """``message`` inflated (at most ``cap``'s bytes), or the error to answer with."""
    limit, flag = cap
    inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(message, limit + 1)
    except zlib.error as exc:
        return ValueError(f"cannot inflate the {encoding} message: {exc}")
    if len(out) > limit or inflater.unconsumed_tail:
        return TooLarge(f"Received message larger than max (inflated past {limit} bytes, {flag})")
    return out
