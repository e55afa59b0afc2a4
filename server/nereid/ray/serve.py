"""nereid on Ray Serve: the same repository and protocol, served by N replicas.

``nereid serve --ray-replicas N`` (``run_on_ray``) starts or joins a Ray cluster and
deploys ``build_application(options)``: a Ray Serve deployment whose replicas each run a
whole nereid (model manager, dynamic batchers, instances) over the same repository, with
nereid's ASGI app as their ingress behind Ray Serve's HTTP proxy on ``--http-port``.

One server to the client: the replicas report to a ``_Cluster`` actor (every half second:
statistics, metrics, model states, the model-control operations applied), and what must
speak for all of them answers from it: the statistics endpoints and the metrics port (served
by the driver) sum the replicas, ``/v2/health/ready``
is true when every model has a ready replica, and in explicit model-control mode a load
or unload goes to every replica (through the cluster's log of operations) and is answered
once all have applied it. Every response names the replica that answered
(``nereid-replica``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any, Callable, MutableMapping

from nereid.options import ServerOptions

__all__ = ["RAY_MISSING", "build_application", "merge_metrics", "merge_statistics", "run_on_ray", "start_cluster_actor"]

_log = logging.getLogger("nereid")

RAY_MISSING = "Ray Serve is not installed: pip install 'nereid[ray]' (or: pip install 'ray[serve]')"
_CLUSTER = "nereid-cluster"
_NAMESPACE = "nereid"
_REPORT_EVERY_S = 0.5
#: a replica not heard from for this long is taken for gone
_REPLICA_SILENT_S = 5.0
#: how long a load/unload waits for every replica to apply it
_CONTROL_TIMEOUT_S = 300.0


# -- statistics ------------------------------------------------------------------------------


def merge_statistics(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Triton's statistics of several replicas as one server's: per model and version,
    counts and durations summed, ``last_inference`` the latest, batch statistics summed
    per batch size."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for snapshot in snapshots:
        for entry in snapshot.get("model_stats", []):
            key = (entry["name"], entry["version"])
            if key not in merged:
                merged[key] = json.loads(json.dumps(entry))
                continue
            _add(merged[key], entry)
    return {"model_stats": [merged[key] for key in sorted(merged)]}


def _add(total: dict[str, Any], entry: dict[str, Any]) -> None:
    for key, value in entry.items():
        if key in ("name", "version"):
            continue
        if key == "last_inference":
            total[key] = max(total.get(key, 0), value)
        elif key == "batch_stats":
            by_size = {item["batch_size"]: item for item in total.setdefault(key, [])}
            for item in value:
                if item["batch_size"] in by_size:
                    _add(by_size[item["batch_size"]], {k: v for k, v in item.items() if k != "batch_size"})
                else:
                    total[key].append(json.loads(json.dumps(item)))
            total[key].sort(key=lambda item: item["batch_size"])
        elif isinstance(value, dict):
            _add(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


def merge_metrics(texts: list[str]) -> str:
    """Several replicas' Prometheus texts as one server's: every sample (a series with
    its labels, histogram buckets included) summed over the replicas; HELP and TYPE lines
    once, in the order first seen."""
    order: list[str] = []
    comments: dict[str, list[str]] = {}
    samples: dict[str, dict[str, float]] = {}
    for text in texts:
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                family = parts[2] if len(parts) > 2 else ""
                if family not in comments:
                    comments[family] = []
                    samples.setdefault(family, {})
                    order.append(family)
                if line not in comments[family]:
                    comments[family].append(line)
                continue
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            family = next((f for f in (name, name.rsplit("_", 1)[0]) if f in samples), name)
            if family not in samples:
                samples[family] = {}
                comments.setdefault(family, [])
                order.append(family)
            samples[family][series] = samples[family].get(series, 0.0) + float(value)
    out = []
    for family in order:
        out.extend(comments.get(family, []))
        for series, total in samples[family].items():
            out.append(f"{series} {int(total) if total.is_integer() else total}")
    return "\n".join(out) + "\n" if out else ""


# -- the cluster actor -----------------------------------------------------------------------


class _ClusterState:
    """What the replicas report, and the log of model-control operations they apply
    (the body of the ``_Cluster`` actor; plain Python, so it is tested without Ray)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.reports: dict[str, tuple[float, dict[str, Any]]] = {}
        self.operations: list[dict[str, Any]] = []

    def report(self, replica: str, report: dict[str, Any]) -> list[dict[str, Any]]:
        """Take a replica's report; the operations it has not applied yet."""
        self.reports[replica] = (self.clock(), report)
        return self.operations[report.get("applied", 0):]

    def live(self) -> dict[str, dict[str, Any]]:
        now = self.clock()
        return {replica: report for replica, (at, report) in self.reports.items() if now - at < _REPLICA_SILENT_S}

    def add_operation(self, operation: dict[str, Any]) -> int:
        """Append an operation; its sequence number (the replicas' ``applied`` count once done)."""
        self.operations.append(operation)
        return len(self.operations)

    def outcome(self, sequence: int) -> tuple[bool, list[str]]:
        """(whether every live replica applied operation ``sequence``, their errors)."""
        live = self.live()
        done = all(report.get("applied", 0) >= sequence for report in live.values())
        errors = [report["errors"][str(sequence)] for report in live.values()
                  if str(sequence) in report.get("errors", {})]
        return done and bool(live), errors


def _cluster_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class _Cluster(_ClusterState):
        def __init__(self) -> None:
            super().__init__()

    return _Cluster


# -- a replica -------------------------------------------------------------------------------


#: This process's replica (each replica is a process of its own): what the deployment's
#: gRPC methods call into.
_current: _Replica | None = None


class _Replica:
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
        self.cluster = ray.get_actor(_CLUSTER, namespace=_NAMESPACE)

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


def _grpc_methods() -> dict[str, Any]:
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


def _this_replica() -> _Replica:
    """This process's replica (read from the module: the RPC functions travel to the
    replica pickled by value, with a copy of the globals they name)."""
    from nereid.ray import serve as ray_serve

    assert ray_serve._current is not None, "no nereid replica in this process"
    return ray_serve._current


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


# -- the application and the driver ----------------------------------------------------------


def build_application(options: ServerOptions) -> Any:
    """The Ray Serve application: ``options.ray_replicas`` replicas (or autoscaling between
    ``ray_min_replicas`` and ``ray_max_replicas``), each a whole nereid over the repository.
    Bind it into your own Ray Serve application, or run it with ``serve.run``; a
    ``_Cluster`` actor named "nereid-cluster" (namespace "nereid") must exist."""
    from ray import serve

    def replica_app() -> _Replica:
        return _Replica(options)

    deployment_options: dict[str, Any] = {
        "name": "nereid",
        "ray_actor_options": {"num_cpus": options.ray_replica_cpus, "num_gpus": options.ray_replica_gpus},
        "max_ongoing_requests": 1024,
        "health_check_period_s": 2,
        # Ray's access log line per request costs more than nereid's whole answer
        "logging_config": {"enable_access_log": False, "log_level": "WARNING"},
    }
    if options.ray_max_replicas:
        deployment_options["autoscaling_config"] = {
            "min_replicas": options.ray_min_replicas,
            "max_replicas": options.ray_max_replicas,
            "target_ongoing_requests": options.ray_target_ongoing_requests,
        }
    else:
        deployment_options["num_replicas"] = options.ray_replicas

    # HTTP through the ingress app; gRPC through Ray's gRPC proxy, to these methods
    replica_class = type("NereidReplica", (), _grpc_methods())
    return serve.deployment(**deployment_options)(serve.ingress(replica_app)(replica_class)).bind()


def start_cluster_actor() -> Any:
    """The named actor the replicas report to (created if missing)."""
    cluster = _cluster_actor()
    return cluster.options(name=_CLUSTER, namespace=_NAMESPACE, get_if_exists=True).remote()


def run_on_ray(options: ServerOptions) -> int:
    """``nereid serve --ray-replicas N``: serve until SIGINT/SIGTERM, then shut the
    application down. Returns the exit status."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print(f"nereid: {RAY_MISSING}", file=sys.stderr, flush=True)
        return 2
    env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get("PYTHONPATH")) if p)}}
    ray.init(address=options.ray_address, namespace=_NAMESPACE, runtime_env=env, include_dashboard=False,
             logging_level=logging.WARNING)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        grpc_options = {
            "port": options.grpc_port,
            "grpc_servicer_functions": ["nereid.ray.serve.add_triton_service_to_server"],
        } if options.allow_grpc else None
        serve.start(http_options={"host": options.http_address, "port": options.http_port}, grpc_options=grpc_options)
        cluster = start_cluster_actor()  # held here: the actor lives as long as this driver
        ray.get(cluster.live.remote())
        metrics = _serve_metrics(options, cluster) if options.allow_metrics else None
        serve.run(build_application(options), name="nereid", route_prefix="/")
        what = (f"{options.ray_min_replicas}-{options.ray_max_replicas} replicas (autoscaling)"
                if options.ray_max_replicas else f"{options.ray_replicas} replicas")
        _log.info("nereid serving %s on Ray Serve, %s, at %s:%d", options.model_repository, what,
                  options.http_address, options.http_port)
        print(f"nereid: serving on Ray Serve ({what}) at http://{options.http_address}:{options.http_port}", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        try:
            serve.delete("nereid")
        finally:
            ray.shutdown()
    return 0


def _serve_metrics(options: ServerOptions, cluster: Any) -> threading.Thread:
    """The metrics port in this driver: the replicas' metrics, summed (as of their last
    reports), on a loop of its own."""
    import ray

    from nereid.metrics import MetricsListener

    def render() -> bytes:
        live = ray.get(cluster.live.remote())
        return merge_metrics([report.get("metrics", "") for report in live.values()]).encode()

    async def listen() -> None:
        listener = MetricsListener(render)
        try:
            await listener.start(options.http_address, options.metrics_port)
        except OSError as exc:
            _log.error("metrics: cannot listen on %s:%d (%s); serving without metrics",
                       options.http_address, options.metrics_port, exc.strerror or exc)
            return
        await asyncio.Event().wait()

    thread = threading.Thread(target=lambda: asyncio.run(listen()), name="nereid-metrics", daemon=True)
    thread.start()
    return thread


def _package_root() -> str:
    """The folder holding the nereid package (replicas import it from there too)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
