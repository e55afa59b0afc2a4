"""The bytes the native engine writes ahead of a response body: status lines, heads
(Content-Length or chunked, ``connection: close``), the head of a ``reply_repeat`` answer,
and 100 Continue. Pure functions of their arguments; the connection decides when."""

from __future__ import annotations

import http

__all__ = ["CONTINUE", "encode_repeat_head", "response_head", "status_line"]

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (no reason for a status HTTP does not name)."""
    return b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))


_STATUS_LINES = {status: status_line(status) for status in (200, 400, 404, 405, 500, 501, 503)}


def encode_repeat_head(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """The keep-alive 200 head of a ``reply_repeat`` answer (``headers`` hold content-length)."""
    return _STATUS_LINES[200] + b"".join(b"%s: %s\r\n" % pair for pair in headers) + b"\r\n"


def response_head(
    status: int, headers: list[tuple[bytes, bytes]], body_length: int | None, close: bool
) -> tuple[list[bytes], bool]:
    """A response's head as lines to join, and whether its body is chunked: without a
    content-length in ``headers`` it gets ``body_length``, or is chunked when that is None;
    ``connection: close`` when ``close`` (the connection ends after it)."""
    head = [_STATUS_LINES.get(status) or status_line(status)]
    has_length = False
    for name, value in headers:
        head.append(b"%s: %s\r\n" % (name, value))
        if name == b"content-length":
            has_length = True
    chunked = False
    if not has_length:
        if body_length is None:
            chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
        else:
            head.append(b"content-length: %d\r\n" % body_length)
    if close:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    return head, chunked
