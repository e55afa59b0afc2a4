"""The NereidError tree: one class per meaning, each carrying its subject.

Owns error classes and their messages only. Knows nothing about HTTP: the status code
for each class is chosen in exactly one table, ``nereid/http/errors.py``.
"""

from __future__ import annotations

__all__ = [
    "NereidError",
    "ConfigError",
    "ModelLoadError",
    "InvalidInputError",
    "MalformedRequestError",
    "ModelNotFoundError",
    "ModelNotReadyError",
    "UnavailableError",
    "QueueFullError",
    "RequestTimeoutError",
    "UnsupportedError",
    "ModelExecutionError",
    "ExecutionTimeoutError",
    "RequestCancelledError",
    "InternalError",
]


class NereidError(Exception):
    """Base class of every error nereid raises on purpose.

    ``message`` is the complete, user-facing text. Subclasses keep their subject (file,
    key path, model, input) as attributes too, so handlers and tests need not parse text.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(NereidError):
    """A config.toml (or JSON override) that does not validate.

    Reads ``<file>: <key path>: expected <what>, got <value>`` or, for other rules,
    ``<file>: <key path>: <detail>``.
    """

    def __init__(
        self,
        path: str,
        key: str,
        *,
        expected: str | None = None,
        got: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.path = path
        self.key = key
        self.expected = expected
        self.got = got
        if detail is None:
            detail = f"expected {expected}, got {got}"
        self.detail = detail
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + detail)


class ModelLoadError(NereidError):
    """A model that could not be loaded: missing file, import error, bad ``Model`` class,
    exception in ``__init__``, failed warmup. ``reason`` is what the repository index shows."""

    def __init__(self, model: str, reason: str, path: str | None = None) -> None:
        self.model = model
        self.path = path
        self.reason = reason
        super().__init__(reason)


class InvalidInputError(NereidError):
    """A request that is well-formed but does not fit the model (shape, datatype, names,
    sizes, parameters). Triton's INVALID_ARG."""

    def __init__(self, message: str, *, model: str | None = None, input: str | None = None) -> None:
        self.model = model
        self.input = input
        super().__init__(message)


class _AboutModel(NereidError):
    """An error whose subject is a model: ``model`` is its name (None: not known)."""

    def __init__(self, message: str, *, model: str | None = None) -> None:
        self.model = model
        super().__init__(message)


class MalformedRequestError(NereidError):
    """A body that cannot be parsed (bad JSON, wrong JSON types). Triton reports these as
    INTERNAL, so they map to 500 for compatibility."""


class ModelNotFoundError(_AboutModel):
    """Unknown model, or unknown / unavailable version (Triton's NOT_FOUND)."""


class UnavailableError(NereidError):
    """The server or model cannot take the request now (Triton's UNAVAILABLE)."""


class ModelNotReadyError(_AboutModel, UnavailableError):
    """A specific version exists but is not READY."""


class QueueFullError(UnavailableError):
    """The model's queue holds ``max_queue_size`` requests already."""


class RequestTimeoutError(UnavailableError):
    """A request waited in the queue past its timeout (queue policy REJECT)."""


class UnsupportedError(NereidError):
    """A feature the server does not offer for this request (Triton's UNSUPPORTED)."""


class ModelExecutionError(_AboutModel):
    """The model's ``infer`` raised, or returned outputs that do not fit the batch."""


class ExecutionTimeoutError(_AboutModel):
    """A batch ran past the model's ``execution_timeout_ms``: its requests fail (500),
    never retried (each would wait out the limit again)."""


class RequestCancelledError(NereidError):
    """The client went away, or the request was cancelled before it ran."""


class InternalError(NereidError):
    """A bug or an unexpected state inside nereid."""
