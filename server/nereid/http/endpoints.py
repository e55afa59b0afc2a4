"""The handlers of Triton's HTTP endpoints: health, metadata, config, statistics, the
model repository, logging, trace settings and shared memory; infer is ``infer.py``'s
(``Endpoints.infer`` and ``Endpoints.start_infer`` are its entry points).

Owns request/response handling per endpoint. Reaches running models only through
ModelManager's public methods.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from nereid import __version__
from nereid.config import config_from_triton_json
from nereid.errors import (
    InvalidInputError,
    MalformedRequestError,
    ModelLoadError,
    ModelNotFoundError,
    NereidError,
    UnavailableError,
    UnsupportedError,
)
from nereid.http.errors import error_json, status_for
from nereid.http.infer import InferEndpoint, InferHeaders, Responder, parse_version
from nereid.model_manager import ModelManager, ServingModel
from nereid.options import ServerOptions
from nereid.repository import check_model_name
from nereid.shared_memory import SharedMemoryManager

__all__ = ["Endpoints", "EXTENSIONS", "InferHeaders", "Responder"]

_log = logging.getLogger("nereid")


#: The protocol extensions nereid implements (GET /v2 lists them).
EXTENSIONS = (
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "logging",
)
# "trace" is left out on purpose: /v2/trace/setting answers in Triton's shape, but no
# traces are written, and listing it would promise them.

_JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=_JSON)


def error_response(error: NereidError) -> Response:
    return Response(error_json(error.message), status_code=status_for(error), media_type=_JSON)


def empty_response(status: int = 200) -> Response:
    return Response(b"", status_code=status, media_type="text/plain")


class Endpoints:
    """Handlers bound to one ModelManager and ServerOptions."""

    def __init__(
        self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager | None = None
    ) -> None:
        self.manager = manager
        self.options = options
        self._shm = shm if shm is not None else SharedMemoryManager()
        self.infer_endpoint = InferEndpoint(manager, options, self._shm)
        #: POST .../infer for the ASGI engines, and for the native engine (see infer.py).
        self.infer = self.infer_endpoint.asgi
        self.start_infer = self.infer_endpoint.start

    # -- health and metadata -----------------------------------------------------------

    async def health_live(self, request: Request) -> Response:
        return empty_response(200)

    async def health_ready(self, request: Request) -> Response:
        return empty_response(200 if self.manager.is_ready(self.options.strict_readiness) else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "nereid", "version": __version__, "extensions": list(EXTENSIONS)})

    def _serving(self, request: Request) -> ServingModel:
        params = request.path_params
        return self.manager.get(params["name"], parse_version(params.get("version")))

    async def model_ready(self, request: Request) -> Response:
        # Triton's HandleModelReady: the core answers "not ready" (not an error) for an
        # unknown model or version and for a version that is not READY, and the handler
        # turns every "not ready" into 400 "Model version not ready". Only a bad version
        # string is its own error.
        try:
            serving = self._serving(request)
        except (ModelNotFoundError, UnavailableError):
            return error_response(InvalidInputError("Model version not ready"))
        except NereidError as exc:
            return error_response(exc)
        if serving.problem is not None:  # loaded, but no instance can serve right now
            return error_response(InvalidInputError("Model version not ready"))
        return empty_response(200)

    async def model_metadata(self, request: Request) -> Response:
        try:
            serving = self._serving(request)
        except NereidError as exc:
            return error_response(exc)
        name = request.path_params["name"]
        if request.path_params.get("version") is not None:
            versions = [str(serving.version)]
        else:
            versions = [str(s.version) for s in self.manager.model_versions(name)]
        config = serving.config
        batch = [-1] if config.max_batch_size > 0 else []
        return json_response(
            {
                "name": name,
                "versions": versions,
                "platform": config.platform or config.backend,
                "inputs": [
                    {"name": t.name, "datatype": t.data_type.wire_name, "shape": batch + list(t.dims)}
                    for t in config.input
                ],
                "outputs": [
                    {"name": t.name, "datatype": t.data_type.wire_name, "shape": batch + list(t.dims)}
                    for t in config.output
                ],
            }
        )

    async def model_config(self, request: Request) -> Response:
        try:
            serving = self._serving(request)
        except NereidError as exc:
            return error_response(exc)
        return json_response(serving.config_json)

    # -- statistics ----------------------------------------------------------------------

    async def all_stats(self, request: Request) -> Response:
        return json_response({"model_stats": [_stats(s) for s in self.manager.serving_models()]})

    async def model_stats(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            version = parse_version(request.path_params.get("version"))
        except NereidError as exc:
            return error_response(exc)
        versions = self.manager.model_versions(name)
        if not versions:
            return error_response(InvalidInputError(f"requested model '{name}' is not available"))
        if version is not None:
            versions = [s for s in versions if s.version == version]
            if not versions:
                return error_response(
                    InvalidInputError(f"requested model version is not available for model '{name}'")
                )
        return json_response({"model_stats": [_stats(s) for s in versions]})

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
        entries = []
        for entry in await self.manager.index(ready_only):
            row: dict[str, Any] = {"name": entry.name}
            if entry.version is not None:
                row["version"] = str(entry.version)
            if entry.state is not None:
                row["state"] = entry.state
            if entry.reason:
                row["reason"] = entry.reason
            entries.append(row)
        return json_response(entries)

    async def _control_request(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The model name and the parameters of a load/unload request. Raises when this
        server does not take it (a named repository, or a control mode other than
        explicit), for a bad model name, and for a bad body."""
        if "repo" in request.path_params:
            raise UnsupportedError("'repository_name' specification is not supported")
        if self.manager.mode != "explicit":
            # Triton's text for both NONE and POLL mode (model_repository_manager.cc).
            raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")
        name: str = request.path_params["name"]
        check_model_name(name)  # before anything touches the filesystem
        return name, _parse_parameters(await request.body())

    async def repository_load(self, request: Request) -> Response:
        try:
            name, params = await self._control_request(request)
            for key, value in params.items():
                if not isinstance(value, str):
                    raise InvalidInputError(
                        f"load of model '{name}': parameter '{key}': expected a JSON string, got {type(value).__name__}"
                    )
                if key.startswith("file:"):
                    raise UnsupportedError(
                        f"load of model '{name}': parameter '{key}' refused: nereid does not accept model files "
                        "over HTTP; put the files in the model repository folder and load the model by name"
                    )
            config = None
            if "config" in params:
                source = f"load request for '{name}' (parameters.config)"
                try:
                    obj = orjson.loads(params["config"])
                except orjson.JSONDecodeError as exc:
                    raise InvalidInputError(f"{source}: failed to parse the JSON text: {exc}") from exc
                if not isinstance(obj, dict):
                    raise InvalidInputError(f"{source}: expected a JSON object, got {type(obj).__name__}")
                config = config_from_triton_json(obj, source=source, folder_name=name)
            await self.manager.load(name, config)
        except NereidError as exc:  # ModelLoadError reads "failed to load 'm', <reason>" (500)
            return error_response(exc)
        except OSError as exc:  # the filesystem failed reading the model folder: its words
            model = request.path_params["name"]
            _log.error("failed to load '%s': %s", model, exc)
            return error_response(ModelLoadError(model, f"failed to load '{model}', {exc}"))
        return empty_response(200)

    async def repository_unload(self, request: Request) -> Response:
        try:
            name, params = await self._control_request(request)
            if "unload_dependents" in params and not isinstance(params["unload_dependents"], bool):
                raise InvalidInputError(
                    f"unload of model '{name}': parameter 'unload_dependents': expected a boolean, "
                    f"got {type(params['unload_dependents']).__name__}"
                )
            # unload_dependents is accepted and has nothing to do: nereid has no ensembles.
            await self.manager.unload(name)
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


def _stats(serving: ServingModel) -> dict[str, Any]:
    """A version's entry of Triton's statistics JSON; a model with process instances also
    says how often they were restarted (``instance_restarts``, nereid's)."""
    entry = serving.stats.snapshot()
    if serving.has_process_instances:
        entry["instance_restarts"] = serving.restarts
    return entry
