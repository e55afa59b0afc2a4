"""The handlers of Triton's HTTP endpoints: health, metadata, config, stats, repository,
and the infer fast path.

Owns request/response handling per endpoint. Reaches running models only through
ModelManager's public methods; parsing and encoding of tensors belong to codec.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any, Awaitable, Callable, Iterable, MutableMapping, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from nereid import __version__
from nereid.config import config_from_triton_json
from nereid.errors import (
    InternalError,
    InvalidInputError,
    MalformedRequestError,
    ModelNotFoundError,
    NereidError,
    UnavailableError,
    UnsupportedError,
)
from nereid.http import codec, infer_response
from nereid.http._asgi import ClientGone, error_parts, read_body, send_error
from nereid.http.errors import error_json, status_for
from nereid.inference import InferResult
from nereid.model_manager import ModelManager, ServingModel, Ticket
from nereid.options import ServerOptions
from nereid.repository import check_model_name
from nereid.shared_memory import SharedMemoryManager

__all__ = ["Endpoints", "EXTENSIONS", "InferHeaders", "Responder"]

_log = logging.getLogger("nereid")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

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
_MAX_VERSION = (1 << 63) - 1


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=_JSON)


def error_response(error: NereidError) -> Response:
    return Response(error_json(error.message), status_code=status_for(error), media_type=_JSON)


def empty_response(status: int = 200) -> Response:
    return Response(b"", status_code=status, media_type="text/plain")


def parse_version(value: str | int | None) -> int | None:
    """A URL version segment (digits only, checked by the router) -> int; None when absent."""
    if value is None or value == "":
        return None
    version = int(value)
    if version > _MAX_VERSION:
        raise InvalidInputError(f"failed to get model version from specified version string '{value}'")
    return version


class Endpoints:
    """Handlers bound to one ModelManager and ServerOptions."""

    def __init__(
        self, manager: ModelManager, options: ServerOptions, shm: SharedMemoryManager | None = None
    ) -> None:
        self.manager = manager
        self.options = options
        self._shm = shm if shm is not None else SharedMemoryManager()
        # One codec (lookup tables, header memo) per served model version; dropped with it.
        self._codecs: weakref.WeakKeyDictionary[ServingModel, codec.ModelCodec] = weakref.WeakKeyDictionary()
        # the last one asked for (a weak reference: it must not keep an unloaded model alive)
        self._last_codec: tuple[weakref.ref[ServingModel], codec.ModelCodec] | None = None

    def _codec(self, serving: ServingModel) -> codec.ModelCodec:
        last = self._last_codec
        if last is not None and last[0]() is serving:
            return last[1]
        found = self._codecs.get(serving)
        if found is None:
            found = self._codecs[serving] = codec.ModelCodec.for_config(serving.config)
        self._last_codec = (weakref.ref(serving), found)
        return found

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
            self._serving(request)
        except (ModelNotFoundError, UnavailableError):
            return error_response(InvalidInputError("Model version not ready"))
        except NereidError as exc:
            return error_response(exc)
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
        return json_response({"model_stats": [s.stats.snapshot() for s in self.manager.serving_models()]})

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
        return json_response({"model_stats": [s.stats.snapshot() for s in versions]})

    # -- repository ----------------------------------------------------------------------

    async def repository_index(self, request: Request) -> Response:
        body = await request.body()
        ready_only = False
        if body.strip():
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                return error_response(MalformedRequestError(f"failed to parse the request JSON buffer: {exc}"))
            if not isinstance(obj, dict):
                return error_response(MalformedRequestError("failed to parse the request JSON buffer: expected an object"))
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

    def _control_refused(self, request: Request) -> Response | None:
        """The error answer to a load/unload this server does not take (a named repository,
        or a control mode other than explicit); None when it may go ahead."""
        if "repo" in request.path_params:
            return error_response(UnsupportedError("'repository_name' specification is not supported"))
        if self.manager.mode != "explicit":
            # Triton's text for both NONE and POLL mode (model_repository_manager.cc).
            return error_response(UnavailableError("explicit model load / unload is not allowed if polling is enabled"))
        return None

    async def repository_load(self, request: Request) -> Response:
        refused = self._control_refused(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        try:
            check_model_name(name)  # before anything touches the filesystem
            params = _parse_parameters(await request.body())
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
        return empty_response(200)

    async def repository_unload(self, request: Request) -> Response:
        refused = self._control_refused(request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        try:
            check_model_name(name)
            params = _parse_parameters(await request.body())
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

    # -- infer (the hot path) --------------------------------------------------------------

    async def infer(self, scope: Scope, receive: Receive, send: Send, name: str, version_text: str | None) -> None:
        """POST .../infer as a raw ASGI handler (the uvicorn, granian and hypercorn engines)."""
        received_ns = time.monotonic_ns()
        headers = InferHeaders(scope["headers"])
        shm = self._shm.lease()  # pins the shared-memory regions this request uses
        try:
            body = await read_body(receive, headers.content_length, self.options.max_request_size)
            call = self._parse_infer(name, version_text, headers, body, shm)
            outputs = await _infer_watching_disconnect(call.serving, call.request, received_ns, receive)
            status, response_headers, payload = call.respond(outputs)
        except NereidError as exc:
            await send_error(send, exc)
            return
        except ClientGone:
            return
        finally:
            shm.release()
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})

    def start_infer(
        self,
        name: str,
        version_text: str | None,
        headers: InferHeaders,
        body: bytes,
        received_ns: int,
        responder: Responder,
    ) -> Ticket | None:
        """POST .../infer for a callback-driven engine (the native one): the request is
        parsed and queued now, and ``responder`` is called once, on the loop, when its
        answer is ready (at once for a bad request). Returns the ticket to withdraw if the
        client goes away first (None when already answered). Never raises. ``headers`` may
        be shared by requests that repeat the same header lines."""
        shm = self._shm.lease()
        try:
            call = self._parse_infer(name, version_text, headers, body, shm)
            call.responder = responder
            ticket = call.serving.submit(call.request, received_ns, call.answer)
        except NereidError as exc:
            shm.release()
            responder.reply(*error_parts(exc))
            return None
        except Exception as exc:  # a bug must cost one request, not the connection
            shm.release()
            _log.exception("infer on model %r failed unexpectedly", name)
            responder.reply(*error_parts(_internal_error(name, exc)))
            return None
        return ticket

    def _parse_infer(
        self, name: str, version_text: str | None, headers: InferHeaders, body: bytes, shm: Any
    ) -> _InferCall:
        serving = self.manager.get(name, parse_version(version_text) if version_text is not None else None)
        if serving.config.decoupled:
            raise UnsupportedError("HTTP end point doesn't support models with decoupled transaction policy")
        model_codec = self._codec(serving)
        if headers.content_encoding:
            body = codec.decode_body(body, headers.content_encoding, max_size=self.options.max_request_size)
        request = codec.parse_planned(
            body, headers.header_length, model_codec, name, serving.version, self.options.http_max_input_size
        )
        if request is None:
            request = codec.parse_infer_request(
                body,
                headers.header_length,
                config=model_codec,
                model_name=name,
                model_version=serving.version,
                max_json_size=self.options.http_max_input_size,
                resolve_shm=shm.resolve,
            )
        return _InferCall(name, serving, request, model_codec, headers.accept_encoding, shm)


def _internal_error(model: str, exc: BaseException) -> InternalError:
    """A bug met while answering an infer request: it fails that request, not the server."""
    return InternalError(f"internal error in infer on model '{model}': {exc}")


class Responder(Protocol):
    """How a callback-driven engine (the native one) is handed an infer answer."""

    def reply(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Any answer: its status, headers (without content-length: the engine adds it
        from ``body``) and body."""

    def reply_known(self, headers: tuple[tuple[bytes, bytes], ...], parts: list[Any]) -> None:
        """A 200 answer whose ``headers`` (content-length included) are the same object
        for every answer of its kind (infer_response.known_answer), so the engine may
        remember their encoding; the body is ``parts`` joined."""


class InferHeaders:
    """The request headers the infer path reads (names are lowercase, as ASGI gives them).
    Read-only once made: requests with the same header lines may share one."""

    __slots__ = ("header_length", "content_encoding", "accept_encoding", "content_length")

    def __init__(self, raw: Iterable[tuple[bytes, bytes]]) -> None:
        self.header_length = self.content_encoding = self.accept_encoding = None
        self.content_length: bytes | None = None
        for key, value in raw:
            if key == b"inference-header-content-length":
                self.header_length = value.decode("latin-1")
            elif key == b"content-encoding":
                self.content_encoding = value.decode("latin-1")
            elif key == b"accept-encoding":
                self.accept_encoding = value.decode("latin-1")
            elif key == b"content-length":
                self.content_length = value


class _InferCall:
    """One parsed infer request on its way through the model; ``respond`` encodes its
    outputs as (status, headers, body)."""

    __slots__ = ("name", "serving", "request", "codec", "accept_encoding", "shm", "responder")

    def __init__(
        self, name: str, serving: ServingModel, request: Any, model_codec: codec.ModelCodec,
        accept_encoding: str | None, shm: Any,
    ) -> None:
        self.name = name
        self.serving = serving
        self.request = request
        self.codec = model_codec
        self.accept_encoding = accept_encoding
        self.shm = shm
        self.responder: Responder | None = None  # set for a callback-driven engine (start_infer)

    def answer(self, outputs: Any, error: BaseException | None) -> None:
        """The answer of a submitted request: ``responder`` gets its response, or its
        error; nothing when it was withdrawn (the client is gone)."""
        responder = self.responder
        assert responder is not None
        reply = responder.reply
        try:
            if error is None:
                known = None
                if self.accept_encoding is None or infer_response.parse_accept_encoding(self.accept_encoding) is None:
                    try:
                        known = infer_response.known_answer(self.request, outputs, self.codec, self.serving.version)
                    except Exception:  # noqa: BLE001 - the full encoder below reports it properly
                        known = None
                if known is not None:
                    responder.reply_known(*known)
                else:
                    reply(*self.respond(outputs))
            elif isinstance(error, asyncio.CancelledError):
                return
            elif isinstance(error, NereidError):
                reply(*error_parts(error))
            else:
                reply(*error_parts(_internal_error(self.name, error)))
        except NereidError as exc:  # encoding the response failed
            reply(*error_parts(exc))
        finally:
            self.shm.release()

    def respond(self, outputs: Any) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        serving = self.serving
        result = InferResult(self.name, serving.version, outputs, self.request.id)
        payload, headers = infer_response.encode_infer_response(
            result, self.request, self.codec, accept_encoding=self.accept_encoding, labels=serving.labels,
            write_shm=self.shm.write,
        )
        headers.append((b"content-length", str(len(payload)).encode()))
        return 200, headers, payload


#: A request still waiting after this long starts watching for its client going away
#: (a task per request costs more than most requests take; a timer handle does not).
_DISCONNECT_WATCH_AFTER_S = 0.02


async def _infer_watching_disconnect(
    serving: ServingModel, request: Any, received_ns: int, receive: Receive
) -> Any:
    """Run the request; if its client disconnects while it waits, cancel it so that it
    leaves the queue unexecuted (the batcher discards cancelled requests)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    def arm() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(_DISCONNECT_WATCH_AFTER_S, arm)
    try:
        return await serving.infer(request, received_ns)
    except asyncio.CancelledError:
        if watcher is not None and watcher.done() and task.cancelling():
            task.uncancel()
            raise ClientGone() from None
        raise
    finally:
        timer.cancel()
        if watcher is not None and not watcher.done():
            watcher.cancel()


def _parse_parameters(body: bytes) -> dict[str, Any]:
    """The ``parameters`` object of a load/unload body (empty body: no parameters)."""
    if not body.strip():
        return {}
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequestError(f"failed to parse the request JSON buffer: {exc}") from exc
    if not isinstance(obj, dict):
        raise MalformedRequestError("failed to parse the request JSON buffer: expected an object")
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInputError("Unable to parse 'parameters': expected an object")
    return params
