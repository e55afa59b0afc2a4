"""Several Ray Serve replicas' statistics and metrics as one server's: what the driver's
metrics port and a replica's statistics endpoints answer for the whole cluster. Pure
Python (tested without Ray).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["merge_metrics", "merge_statistics"]


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
