"""nereid on Ray Serve: the same repository and protocol, served by N replicas.

``nereid serve --ray-replicas N`` (``run_on_ray``) starts or joins a Ray cluster and
deploys ``build_application(options)``: a Ray Serve deployment whose replicas each run a
whole nereid (model manager, dynamic batchers, instances) over the same repository, with
nereid's ASGI app as their ingress behind Ray Serve's HTTP proxy on ``--http-port``
(``replica.py``).

One server to the client: the replicas report to a cluster actor (``cluster.py``; every
half second: statistics, metrics, model states, the model-control operations applied),
and what must speak for all of them answers from it: the statistics endpoints and the
metrics port (served by the driver) sum the replicas (``merge.py``),
``/v2/health/ready`` is true when every model has a ready replica, and in explicit
model-control mode a load or unload goes to every replica (through the cluster's log of
operations) and is answered once all have applied it. Every response names the replica
that answered (``nereid-replica``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from nereid.options import ServerOptions
from nereid.ray.cluster import NAMESPACE, start_cluster_actor
from nereid.ray.merge import merge_metrics, merge_statistics
from nereid.ray.replica import Replica, grpc_methods

__all__ = [
    "RAY_MISSING", "build_application", "job_environment", "merge_metrics", "merge_statistics", "run_on_ray",
    "start_cluster_actor",
]

_log = logging.getLogger("nereid")

RAY_MISSING = "Ray Serve is not installed: pip install 'nereid[ray]' (or: pip install 'ray[serve]')"


def build_application(options: ServerOptions) -> Any:
    """The Ray Serve application: ``options.ray_replicas`` replicas (or autoscaling between
    ``ray_min_replicas`` and ``ray_max_replicas``), each a whole nereid over the repository.
    Bind it into your own Ray Serve application, or run it with ``serve.run``; a
    cluster actor named "nereid-cluster" (namespace "nereid") must exist."""
    from ray import serve

    def replica_app() -> Replica:
        return Replica(options)

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
    replica_class = type("NereidReplica", (), grpc_methods())
    return serve.deployment(**deployment_options)(serve.ingress(replica_app)(replica_class)).bind()


#: Ray Serve kills its HTTP proxy when the proxy is not ready within this many seconds three
#: times running, and `serve.start` then fails. Ray's 5 s is less than the proxy's own start
#: takes on a small machine under load (2 cores busy: over 15 s), so the clusters nereid's
#: jobs reach get 60 s unless the variable is set already.
_PROXY_READY_CHECK = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
_PROXY_READY_CHECK_S = "60"


def job_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The runtime environment of nereid's Ray job (its replicas, and Serve's controller):
    nereid importable from where this process imports it, and the proxy's ready check."""
    return {"env_vars": {
        "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), environ.get("PYTHONPATH")) if p),
        _PROXY_READY_CHECK: environ.get(_PROXY_READY_CHECK, _PROXY_READY_CHECK_S),
    }}


def run_on_ray(options: ServerOptions) -> int:
    """``nereid serve --ray-replicas N``: serve until SIGINT/SIGTERM, then shut the
    application down. Returns the exit status."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print(f"nereid: {RAY_MISSING}", file=sys.stderr, flush=True)
        return 2
    ray.init(address=options.ray_address, namespace=NAMESPACE, runtime_env=job_environment(os.environ),
             include_dashboard=False, logging_level=logging.WARNING)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        grpc_options = {
            "port": options.grpc_port,
            "grpc_servicer_functions": ["nereid.ray.replica.add_triton_service_to_server"],
        } if options.allow_grpc else None
        serve.start(http_options={"host": options.http_address, "port": options.http_port}, grpc_options=grpc_options)
        cluster = start_cluster_actor()  # held here: the actor lives as long as this driver
        ray.get(cluster.live.remote())
        metrics = _serve_metrics(options, cluster) if options.allow_metrics else None
        serve.run(build_application(options), name="nereid", route_prefix="/")
        what = (f"{options.ray_min_replicas}-{options.ray_max_replicas} replicas (autoscaling)"
                if options.ray_max_replicas else f"{options.ray_replicas} replicas")
        _log.info("nereid serving %s on Ray Serve, %s, at %s:%d", ", ".join(map(str, options.model_repositories)), what,
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
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
