"""One replica of nereid on Ray Serve: a whole nereid Server (its app and manager) as the
deployment's ASGI ingress, its reports to the cluster actor, the routes that answer for
the whole cluster (readiness, statistics, explicit load/unload), and the deployment's
gRPC methods for Triton's service through Ray's gRPC proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, MutableMapping

from nereid.options import ServerOptions
from nereid.ray.cluster import CLUSTER_NAME, NAMESPACE
from nereid.ray.merge import merge_statistics

__all__ = ["Replica", "add_triton_service_to_server", "grpc_methods"]

_log = logging.getLogger("nereid")

_REPORT_EVERY_S = 0.5
#: how long a load/unload waits for every replica to apply it
_CONTROL_TIMEOUT_S = 300.0


#: This process's replica: what the deployment's gRPC methods call into. Ray runs each
#: replica in a process of its own and pickles those methods by value (they can hold no
#: reference to it), so this one module attribute is how they find it; a Server in a
#: process that is no replica never sets it.
_current: Replica | None = None


class Replica:
    """One replica's nereid: a Server's app and manager, its reports to the cluster, and
    the routes that answer for the whole cluster."""

    def __init__(self, options: ServerOptions) -> None:
        global _current
        from nereid.server import Server

        _picklable_messages()
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.server = Server(options)
        self._grpc: Any = None
        _current = self
        self.manager = self.server.manager
        self.app = self.server.app
        self.applied = 0
        self.errors: dict[str, str] = {}
        self.cluster: Any = None
        self._reporter: asyncio.Task[None] | None = None
        #: one report at a time: the periodic one and a load's own must not both apply
        #: the same pending operation
        self._reporting: asyncio.Lock | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] == "http":
            answer = await self._cluster_route(scope, receive)
            if answer is not None:
                await _send_json(send, *answer, replica=self.id)
                return
            await self.app(scope, receive, _tagged(send, self.id))
            return
        await self.app(scope, receive, send)

    async def _lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        import ray

        self.server.bind_bls()
        self.cluster = ray.get_actor(CLUSTER_NAME, namespace=NAMESPACE)

        async def started(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                self._reporter = asyncio.create_task(self._report_forever())
            await send(message)

        await self.app(scope, receive, started)
        if self._reporter is not None:
            self._reporter.cancel()

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.report()
            except Exception:  # the cluster actor restarting: try again next time
                _log.exception("ray: could not report to the cluster")
            await asyncio.sleep(_REPORT_EVERY_S)

    async def report(self) -> None:
        """Tell the cluster this replica's statistics and states; apply what it has not yet."""
        if self._reporting is None:
            self._reporting = asyncio.Lock()
        async with self._reporting:
            await self._report()

    async def _report(self) -> None:
        from nereid.models import admin

        report = {
            "stats": admin.model_statistics(self.manager, None, None),
            "metrics": self.server.metrics.render().decode(),
            "unfit": self.manager.unfit_models(),
            "serving": self.manager.ready_models(),
            "startup_done": self.manager.startup_done,
            "ready": self.manager.is_ready(self.server.options.strict_readiness),
            "applied": self.applied,
            "errors": dict(self.errors),
        }
        pending = await self.cluster.report.remote(self.id, report)
        for operation in pending:
            await self._apply(operation)

    async def _apply(self, operation: dict[str, Any]) -> None:
        from nereid.models import admin
        from nereid.errors import NereidError

        self.applied += 1
        try:
            if operation["action"] == "load":
                await admin.load_model(self.manager, operation["name"], operation["parameters"])
            else:
                await admin.unload_model(self.manager, operation["name"], operation["parameters"])
        except NereidError as exc:
            self.errors[str(self.applied)] = exc.message

    async def _cluster_route(self, scope: dict[str, Any], receive: Any) -> tuple[int, Any] | None:
        """The answer of a route that speaks for every replica, or None for the app."""
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v2/health/ready":
            return (200, None) if await self._cluster_ready() else (400, None)
        if method == "GET" and (path == "/v2/models/stats" or path.endswith("/stats")):
            return await self._statistics(path)
        parts = path.strip("/").split("/")
        if method == "POST" and len(parts) == 5 and parts[:3] == ["v2", "repository", "models"] \
                and parts[4] in ("load", "unload") and self.manager.mode == "explicit":
            body = await _read_body(receive)
            return await self._control(parts[4], parts[3], body)
        return None

    async def _cluster_ready(self) -> bool:
        live = await self.cluster.live.remote()
        if not live or not all(report["startup_done"] for report in live.values()):
            return False
        if not self.server.options.strict_readiness:
            return any(report["ready"] for report in live.values())
        # every model some replica waits for is served by another (a replica still
        # loading, or one whose load failed, is covered by one that serves it)
        serving = {name for report in live.values() for name in report["serving"]}
        return all(name in serving for report in live.values() for name in report["unfit"])

    async def _statistics(self, path: str) -> tuple[int, Any]:
        from nereid.models import admin
        from nereid.errors import NereidError

        parts = path.strip("/").split("/")
        name = parts[2] if len(parts) >= 4 else None
        version = parts[4] if len(parts) == 6 else None
        live = await self.cluster.live.remote()
        live[self.id] = {"stats": admin.model_statistics(self.manager, None, None)}  # its own, fresh
        merged = merge_statistics([report["stats"] for report in live.values()])
        if name is None:
            return 200, merged
        entries = [e for e in merged["model_stats"] if e["name"] == name]
        if not entries:
            return 400, {"error": f"requested model '{name}' is not available"}
        if version is not None:
            try:
                number = admin.parse_version(version)
            except NereidError as exc:
                return 400, {"error": exc.message}
            entries = [e for e in entries if e["version"] == str(number)]
            if not entries:
                return 400, {"error": f"requested model version is not available for model '{name}'"}
        return 200, {"model_stats": entries}

    async def _control(self, action: str, name: str, body: bytes) -> tuple[int, Any]:
        """A load or unload for every replica: logged with the cluster, applied by each
        (this one at once), answered when all have, with the first error any had."""
        try:
            parameters = json.loads(body).get("parameters", {}) if body else {}
        except (ValueError, AttributeError):
            return 400, {"error": "failed to parse the request JSON buffer"}
        sequence = await self.cluster.add_operation.remote(
            {"action": action, "name": name, "parameters": parameters if isinstance(parameters, dict) else {}}
        )
        deadline = time.monotonic() + _CONTROL_TIMEOUT_S
        while time.monotonic() < deadline:
            await self.report()
            done, errors = await self.cluster.outcome.remote(sequence)
            if done:
                return (400, {"error": errors[0]}) if errors else (200, None)
            await asyncio.sleep(0.05)
        return 503, {"error": f"{action} of '{name}' was not applied by every replica within {_CONTROL_TIMEOUT_S:.0f} s"}


    @property
    def grpc(self) -> Any:
        """This replica's InferenceService (Triton's gRPC service), made on first use."""
        if self._grpc is None:
            from nereid.grpc.service import InferenceService

            self._grpc = InferenceService(self.manager, self.server.options, self.server.shm)
        return self._grpc


def add_triton_service_to_server(servicer: Any, server: Any) -> None:
    """What Ray's gRPC proxy imports (``grpc_servicer_functions``): Triton's service, with
    its messages picklable first (Ray pickles each request on its way to a replica)."""
    from tritonclient.grpc import service_pb2_grpc

    _picklable_messages()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def _picklable_messages() -> None:
    """tritonclient's generated messages name their modules ``grpc_service_pb2`` and
    ``model_config_pb2``, which no import finds: pickling one (Ray does) needs them there."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    sys.modules.setdefault(service_pb2.ModelInferRequest.__module__, service_pb2)
    sys.modules.setdefault(model_config_pb2.ModelConfig.__module__, model_config_pb2)


def grpc_methods() -> dict[str, Any]:
    """The deployment's methods for every RPC of Triton's service: each runs the replica's
    InferenceService; an abort becomes the status and message on Ray's gRPC context (and
    an empty response). ModelStreamInfer is bidirectional (Ray's gRPCInputStream). The
    functions hold names only (Ray pickles the class; protobuf's classes do not pickle)."""
    from tritonclient.grpc import service_pb2

    descriptor = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods: dict[str, Any] = {}
    for method in descriptor.methods:
        if method.client_streaming:
            methods[method.name] = _streaming_rpc(method.name)
        else:
            methods[method.name] = _unary_rpc(method.name, method.output_type.name)
    return methods


def _this_replica() -> Replica:
    """This process's replica (read from the module: the RPC functions travel to the
    replica pickled by value, with a copy of the globals they name)."""
    from nereid.ray import replica

    assert replica._current is not None, "no nereid replica in this process"
    return replica._current


def _unary_rpc(name: str, response_name: str) -> Any:
    async def call(self: Any, request: Any, grpc_context: Any = None) -> Any:
        from tritonclient.grpc import service_pb2

        from nereid.grpc.service import AbortContext, CallAborted

        try:
            return await getattr(_this_replica().grpc, name)(request, AbortContext())
        except CallAborted as aborted:
            grpc_context.set_code(aborted.code)
            grpc_context.set_details(aborted.message)
            return getattr(service_pb2, response_name)()

    call.__name__ = name
    return call


def _streaming_rpc(name: str) -> Any:
    async def call(self: Any, request_stream: Any, grpc_context: Any = None) -> Any:
        from nereid.grpc.service import AbortContext, CallAborted

        context = AbortContext()
        try:
            async for response in getattr(_this_replica().grpc, name)(request_stream, context):
                yield response
        except CallAborted:
            pass
        if context.aborted is not None:  # raised here, or in the stream's reader
            grpc_context.set_code(context.aborted.code)
            grpc_context.set_details(context.aborted.message)

    call.__name__ = name
    return call


def _tagged(send: Any, replica: str) -> Any:
    header = (b"nereid-replica", replica.encode())

    async def tagged(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", []), header])
        await send(message)

    return tagged


async def _send_json(send: Any, status: int, body: Any, *, replica: str) -> None:
    data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = [(b"content-length", str(len(data)).encode()), (b"nereid-replica", replica.encode())]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)
