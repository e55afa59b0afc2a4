"""create_app: the Starlette application serving Triton's HTTP protocol.

Owns routing (Triton's exact rules: full case-sensitive match, 404/405 JSON bodies), the
lifespan that starts and stops the models, and the last word on errors: an exception that
escapes any handler is logged with its traceback and answered in Triton's JSON shape
(``internal_error_json``), never with a text page. The infer route is a raw ASGI fast
path in front of Starlette's router; every other route is a plain Starlette route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route

from nereid.network.access import Refusals, restriction_table
from nereid.http._asgi import Message, Receive, Scope, Send, send_json
from nereid.http.endpoints import Endpoints, Lookups
from nereid.http.errors import error_json, internal_error_json
from nereid.http.generate import GenerateHandler
from nereid.http.operations import Operations
from nereid.http.restricted import Guard, guarded
from nereid.models.manager import ModelManager
from nereid.options import ServerOptions
from nereid.tensors.shared_memory import SharedMemoryManager

__all__ = ["create_app", "infer_route", "lookup_rows", "NereidApp", "SHADOWING_PATHS", "statistics_rows"]

_log = logging.getLogger("nereid")

#: The scope key that holds the exception _internal_error logged already.
_LOGGED = "nereid.logged_error"

_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


def infer_route(path: str) -> tuple[str, str | None] | None:
    """(model name, version text or None) when ``path`` is an infer path."""
    match = _INFER_PATH.fullmatch(path)
    return None if match is None else (match.group(1), match.group(2))


class NereidApp:
    """The ASGI application: infer requests go straight to their handler; everything else
    (and lifespan) to the Starlette app. ``starlette`` is exposed for embedding.
    ``infer_guard`` checks infer requests when the inference group is restricted (None:
    it is not, and infer requests are not looked at)."""

    def __init__(self, starlette: Starlette, endpoints: Endpoints, infer_guard: Guard | None = None) -> None:
        self.starlette = starlette
        self.endpoints = endpoints
        self.infer_guard = infer_guard

    def match_infer(self, path: str) -> tuple[str, str | None] | None:
        """(model name, version text or None) when ``path`` is an infer path."""
        return infer_route(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.starlette(scope, receive, send)  # lifespan
            return
        started = False  # whether the response began, for an exception that escapes

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._route(scope, receive, tracked_send)
        except ClientDisconnect:  # left before its request body was read: nobody to answer
            return
        except Exception as exc:  # a bug: it costs this request, in Triton's JSON shape
            if scope.pop(_LOGGED, None) is not exc:
                _log_internal_error(scope, exc)
            if not started:
                await send_json(send, 500, internal_error_json(_what(scope), exc))
            # Else it was answered by _internal_error (Starlette's handler, which then
            # re-raises), or it was cut short and cannot be answered any more: returning
            # unfinished makes the server close the connection.

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        path: str = scope["path"]
        if method == "POST" and path.endswith("/infer"):
            route = self.match_infer(path)
            if route is not None:
                guard = self.infer_guard
                if guard is not None and not guard.allows(scope["headers"]):
                    await send_json(send, guard.refusal[0], guard.refusal[2])
                    return
                await self.endpoints.infer(scope, receive, send, *route)
                return
        elif method == "HEAD" or method == "OPTIONS":
            # Triton answers only GET/POST (Starlette would serve HEAD for GET routes):
            # 405 on a known route, and like any other method 404 on an unknown path.
            if any(route.matches(scope)[0] is not Match.NONE for route in self.starlette.router.routes):
                await send_json(send, 405, error_json("Method Not Allowed"))
            else:
                await send_json(send, 404, error_json("Not Found"))
            return
        await self.starlette(scope, receive, send)


def create_app(
    manager: ModelManager,
    options: ServerOptions,
    *,
    on_started: Callable[[], Awaitable[None] | None] | None = None,
    shm: SharedMemoryManager | None = None,
    refusals: Refusals | None = None,
) -> NereidApp:
    """The ASGI app for one ModelManager. Its lifespan starts the manager (models load in
    the background, so health/live answers at once and ready turns true when they are
    done; then ``on_started`` runs) and closes it on shutdown. ``shm`` holds the
    client-registered shared-memory regions (a fresh manager when not given). The groups
    of ``options.http_restricted_api`` need their key (ValueError when a group is in two);
    ``refusals`` counts the requests refused."""
    if shm is None:
        shm = SharedMemoryManager()
    restrictions = restriction_table(options.http_restricted_api, "--http-restricted-api")
    counted = refusals if refusals is not None else Refusals()
    guards = {group: Guard(group, restriction, counted) for group, restriction in restrictions.items()}
    endpoints = Endpoints(manager, options, shm=shm)
    rows = _route_rows(endpoints, Operations(manager, options, shm), manager, options)
    routes = [Route(path, guarded(handler, guards.get(group)), methods=methods) for path, handler, group, methods in rows]
    starlette = Starlette(
        routes=routes,
        lifespan=_lifespan(manager, endpoints, on_started),
        exception_handlers={HTTPException: _http_exception, Exception: _internal_error},
    )
    starlette.router.redirect_slashes = False
    return NereidApp(starlette, endpoints, guards.get("inference"))


#: One route: path, handler, the restriction group that guards it, methods.
_RouteRow = tuple[str, object, str, list[str]]
_GET, _POST, _GET_POST = ["GET"], ["POST"], ["GET", "POST"]
_MODEL = "/v2/models/{name}"


def _route_rows(e: Endpoints, ops: Operations, manager: ModelManager, options: ServerOptions) -> list[_RouteRow]:
    """Every route but the infer fast path (NereidApp takes that one first)."""
    repository = "model-repository"
    return [
        *statistics_rows(e),  # first: /v2/models/stats before /v2/models/{name}
        *lookup_rows(e),
        *_model_rows(e, manager, options),
        ("/v2/repository/index", e.repository_index, repository, _POST),
        ("/v2/repository/{repo}/index", e.repository_index, repository, _POST),
        ("/v2/repository/models/{name}/load", e.repository_load, repository, _POST),
        ("/v2/repository/models/{name}/unload", e.repository_unload, repository, _POST),
        ("/v2/repository/{repo}/models/{name}/load", e.repository_load, repository, _POST),
        ("/v2/repository/{repo}/models/{name}/unload", e.repository_unload, repository, _POST),
        ("/v2/logging", ops.logging, "logging", _GET_POST),
        ("/v2/trace/setting", ops.trace_setting, "trace", _GET_POST),
        (_MODEL + "/trace/setting", ops.trace_setting, "trace", _GET_POST),
        *_shared_memory_rows(ops),
    ]


#: The paths of the statistics routes that a lookup route's path would also match (a
#: front-end worker that does not answer statistics itself forwards these).
SHADOWING_PATHS = frozenset({"/v2/models/stats"})


def statistics_rows(e: Lookups) -> list[_RouteRow]:
    """The statistics routes: every model's, a model's, one version's. A front-end worker
    answers these itself from the figures the main process publishes (frontends/shared_stats.py)."""
    return [
        ("/v2/models/stats", e.all_stats, "statistics", _GET),
        (_MODEL + "/stats", e.model_stats, "statistics", _GET),
        (_MODEL + "/versions/{version:int}/stats", e.model_stats, "statistics", _GET),
    ]


def lookup_rows(e: Lookups) -> list[_RouteRow]:
    """The routes answered from what the models show, nothing else (``Lookups``' handlers):
    health, server and model metadata, model config. A front-end worker answers these
    itself from its picture of the models (frontends/local_answers.py)."""
    rows: list[_RouteRow] = [
        ("/v2/health/live", e.health_live, "health", _GET),
        ("/v2/health/ready", e.health_ready, "health", _GET),
        ("/v2", e.server_metadata, "metadata", _GET),
    ]
    for tail, handler, group in (
        ("", e.model_metadata, "metadata"),
        ("/ready", e.model_ready, "health"),
        ("/config", e.model_config, "model-config"),
    ):
        rows.append((_MODEL + tail, handler, group, _GET))
        rows.append((_MODEL + "/versions/{version:int}" + tail, handler, group, _GET))
    return rows


def _model_rows(e: Endpoints, manager: ModelManager, options: ServerOptions) -> list[_RouteRow]:
    """Each model route but the lookups, for the model and for one of its versions."""
    rows: list[_RouteRow] = []
    for tail, handler, group, methods in (
        ("/infer", _method_not_allowed, "inference", _POST),
        # Raw ASGI apps (GenerateHandler instances): /generate_stream answers server-sent events.
        ("/generate", GenerateHandler(manager, options, stream=False), "inference", _POST),
        ("/generate_stream", GenerateHandler(manager, options, stream=True), "inference", _POST),
    ):
        rows.append((_MODEL + tail, handler, group, methods))
        rows.append((_MODEL + "/versions/{version:int}" + tail, handler, group, methods))
    return rows


def _shared_memory_rows(ops: Operations) -> list[_RouteRow]:
    """Each shared-memory route, for every region and for one named region."""
    rows: list[_RouteRow] = []
    for root, status, register, unregister in (
        ("/v2/systemsharedmemory", ops.system_shm_status, ops.system_shm_register, ops.system_shm_unregister),
        ("/v2/cudasharedmemory", ops.cuda_shm_status, ops.cuda_shm_register, ops.cuda_shm_unregister),
    ):
        for action, handler, methods in (
            ("/status", status, _GET), ("/register", register, _POST), ("/unregister", unregister, _POST)
        ):
            rows.append((root + action, handler, "shared-memory", methods))
            rows.append((root + "/region/{region}" + action, handler, "shared-memory", methods))
    return rows


def _lifespan(
    manager: ModelManager, endpoints: Endpoints, on_started: Callable[[], Awaitable[None] | None] | None
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Starts the manager in the background (then ``on_started``); on shutdown stops the
    start if still running, the infer endpoint's decoding and the manager."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def start() -> None:
            await manager.start()
            if on_started is not None:
                result = on_started()
                if result is not None:
                    await result

        task = asyncio.create_task(start(), name="nereid-startup")
        try:
            yield
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await endpoints.infer_endpoint.aclose()
            await manager.close()

    return lifespan


async def _method_not_allowed(request: Request) -> Response:
    # Reached only when the fast path did not take a POST .../infer (it always does);
    # kept so that GET on an infer path answers 405 as Triton does.
    return Response(error_json("Method Not Allowed"), status_code=405, media_type="application/json")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, exc.detail)
    return Response(error_json(message), status_code=exc.status_code, media_type="application/json")


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette's last-resort handler: it sends this (when no response has started)
    # instead of its text/plain page, then re-raises to NereidApp. Logged here, before
    # the client has its answer; NereidApp does not log it again.
    if isinstance(exc, ClientDisconnect):  # no bug, and nobody to answer
        return Response(b"", status_code=400)
    _log_internal_error(request.scope, exc)
    body = internal_error_json(_what(request.scope), exc)
    return Response(body, status_code=500, media_type="application/json")


def _log_internal_error(scope: Scope, exc: Exception) -> None:
    scope[_LOGGED] = exc
    _log.error("internal error in %s", _what(scope), exc_info=exc)


def _what(scope: Scope) -> str:
    """What failed, for an internal error's message: the request's method and path."""
    return f"{scope.get('method', '')} {scope.get('path', '')}".strip()
