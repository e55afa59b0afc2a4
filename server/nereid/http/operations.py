"""The handlers of Triton's operational extensions: system and CUDA shared memory,
logging settings, and trace settings.

Owns request parsing and responses for those routes. Region bookkeeping belongs to
``nereid.tensors.shared_memory``, log settings to ``nereid.log``; this module only translates.
Messages and status codes are Triton's (protocol.md §1.2 rows 13-20, §1.3.7-1.3.10).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from nereid.errors import (
    InvalidInputError,
    MalformedRequestError,
    ModelNotFoundError,
    NereidError,
    UnavailableError,
    UnsupportedError,
)
from nereid.http.endpoints import empty_response, error_response, json_object, json_response
from nereid.log import LOG_FORMATS, apply_log_settings, log_settings
from nereid.models.manager import ModelManager
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager

__all__ = ["Operations", "CLIENT_SHM_DISABLED"]

_log = logging.getLogger("nereid")

CLIENT_SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
# TritonJson's type errors (Triton answers them with 500, like every JSON error).
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_ARRAY = "attempt to access JSON non-array as array"
_U64_LIMIT = 1 << 64
_U32_MAX = (1 << 32) - 1
_I32_MAX = (1 << 31) - 1



def _trace_defaults() -> dict[str, Any]:
    """Triton's trace settings before any is set (a fresh dict each time: nothing shared)."""
    return {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }
_TRACE_LEVELS = ("TIMESTAMPS", "TENSORS")


class Operations:
    """Handlers bound to one server's shared-memory manager, options and models.

    Trace settings are kept here, per server: nereid accepts and reports them (so
    clients that set them work) but does not write traces.
    """

    def __init__(self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager) -> None:
        self.manager = manager
        self.options = options
        self.shm = shm
        self._trace: dict[str, Any] = _trace_defaults()
        self._model_trace: dict[str, dict[str, Any]] = {}

    # -- system shared memory ----------------------------------------------------------

    async def system_shm_status(self, request: Request) -> Response:
        try:
            regions = self.shm.status(request.path_params.get("region"))
        except NereidError as exc:
            return error_response(exc)
        return json_response([dataclasses.asdict(r) for r in regions])

    async def system_shm_register(self, request: Request) -> Response:
        try:
            name = self._region_to_register(request, "system")
            body = _json_object(await request.body())
            if "key" not in body:
                raise InvalidInputError("Shared memory register request has no 'key' field")
            key = body["key"]
            if not isinstance(key, str):
                raise MalformedRequestError(f"Unable to parse 'key': {_NOT_STRING}")
            offset = _uint(body, "offset", 0)
            if "byte_size" not in body:
                raise InvalidInputError("Shared memory register request has no 'byte_size' field")
            byte_size = _uint(body, "byte_size", 0)
            self.shm.register(name, key, offset, byte_size)
        except NereidError as exc:
            return error_response(exc)
        return empty_response(200)

    async def system_shm_unregister(self, request: Request) -> Response:
        try:
            self._client_shm_allowed()
        except NereidError as exc:
            return error_response(exc)
        name = request.path_params.get("region")
        if name:
            self.shm.unregister(name)
        else:
            self.shm.unregister_all()
        return empty_response(200)

    def _client_shm_allowed(self) -> None:
        if not self.options.allow_client_shm:
            raise UnsupportedError(CLIENT_SHM_DISABLED)

    def _region_to_register(self, request: Request, kind: str) -> str:
        """The region a register request names (``kind``: system or cuda), once client
        shared memory is allowed."""
        self._client_shm_allowed()
        name: str | None = request.path_params.get("region")
        if not name:
            raise InvalidInputError(f"'region name' is necessary to register {kind} shared memory region")
        return name

    # -- CUDA shared memory (answers of a server without GPU support) ------------------

    async def cuda_shm_status(self, request: Request) -> Response:
        name = request.path_params.get("region")
        if name:
            if name in self.shm:
                message = f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
            else:
                message = f"Unable to find cuda shared memory region: '{name}'"
            return error_response(ModelNotFoundError(message))
        return json_response([])

    async def cuda_shm_register(self, request: Request) -> Response:
        try:
            name = self._region_to_register(request, "cuda")
            # torch is imported lazily, off the event loop (its first import takes seconds).
            if await asyncio.to_thread(_cuda_available):
                raise InvalidInputError(
                    f"failed to register CUDA shared memory region: '{name}', CUDA IPC shared memory is not "
                    "supported by nereid (use system shared memory)"
                )
            raise InvalidInputError(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")
        except NereidError as exc:
            return error_response(exc)

    async def cuda_shm_unregister(self, request: Request) -> Response:
        try:
            self._client_shm_allowed()
        except NereidError as exc:
            return error_response(exc)
        return empty_response(200)  # no CUDA region can exist

    # -- logging -----------------------------------------------------------------------

    async def logging(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = _log_changes(_json_object(await request.body()))
            except NereidError as exc:
                return error_response(exc)
            if changes:
                settings = dataclasses.replace(log_settings(), **changes)
                apply_log_settings(settings)
                _log.info("log settings updated: %s", ", ".join(f"{k}={v}" for k, v in changes.items()))
        return json_response(dataclasses.asdict(log_settings()))

    # -- trace settings ----------------------------------------------------------------

    async def trace_setting(self, request: Request) -> Response:
        model = request.path_params.get("name")
        try:
            if model is not None:
                self.manager.get(model)  # 404 unknown model, 503/404 no ready version
            if request.method == "POST":
                changes = _trace_changes(_json_object(await request.body()))
                target = self._trace if model is None else self._model_trace.setdefault(model, {})
                for key, value in changes.items():
                    if value is not None:
                        target[key] = value
                    elif model is None:
                        target[key] = _trace_defaults()[key]
                    else:
                        target.pop(key, None)
        except NereidError as exc:
            return error_response(exc)
        settings = dict(self._trace)
        if model is not None:
            settings.update(self._model_trace.get(model, {}))
        return json_response(settings)


# -- parsing helpers ----------------------------------------------------------------------


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise MalformedRequestError("failed to parse the request JSON buffer: The document is empty. at 0")
    return json_object(body, "expected a JSON object")


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < _U64_LIMIT


def _uint(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if not _is_uint(value):
        raise MalformedRequestError(f"Unable to parse '{key}': {_NOT_UINT}")
    return int(value)


def _log_changes(body: dict[str, Any]) -> dict[str, Any]:
    """The settings a ``POST /v2/logging`` body changes (null = unchanged), all checked
    before any is applied."""
    changes: dict[str, Any] = {}
    if body.get("log_file") is not None:
        raise UnsupportedError("log file location can not be updated through network protocol")
    for key in ("log_info", "log_warning", "log_error"):
        value = body.get(key)
        if value is not None:
            if type(value) is not bool:
                raise MalformedRequestError(f"Unable to parse '{key}': {_NOT_BOOL}")
            changes[key] = value
    level = body.get("log_verbose_level")
    if level is not None:
        if not _is_uint(level):
            raise MalformedRequestError(f"Unable to parse 'log_verbose_level': {_NOT_UINT}")
        changes["log_verbose_level"] = min(level, _I32_MAX)
    fmt = body.get("log_format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise MalformedRequestError(f"Unable to parse 'log_format': {_NOT_STRING}")
        if fmt not in LOG_FORMATS:
            raise UnavailableError(f"invalid argument for --log_format, got: {fmt}")
        changes["log_format"] = fmt
    return changes


def _trace_changes(body: dict[str, Any]) -> dict[str, Any]:
    """The trace settings a POST body sets (None = clear), all checked first."""
    if "trace_file" in body:
        raise UnsupportedError("trace file location can not be updated through network protocol")
    changes: dict[str, Any] = {}
    if "trace_level" in body:
        levels = body["trace_level"]
        if levels is None:
            changes["trace_level"] = None
        else:
            if not isinstance(levels, list):
                raise MalformedRequestError(f"Unable to parse 'trace_level': {_NOT_ARRAY}")
            for level in levels:
                if not isinstance(level, str):
                    raise MalformedRequestError(f"Unable to parse 'trace_level': {_NOT_STRING}")
                if level == "OFF" and len(levels) > 1:
                    raise InvalidInputError("Expect only one trace level 'OFF' is specified")
                if level != "OFF" and level not in _TRACE_LEVELS:
                    raise InvalidInputError(
                        f"Unable to parse 'trace_level': expected OFF, TIMESTAMPS or TENSORS, got '{level}'"
                    )
            if levels:
                changes["trace_level"] = ["OFF"] if levels == ["OFF"] else [l for l in _TRACE_LEVELS if l in levels]
    for key, low, high in (("trace_rate", 0, _U32_MAX), ("trace_count", -1, _I32_MAX), ("log_frequency", 0, _U32_MAX)):
        if key not in body:
            continue
        value = body[key]
        if value is None:
            changes[key] = None
            continue
        if not isinstance(value, str):
            raise MalformedRequestError(f"Unable to parse '{key}': {_NOT_STRING}")
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidInputError(f"Unable to parse '{key}', got: {value}") from None
        if not low <= number <= high:
            raise InvalidInputError(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}")
        changes[key] = str(number)
    return changes


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
