"""The handlers of Triton's HTTP endpoints: health, metadata, config, statistics, the
model repository, logging, trace settings and shared memory; infer is ``infer.py``'s
(``Endpoints.infer`` and ``Endpoints.start_infer`` are its entry points).

Owns request/response handling per endpoint. Reaches running models only through
ModelManager's public methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from nereid.models import admin
from nereid.errors import InvalidInputError, MalformedRequestError, ModelLoadError, NereidError
from nereid.http.errors import error_json, status_for
from nereid.http.infer import InferEndpoint, InferHeaders, Responder
from nereid.models.directory import Lookup, StatsSource
from nereid.models.manager import ModelManager
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager

__all__ = ["Endpoints", "InferHeaders", "Lookups", "Responder"]

_log = logging.getLogger("nereid")


_JSON = "application/json"
#: what an admin look-up reads: the manager, or (health, metadata, config) a Lookup, or
#: (statistics) a StatsSource
_Source = TypeVar("_Source", ModelManager, Lookup, StatsSource)


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=_JSON)


def error_response(error: NereidError) -> Response:
    return Response(error_json(error.message), status_code=status_for(error), media_type=_JSON)


def empty_response(status: int = 200) -> Response:
    return Response(b"", status_code=status, media_type="text/plain")


class Lookups:
    """The handlers answered from what the models show, nothing else: health, server and
    model metadata, model config, and statistics. ``models`` is the ModelManager, or a
    front-end worker's picture of it (``models.directory``); ``statistics`` the manager, or
    a worker's picture of the figures; the answers are the same bytes either way."""

    def __init__(self, models: Lookup, options: ServerOptions, statistics: StatsSource) -> None:
        self.models = models
        self.options = options
        self.statistics = statistics

    async def health_live(self, request: Request) -> Response:
        return empty_response(200)

    async def health_ready(self, request: Request) -> Response:
        return empty_response(200 if self.models.is_ready(self.options.strict_readiness) else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(admin.server_metadata())

    async def model_ready(self, request: Request) -> Response:
        # Triton's HandleModelReady turns every "not ready" into 400 "Model version not
        # ready" (nereid adds why); only a bad version string is its own error.
        params = request.path_params
        try:
            why = admin.why_not_ready(self.models, params["name"], params.get("version"))
        except NereidError as exc:
            return error_response(exc)
        return empty_response(200) if why is None else error_response(InvalidInputError(f"Model version not ready: {why}"))

    async def model_metadata(self, request: Request) -> Response:
        return _about_model(admin.model_metadata, self.models, request)

    async def model_config(self, request: Request) -> Response:
        return _about_model(admin.model_config, self.models, request)

    async def all_stats(self, request: Request) -> Response:
        return json_response(admin.model_statistics(self.statistics, None, None))

    async def model_stats(self, request: Request) -> Response:
        return _about_model(admin.model_statistics, self.statistics, request)


def _about_model(
    about: Callable[[_Source, str, str | int | None], dict[str, Any]], source: _Source, request: Request
) -> Response:
    """``about`` (an ``admin`` look-up in ``source``) of the model and version the path
    names, as JSON; its error in Triton's shape."""
    params = request.path_params
    try:
        return json_response(about(source, params["name"], params.get("version")))
    except NereidError as exc:
        return error_response(exc)


class Endpoints(Lookups):
    """Handlers bound to one ModelManager and ServerOptions: what each answer holds is
    ``nereid.models.admin``'s; these read the HTTP request and write the HTTP response."""

    def __init__(
        self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager | None = None
    ) -> None:
        super().__init__(manager, options, manager)
        self.manager = manager
        self._shm = shm if shm is not None else SharedMemoryManager()
        self.infer_endpoint = InferEndpoint(manager, options, self._shm)
        #: POST .../infer for the ASGI engines, and for the native engine (see infer.py).
        self.infer = self.infer_endpoint.asgi
        self.start_infer = self.infer_endpoint.start

    # -- repository ----------------------------------------------------------------------

    async def repository_index(self, request: Request) -> Response:
        try:
            obj = _body_object(await request.body())
        except NereidError as exc:
            return error_response(exc)
        ready_only = False
        if "ready" in obj:
            if not isinstance(obj["ready"], bool):
                return error_response(InvalidInputError("Invalid value for 'ready': expected a boolean"))
            ready_only = obj["ready"]
        return json_response(await admin.repository_index(self.manager, ready_only))

    async def repository_load(self, request: Request) -> Response:
        name: str = request.path_params["name"]
        try:
            params = _parse_parameters(await request.body())
            await admin.load_model(self.manager, name, params, request.path_params.get("repo"))
        except NereidError as exc:  # ModelLoadError reads "failed to load 'm', <reason>" (500)
            return error_response(exc)
        except OSError as exc:  # the filesystem failed reading the model folder: its words
            _log.error("failed to load '%s': %s", name, exc)
            return error_response(ModelLoadError(name, f"failed to load '{name}', {exc}"))
        return empty_response(200)

    async def repository_unload(self, request: Request) -> Response:
        try:
            params = _parse_parameters(await request.body())
            await admin.unload_model(self.manager, request.path_params["name"], params, request.path_params.get("repo"))
        except NereidError as exc:
            return error_response(exc)
        return empty_response(200)


def json_object(body: bytes, not_object: str = "expected an object") -> dict[str, Any]:
    """The JSON object a request's body holds; MalformedRequestError in Triton's words
    (``not_object`` for valid JSON that is not an object)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequestError(f"failed to parse the request JSON buffer: {exc}") from exc
    if not isinstance(obj, dict):
        raise MalformedRequestError(f"failed to parse the request JSON buffer: {not_object}")
    return obj


def _body_object(body: bytes) -> dict[str, Any]:
    """The JSON object of a repository request's body (an empty body: no members)."""
    return json_object(body) if body.strip() else {}


def _parse_parameters(body: bytes) -> dict[str, Any]:
    """The ``parameters`` object of a load/unload body (empty body: no parameters)."""
    params = _body_object(body).get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError("Unable to parse 'parameters': expected an object")
    return params
