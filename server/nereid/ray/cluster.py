"""The cluster actor of nereid on Ray Serve: what the replicas report (statistics,
metrics, model states, the model-control operations applied) and the log of operations
they apply. ``ClusterState`` is its plain-Python body (tested without Ray);
``start_cluster_actor`` makes the named actor.
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["CLUSTER_NAME", "NAMESPACE", "ClusterState", "start_cluster_actor"]

#: The named actor the replicas report to, and its Ray namespace.
CLUSTER_NAME = "nereid-cluster"
NAMESPACE = "nereid"
#: a replica not heard from for this long is taken for gone
_REPLICA_SILENT_S = 5.0


class ClusterState:
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
    class _Cluster(ClusterState):
        def __init__(self) -> None:
            super().__init__()

    return _Cluster


def start_cluster_actor() -> Any:
    """The named actor the replicas report to (created if missing)."""
    cluster = _cluster_actor()
    return cluster.options(name=CLUSTER_NAME, namespace=NAMESPACE, get_if_exists=True).remote()
