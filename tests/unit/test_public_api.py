"""nereid's public API is the small set in ``nereid.__all__``: pinned here, so that a
change to it is a decision, and cheap to import (no web framework, no torch)."""

from __future__ import annotations

import subprocess
import sys

import nereid

PUBLIC = [
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


def test_the_public_api_is_pinned() -> None:
    assert nereid.__all__ == PUBLIC


def test_every_public_name_resolves() -> None:
    for name in PUBLIC:
        assert getattr(nereid, name) is not None, name
    assert issubclass(nereid.InvalidInputError, nereid.NereidError)


def test_importing_nereid_loads_no_web_framework_and_no_torch() -> None:
    code = "import sys, nereid; print(sorted(m for m in ('starlette', 'torch', 'orjson', 'httptools') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_no_module_of_the_core_imports_torch() -> None:
    """torch belongs to the example models' extra: every module of the package imports
    without it (torch is imported lazily, where a tensor is moved or converted). Only
    nereid.ray.serve, the ray extra's entry, is left out."""
    code = (
        "import importlib, pkgutil, sys, nereid\n"
        "names = [m.name for m in pkgutil.walk_packages(nereid.__path__, 'nereid.') if m.name != 'nereid.ray.serve']\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names), sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, heavy = result.stdout.strip().split(" ", 1)
    assert int(count) > 50 and heavy == "[]", result.stdout
