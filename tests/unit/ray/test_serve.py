"""nereid.ray.cluster's plain-Python body (no Ray needed): the log of model-control
operations the replicas apply, and which replicas are live."""

from __future__ import annotations

from nereid.ray.cluster import ClusterState


def test_an_operation_is_done_when_every_live_replica_applied_it() -> None:
    now = [0.0]
    cluster = ClusterState(clock=lambda: now[0])
    assert cluster.report("a", {"applied": 0}) == [] and cluster.report("b", {"applied": 0}) == []
    sequence = cluster.add_operation({"action": "load", "name": "m", "parameters": {}})
    assert cluster.outcome(sequence) == (False, [])
    assert cluster.report("a", {"applied": 0}) == [{"action": "load", "name": "m", "parameters": {}}]
    cluster.report("a", {"applied": 1})
    assert cluster.outcome(sequence) == (False, [])
    cluster.report("b", {"applied": 1, "errors": {"1": "no weights"}})
    assert cluster.outcome(sequence) == (True, ["no weights"])
    now[0] = 10.0  # both silent past the limit: gone; a replica reporting again is live
    cluster.report("c", {"applied": 1})
    assert list(cluster.live()) == ["c"]
