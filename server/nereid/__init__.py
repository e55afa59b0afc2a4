"""nereid: a Python model server that speaks Triton's HTTP protocol.

This module is the public API for model authors and embedders: the version, the
``ModelContext`` a model receives, and the error classes (``MetricError``: a custom
metric misused). It is cheap to import (no web framework); the server itself lives in
``nereid.server``, and ``nereid.serve()`` (the ``nereid serve`` command from a script) in
``nereid.cli``, both imported on first use.
"""

from nereid.context import ModelContext
from nereid.custom_metrics import MetricError
from nereid.inference import FINISHED
from nereid.errors import (
    ConfigError,
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelExecutionError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    NereidError,
    QueueFullError,
    RequestCancelledError,
    RequestTimeoutError,
    UnavailableError,
    UnsupportedError,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ``nereid.batch`` (the decorator) is imported on first use, so that a model file's
    # ``import nereid`` stays cheap.
    if name in ("batch", "BatchedFunction"):
        from nereid.scheduling import decorator as batched

        return getattr(batched, name)
    if name == "Server":
        from nereid.server import Server

        return Server
    if name == "serve":
        from nereid.cli import serve

        return serve
    raise AttributeError(f"module 'nereid' has no attribute {name!r}")


__all__ = [
    "__version__",
    "FINISHED",
    "batch",
    "BatchedFunction",
    "Server",
    "serve",
    "ModelContext",
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
    "RequestCancelledError",
    "InternalError",
    "MetricError",
]
