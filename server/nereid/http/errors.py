"""The one table mapping each NereidError class to an HTTP status (Triton's codes).

Owns status codes and the ``{"error": ...}`` body; messages come from the errors.
"""

from __future__ import annotations

import orjson

from nereid.errors import (
    ConfigError,
    ExecutionTimeoutError,
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelExecutionError,
    ModelLoadError,
    ModelNotFoundError,
    NereidError,
    RequestCancelledError,
    UnavailableError,
    UnsupportedError,
)

__all__ = ["status_for", "error_json", "internal_error_json", "internal_error_message"]

# Triton's HttpCodeFromError: INVALID_ARG/UNKNOWN/ALREADY_EXISTS/CANCELLED 400,
# NOT_FOUND 404, UNSUPPORTED 501, UNAVAILABLE 503, INTERNAL 500. JSON parse errors
# are INTERNAL in Triton (500), so MalformedRequestError is too.
_STATUS: tuple[tuple[type[NereidError], int], ...] = (
    (InvalidInputError, 400),
    (ConfigError, 400),
    (RequestCancelledError, 400),
    (ModelNotFoundError, 404),
    (UnsupportedError, 501),
    (UnavailableError, 503),
    (MalformedRequestError, 500),
    (ModelExecutionError, 500),
    (ExecutionTimeoutError, 500),
    (ModelLoadError, 500),
    (InternalError, 500),
)


def status_for(error: NereidError) -> int:
    """The HTTP status for an error (500 for anything not in the table)."""
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500


def error_json(message: str) -> bytes:
    """Triton's compact error body ``{"error":"<message>"}``."""
    return orjson.dumps({"error": message})


def internal_error_message(what: str, exc: BaseException) -> str:
    """The message of an unexpected exception (a bug) met while serving ``what``:
    ``internal error in <what>: <ExceptionType>: <message>``."""
    text = str(exc)
    return f"internal error in {what}: {type(exc).__name__}" + (f": {text}" if text else "")


def internal_error_json(what: str, exc: BaseException) -> bytes:
    """``internal_error_message`` as Triton's error body (answered with status 500)."""
    return error_json(internal_error_message(what, exc))
