"""Raw ASGI helpers shared by the hot-path handlers (infer, generate): read a request
body within the size limit, send a JSON (or error) response, notice a departed client.

Owns only these byte-level chores; statuses come from errors.py, messages from errors.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping, Sequence

from nereid.errors import InvalidInputError, NereidError, UnsupportedError
from nereid.http.errors import error_json, status_for

__all__ = [
    "ClientGone", "Message", "Receive", "Scope", "Send", "body_too_large", "check_declared_length", "error_parts",
    "read_body", "send_json", "send_error",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The client disconnected before its request body (or response) was done."""


async def read_body(receive: Receive, declared_length: bytes | None, limit: int) -> bytes:
    """The whole request body. A declared Content-Length over ``limit`` is refused before
    reading (waiting for a body that is too large, or never comes, holds the request for
    nothing); a body that grows past ``limit`` is refused as soon as it does."""
    check_declared_length(declared_length, limit)
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGone()
    body: bytes = message.get("body", b"")
    size = len(body)
    if size > limit:
        raise body_too_large(limit)
    if not message.get("more_body", False):
        return body  # the common case: one message, no copy
    chunks = [body]
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def check_declared_length(declared_length: bytes | None, limit: int) -> None:
    """Refuse a declared Content-Length over ``limit`` (InvalidInputError)."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        raise InvalidInputError(
            f"request body of {int(declared_length)} bytes exceeds the maximum allowed size "
            f"({limit} bytes, --max-request-size)"
        )


def body_too_large(limit: int) -> InvalidInputError:
    """The error for a body that grew past ``limit`` while arriving."""
    return InvalidInputError(
        f"request body of more than {limit} bytes exceeds the maximum allowed size "
        f"({limit} bytes, --max-request-size)"
    )


async def send_json(send: Send, status: int, body: bytes, extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A complete JSON response with an exact Content-Length."""
    headers = [_JSON, (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def error_parts(error: NereidError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Triton's ``{"error": ...}`` response for an error as (status, headers, body): the
    status for the error's class and, for an unsupported Content-Encoding, the encodings
    nereid accepts."""
    body = error_json(error.message)
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    if isinstance(error, UnsupportedError) and error.message == "Unsupported compression type":
        headers.append((b"accept-encoding", b"gzip, deflate"))
    return status_for(error), headers, body


async def send_error(send: Send, error: NereidError) -> None:
    """``error_parts`` sent as a complete ASGI response."""
    status, headers, body = error_parts(error)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
