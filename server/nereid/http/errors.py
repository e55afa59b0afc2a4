"""The one table mapping each NereidError class to an HTTP status (Triton's codes).

Owns status codes and the ``{"error": ...}`` body; messages come from the errors.
"""

from __future__ import annotations

import orjson

from nereid import errors

__all__ = ["status_for", "error_json", "internal_error_json", "internal_error_message"]

# Triton's HttpCodeFromError: INVALID_ARG/UNKNOWN/ALREADY_EXISTS/CANCELLED 400,
# NOT_FOUND 404, UNSUPPORTED 501, UNAVAILABLE 503, INTERNAL 500. JSON parse errors
# are INTERNAL in Triton (500), so MalformedRequestError is too.
_STATUS: tuple[tuple[type[errors.NereidError], int], ...] = (
    (errors.InvalidInputError, 400),
    (errors.ConfigError, 400),
    (errors.RequestCancelledError, 400),
    (errors.ModelNotFoundError, 404),
    (errors.UnsupportedError, 501),
    (errors.UnavailableError, 503),
    (errors.MalformedRequestError, 500),
    (errors.ModelExecutionError, 500),
    (errors.ExecutionTimeoutError, 500),
    (errors.ModelLoadError, 500),
    (errors.InternalError, 500),
)


def status_for(error: errors.NereidError) -> int:
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
