"""create_app: the Starlette application serving Triton's HTTP protocol.

Owns routing (Triton's exact rules: full case-sensitive match, 404/405 JSON bodies) and
the lifespan that starts and stops the models. The infer route is a raw ASGI fast path
in front of Starlette's router; every other route is a plain Starlette route.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from nereid.http._asgi import send_json
from nereid.http._asgi import Receive, Scope, Send
from nereid.http.endpoints import Endpoints
from nereid.http.errors import error_json
from nereid.http.generate import GenerateHandler
from nereid.http.operations import Operations
from nereid.model_manager import ModelManager
from nereid.options import ServerOptions
from nereid.shared_memory import SharedMemoryManager

__all__ = ["create_app", "NereidApp"]

_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


class NereidApp:
    """The ASGI application: infer requests go straight to their handler; everything else
    (and lifespan) to the Starlette app. ``starlette`` is exposed for embedding."""

    def __init__(self, starlette: Starlette, endpoints: Endpoints) -> None:
        self.starlette = starlette
        self.endpoints = endpoints

    def match_infer(self, path: str) -> tuple[str, str | None] | None:
        """(model name, version text or None) when ``path`` is an infer path."""
        match = _INFER_PATH.fullmatch(path)
        return None if match is None else (match.group(1), match.group(2))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = scope["method"]
            path: str = scope["path"]
            if method == "POST" and path.endswith("/infer"):
                route = self.match_infer(path)
                if route is not None:
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
) -> NereidApp:
    """The ASGI app for one ModelManager. Its lifespan starts the manager (models load in
    the background, so health/live answers at once and ready turns true when they are
    done; then ``on_started`` runs) and closes it on shutdown. ``shm`` holds the
    client-registered shared-memory regions (a fresh manager when not given)."""
    if shm is None:
        shm = SharedMemoryManager()
    endpoints = Endpoints(manager, options, shm=shm)
    e = endpoints
    ops = Operations(manager, options, shm)
    generate = GenerateHandler(manager, options, stream=False)
    generate_stream = GenerateHandler(manager, options, stream=True)
    sys_shm = "/v2/systemsharedmemory"
    cuda_shm = "/v2/cudasharedmemory"
    model = "/v2/models/{name}"
    versioned = "/v2/models/{name}/versions/{version:int}"
    routes = [
        Route("/v2/models/stats", e.all_stats, methods=["GET"]),
        Route("/v2/health/live", e.health_live, methods=["GET"]),
        Route("/v2/health/ready", e.health_ready, methods=["GET"]),
        Route("/v2", e.server_metadata, methods=["GET"]),
        Route(model, e.model_metadata, methods=["GET"]),
        Route(versioned, e.model_metadata, methods=["GET"]),
        Route(model + "/ready", e.model_ready, methods=["GET"]),
        Route(versioned + "/ready", e.model_ready, methods=["GET"]),
        Route(model + "/config", e.model_config, methods=["GET"]),
        Route(versioned + "/config", e.model_config, methods=["GET"]),
        Route(model + "/stats", e.model_stats, methods=["GET"]),
        Route(versioned + "/stats", e.model_stats, methods=["GET"]),
        Route(model + "/infer", _method_not_allowed, methods=["POST"]),
        Route(versioned + "/infer", _method_not_allowed, methods=["POST"]),
        # Raw ASGI apps (GenerateHandler instances): /generate_stream answers server-sent events.
        Route(model + "/generate", generate, methods=["POST"]),
        Route(versioned + "/generate", generate, methods=["POST"]),
        Route(model + "/generate_stream", generate_stream, methods=["POST"]),
        Route(versioned + "/generate_stream", generate_stream, methods=["POST"]),
        Route("/v2/repository/index", e.repository_index, methods=["POST"]),
        Route("/v2/repository/{repo}/index", e.repository_index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", e.repository_load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", e.repository_unload, methods=["POST"]),
        Route("/v2/repository/{repo}/models/{name}/load", e.repository_load, methods=["POST"]),
        Route("/v2/repository/{repo}/models/{name}/unload", e.repository_unload, methods=["POST"]),
        Route("/v2/logging", ops.logging, methods=["GET", "POST"]),
        Route("/v2/trace/setting", ops.trace_setting, methods=["GET", "POST"]),
        Route(model + "/trace/setting", ops.trace_setting, methods=["GET", "POST"]),
        Route(sys_shm + "/status", ops.system_shm_status, methods=["GET"]),
        Route(sys_shm + "/region/{region}/status", ops.system_shm_status, methods=["GET"]),
        Route(sys_shm + "/register", ops.system_shm_register, methods=["POST"]),
        Route(sys_shm + "/region/{region}/register", ops.system_shm_register, methods=["POST"]),
        Route(sys_shm + "/unregister", ops.system_shm_unregister, methods=["POST"]),
        Route(sys_shm + "/region/{region}/unregister", ops.system_shm_unregister, methods=["POST"]),
        Route(cuda_shm + "/status", ops.cuda_shm_status, methods=["GET"]),
        Route(cuda_shm + "/region/{region}/status", ops.cuda_shm_status, methods=["GET"]),
        Route(cuda_shm + "/register", ops.cuda_shm_register, methods=["POST"]),
        Route(cuda_shm + "/region/{region}/register", ops.cuda_shm_register, methods=["POST"]),
        Route(cuda_shm + "/unregister", ops.cuda_shm_unregister, methods=["POST"]),
        Route(cuda_shm + "/region/{region}/unregister", ops.cuda_shm_unregister, methods=["POST"]),
    ]

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
            await manager.close()

    starlette = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception},
    )
    starlette.router.redirect_slashes = False
    return NereidApp(starlette, endpoints)


async def _method_not_allowed(request: Request) -> Response:
    # Reached only when the fast path did not take a POST .../infer (it always does);
    # kept so that GET on an infer path answers 405 as Triton does.
    return Response(error_json("Method Not Allowed"), status_code=405, media_type="application/json")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, exc.detail)
    return Response(error_json(message), status_code=exc.status_code, media_type="application/json")


