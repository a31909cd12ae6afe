"""Query answers → evidence: :func:`gather` groups the series of a batch by Deployment
container, at each step of the evaluation (one for an instant query, many for a range);
:func:`~unthrottle.evidence.fetching.fetch` and
:func:`~unthrottle.evidence.incremental.fetch_slots` both fold with it."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from unthrottle.evidence.containers import ContainerEvidence, Points, WorkloadKey
from unthrottle.evidence.pods import PodLevel
from unthrottle.metrics.promql import (
    BURST_SOURCE,
    PERIOD_GAUGE,
    PRESSURE_SOURCE,
)
from unthrottle.model.owners import Owners
from unthrottle.model.podlevel import POD_ROW
from unthrottle.units import MAX_PERIOD_US, MIN_PERIOD_US

COUNTER_FIELDS = {  # query name → ContainerEvidence field
    "usage_seconds": "usage_s",
    "periods": "periods",
    "throttled_periods": "throttled_periods",
    "throttled_seconds": "throttled_s",
    "wait_seconds": "wait_s",
}


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound (``+Inf`` included); None when the label is not a number."""
    try:
        return float(le) if le is not None else None
    except ValueError:
        return None


def _backlog_key(labels: dict[str, str]) -> tuple[int, float] | None:
    """(level in millicores, threshold) of a backlog series; None for another series."""
    try:
        level, over = float(labels["level"]), float(labels["over"])
    except (KeyError, ValueError):
        return None
    if not (math.isfinite(level) and math.isfinite(over)) or level <= 0:
        return None
    return round(level * 1000), over


def _period_us(seconds: float) -> int | None:
    """The agent's period gauge in whole µs; None for a value no kernel would have."""
    if not math.isfinite(seconds):
        return None
    period = round(seconds * 1e6)
    return period if MIN_PERIOD_US <= period <= MAX_PERIOD_US else None


def gather(
    owners: Owners, answer: Callable[[str], Iterable[Points]], steps: int = 1
) -> list[dict[WorkloadKey, ContainerEvidence]]:
    """Group the answers by Deployment container, at each step of the evaluation."""
    found: list[dict[WorkloadKey, ContainerEvidence]] = [{} for _ in range(steps)]
    # (namespace, pod, container) → its Deployment container and pod, or None when it is
    # not one: the same container comes back in every query (28 times in the histogram's)
    seen: dict[tuple[str, str, str], tuple[WorkloadKey, str] | None] = {}
    # … and its evidence at every step, for the series that have a value at every step
    everywhere: dict[tuple[str, str, str], list[ContainerEvidence] | None] = {}

    def owner(ident: tuple[str, str, str]) -> tuple[WorkloadKey, str] | None:
        if ident in seen:
            return seen[ident]
        deploy = owners.workload_of(ident[0], ident[1])
        item = None
        if deploy is not None and ident[2] and ident[2] != "POD":
            item = (WorkloadKey(ident[0], deploy, ident[2]), ident[1])
        elif deploy is not None and not ident[2] and (ident[0], deploy) in owners.pod_level:
            item = (WorkloadKey(ident[0], deploy, POD_ROW), ident[1])  # the pod's own limit
        seen[ident] = item
        return item

    def evidence(labels: dict[str, str], at: Sequence[int]) -> list[ContainerEvidence] | None:
        """The series' container's evidence at each of the steps ``at`` (None: not one)."""
        ident = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
        full = len(at) == steps
        if full and ident in everywhere:
            return everywhere[ident]
        found_owner = owner(ident)
        items = None
        if found_owner is not None:
            key, pod = found_owner
            items = []
            for k in at:
                item = found[k].get(key)
                if item is None:
                    item = found[k][key] = ContainerEvidence(key)
                item.pods.add(pod)
                items.append(item)
        if full:
            everywhere[ident] = items
        return items

    pods = PodLevel()
    for name, attr in COUNTER_FIELDS.items():
        for labels, at, values in answer(name):
            into, source = attr, labels.get(PRESSURE_SOURCE[0])
            if source == PRESSURE_SOURCE[1]:
                into = "pressure_s"  # the PSI series, riding along in the wait's answer
            elif source == BURST_SOURCE[1]:  # … and the burst counters in two others
                into = "burst_periods" if name == "periods" else "burst_s"
            elif labels.get("container", "") == "":
                pods.add(owners, labels, name, at, values)
                items = evidence(labels, at)  # None unless the pod's limit is a row
                for item, value in zip(items or (), values, strict=False):
                    if math.isfinite(value):
                        setattr(item, into, (getattr(item, into) or 0.0) + value)
                continue
            items = evidence(labels, at)
            pods.note(labels, name, at, items, values)
            for item, value in zip(items or (), values, strict=False):
                if math.isfinite(value):
                    setattr(item, into, (getattr(item, into) or 0.0) + value)
    pods.share()

    bounds: dict[str | None, float | None] = {}
    for labels, at, values in answer("histogram"):
        items = evidence(labels, at)
        le = labels.get("le")
        bound = bounds[le] if le in bounds else bounds.setdefault(le, _bound(le))
        if bound is None:
            continue
        for item, value in zip(items or (), values, strict=False):
            if math.isfinite(value):
                item.buckets[bound] = item.buckets.get(bound, 0.0) + value

    for labels, at, values in answer("backlog"):
        items = evidence(labels, at)
        key = _backlog_key(labels)
        for item, value in zip(items or (), values, strict=False):
            if not math.isfinite(value):
                continue
            if key is not None:
                item.backlog[key] = item.backlog.get(key, 0.0) + value
            elif "level" not in labels:
                item.active_windows = (item.active_windows or 0.0) + value

    for name, attr in (("limits", "limit_millicores"), ("requests", "request_millicores")):
        for labels, at, values in answer(name):
            items = evidence(labels, at)
            if labels.get("__name__") == PERIOD_GAUGE:
                for item, value in zip(items or (), values, strict=False):
                    period = _period_us(value)
                    if period is not None:
                        item.agent_periods_us.add(period)
                continue
            for item, value in zip(items or (), values, strict=False):
                if math.isfinite(value):
                    # the largest across pods: a rollout in progress may mix old and new values
                    millicores = math.ceil(value * 1000)
                    setattr(item, attr, max(getattr(item, attr) or 0, millicores))
    return found
