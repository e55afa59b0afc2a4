"""nereid: a Python model server that speaks Triton's HTTP protocol.

This module is the public API for model authors and embedders: the version, the
``ModelContext`` a model receives, and the error classes. It is cheap to import (no web
framework); the server itself lives in ``nereid.server``.
"""

from nereid.context import ModelContext
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

__all__ = [
    "__version__",
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
]
