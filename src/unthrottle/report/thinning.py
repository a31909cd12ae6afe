"""Series thinned to fit a report ConfigMap: at most N points each, by merging adjacent steps.

``k = ceil(points / N)`` adjacent steps become one, stamped at the last one's end: the
throttle ratio and the mean CPU per pod are averaged over the k steps, the busiest pod's
CPU is the largest of them (a thinned peak is never lower than the peak it stands for).
The step doubles, triples …, and ``series_step_s`` says so. Pure, on the JSON document.
"""

from __future__ import annotations

import math
from typing import Any

CONFIGMAP_POINTS = 60
"""Points per series in the operator's report ConfigMap, at most: adjacent steps are
merged k at a time (a 24 h window's 144 steps of 10 min become 48 of 30 min; measured,
the 50 plotted containers' series then take 180 KiB of the 900 KiB cap,
docs/benchmarks.md §8); enough for a plot 6 inches wide."""


def _groups(points: list[dict[str, Any]], k: int) -> list[list[dict[str, Any]]]:
    return [points[i : i + k] for i in range(0, len(points), k)]


def thin_container(doc: dict[str, Any], max_points: int) -> None:
    """Thin a container's ``throttle_series`` and ``usage_series`` in place."""
    throttle, usage = doc.get("throttle_series") or [], doc.get("usage_series") or []
    longest = max(len(throttle), len(usage))
    if longest <= max_points:
        return
    k = math.ceil(longest / max_points)
    doc["throttle_series"] = [
        {"t": g[-1]["t"], "ratio": round(sum(p["ratio"] for p in g) / len(g), 5)}
        for g in _groups(throttle, k)
    ]
    doc["usage_series"] = [
        {"t": g[-1]["t"], "cores": round(sum(p["cores"] for p in g) / len(g), 4),
         "peak": max(p["peak"] for p in g)}
        for g in _groups(usage, k)
    ]  # fmt: skip
    if doc.get("series_step_s"):
        doc["series_step_s"] = doc["series_step_s"] * k


def thin(doc: dict[str, Any], max_points: int = CONFIGMAP_POINTS) -> dict[str, Any]:
    """The report document with every container's series thinned (in place; returned)."""
    for w in doc.get("workloads", []):
        for c in w.get("containers", []):
            thin_container(c, max_points)
    return doc


def drop_series(container: dict[str, Any]) -> None:
    """A container's series removed (a Deployment past the plotted ones)."""
    for name in ("throttle_series", "usage_series", "series_step_s"):
        container.pop(name, None)
