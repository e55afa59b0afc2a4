"""nereid.ray.merge (no Ray needed): summing the replicas' statistics and metrics."""

from __future__ import annotations

from nereid.ray.merge import merge_metrics, merge_statistics


def entry(count: int, ns: int, last: int, batches: dict[int, int]) -> dict[str, object]:
    return {
        "name": "m", "version": "1", "last_inference": last, "inference_count": count, "execution_count": count,
        "inference_stats": {"success": {"count": count, "ns": ns}, "fail": {"count": 0, "ns": 0}},
        "batch_stats": [{"batch_size": size, "compute_infer": {"count": n, "ns": n * 10}} for size, n in batches.items()],
    }


def test_statistics_are_summed_per_model_version_and_batch_size() -> None:
    merged = merge_statistics([
        {"model_stats": [entry(3, 30, 100, {1: 1, 2: 1})]},
        {"model_stats": [entry(5, 50, 90, {2: 2, 4: 1}), dict(entry(1, 1, 1, {}), name="other")]},
    ])
    [m, other] = merged["model_stats"]
    assert (m["inference_count"], m["inference_stats"]["success"], m["last_inference"]) == (8, {"count": 8, "ns": 80}, 100)
    assert m["batch_stats"] == [
        {"batch_size": 1, "compute_infer": {"count": 1, "ns": 10}},
        {"batch_size": 2, "compute_infer": {"count": 3, "ns": 30}},
        {"batch_size": 4, "compute_infer": {"count": 1, "ns": 10}},
    ]
    assert other["name"] == "other" and other["inference_count"] == 1


def test_metrics_samples_are_summed_with_their_labels() -> None:
    one = ("# HELP nv_inference_count Number of inferences\n# TYPE nv_inference_count counter\n"
           'nv_inference_count{model="m",version="1"} 3\n'
           "# HELP nereid_batch_size Rows per batch\n# TYPE nereid_batch_size histogram\n"
           'nereid_batch_size_bucket{le="1",model="m",version="1"} 2\nnereid_batch_size_count{model="m",version="1"} 2\n')
    two = one.replace("} 3", "} 4").replace("} 2", "} 5")
    merged = merge_metrics([one, two])
    assert merged.count("# TYPE nv_inference_count counter") == 1
    assert 'nv_inference_count{model="m",version="1"} 7' in merged
    assert 'nereid_batch_size_bucket{le="1",model="m",version="1"} 7' in merged
    assert merged.index("# TYPE nereid_batch_size histogram") < merged.index("nereid_batch_size_bucket")
