"""nereid.ray's plain-Python parts (no Ray needed): the cluster's log of model-control
operations the replicas apply, which replicas are live, and the job's environment."""

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


def test_the_job_gives_serves_proxy_time_to_start_on_a_loaded_machine() -> None:
    """Ray Serve kills a proxy that is not ready within RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S
    three times running (5 s by default; reproduced here with two CPU hogs on two cores:
    the server exited with 1). nereid's job sets 60 s unless the variable is set."""
    import os

    import nereid
    from nereid.ray.serve import job_environment

    env = job_environment({"PYTHONPATH": "/elsewhere"})["env_vars"]
    assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "60"
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nereid.__file__)))
    assert env["PYTHONPATH"].split(":") == [package_root, "/elsewhere"]
    chosen = job_environment({"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "12.5"})["env_vars"]
    assert chosen["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "12.5"
