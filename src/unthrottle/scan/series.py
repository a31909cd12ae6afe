"""The report's pictures: the counters of the plotted containers over the window, and what
Apply did to the Deployments it changed, measured from the same counters.

A step after :func:`~unthrottle.scan.pipeline.assess`, run only when pictures are drawn
(``recommend --format html``, the operator's report): :func:`with_series` reads the
series of the ``max_plots`` most harmed containers over target and of the containers of
Deployments Apply changed (their ``unthrottle.io/last-applied`` record), in one batch of
range queries (:func:`~unthrottle.evidence.plots.fetch_series`), and attaches them to the
result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import CONCURRENCY
from unthrottle.evidence.plots import ContainerSeries, fetch_series
from unthrottle.kube.patching import RECORD_ANNOTATION, Record, RecordError
from unthrottle.metrics.source import MetricsSource
from unthrottle.scan.result import ScanResult, WorkloadResult

_log = logging.getLogger(__name__)

PLOTTED = 50
"""Containers over target that get plots (the HTML report's ``MAX_PLOTS``)."""
VERDICTS = {
    None: "still verifying",
    "Applied": "kept",
    "RolledBack": "rolled back",
    "Superseded": "superseded",
}
"""The record's verdict as the report says it."""


@dataclass(frozen=True, slots=True)
class Measured:
    """A changed container's throttle ratio before and after the change, from the
    counters, over the same length of time on each side."""

    span_s: int
    """The length of each side, s (0: not measurable inside the window)."""
    before: float | None
    after: float | None
    after_from: float
    """Unix time the after side starts: the rollout's end, the canary's resize, or the change."""


def plotted(result: ScanResult, max_plots: int = PLOTTED) -> list[WorkloadKey]:
    """The containers the report plots: the ``max_plots`` most harmed over target."""
    over = [(c.harm(result.target), w.namespace, w.deployment, c.name)
            for w in result.workloads for c in w.containers
            if (c.throttle_ratio or 0.0) > result.target]  # fmt: skip
    over.sort(key=lambda o: -o[0])
    return [WorkloadKey(ns, d, c) for _, ns, d, c in over[:max_plots]]


def record_in(w: WorkloadResult) -> Record | None:
    """The Deployment's Apply record; None without one, or with one that cannot be read."""
    text = w.annotations.get(RECORD_ANNOTATION)
    if text is None:
        return None
    try:
        return Record.from_annotation(text)
    except RecordError as error:
        _log.warning("Deployment %s/%s: %s", w.namespace, w.deployment, error)
        return None


def measured(record: Record, series: ContainerSeries | None, *, now: float,
             window_s: int) -> Measured:  # fmt: skip
    """Before and after the change over the same length of time, inside the window."""
    after_from = record.rollout_done_at or record.canary_done_at or record.at
    span = int(min(now - after_from, record.at - (now - window_s)))
    if series is None or span < series.step_s:
        return Measured(0, None, None, after_from)
    return Measured(span, series.ratio_between(record.at - span, record.at),
                    series.ratio_between(after_from, after_from + span), after_from)  # fmt: skip


def applied_json(record: Record, series: dict[str, Measured]) -> dict[str, object]:
    """The ``applied`` object of a Deployment in the report's JSON."""
    return {
        "at": record.at,
        "policy": record.policy,
        "method": record.method,
        "verdict": VERDICTS.get(record.verdict, record.verdict or "still verifying"),
        "verdict_at": record.verdict_at,
        "reason": why(record),
        "canary": record.canary,
        "containers": [
            {
                "name": c.name,
                "before": {"limit_millicores": c.before.cpu_limit, "burst_us": c.before.burst_us,
                           "gomaxprocs": c.before.gomaxprocs},
                "after": {"limit_millicores": c.after.cpu_limit, "burst_us": c.after.burst_us,
                          "gomaxprocs": c.after.gomaxprocs},
                "expected_ratio": c.expected_ratio,
                "verified_ratio": record.ratio_after.get(c.name),
                **_measured_json(series.get(c.name)),
            }
            for c in record.containers
        ],
    }  # fmt: skip


def _measured_json(m: Measured | None) -> dict[str, object]:
    if m is None:
        return {"span_s": 0, "ratio_before": None, "ratio_after": None}
    return {"span_s": m.span_s, "ratio_before": m.before, "ratio_after": m.after,
            "after_from": m.after_from}  # fmt: skip


def why(record: Record) -> str:
    """Why the verdict is what it is, in a sentence."""
    if record.verdict is not None:
        return record.verdict_reason or record.verdict
    if record.undo:
        return f"rolling back: {record.undo}"
    if record.in_place:
        if record.canary_verified_at is not None:
            return f"canary {record.canary} passed; resizing the other pods"
        if record.canary_done_at is not None:
            return f"canary {record.canary} resized; its throttling is being compared"
        return f"resizing canary {record.canary or 'pod'} in place"
    if record.rollout_done_at is not None:
        return "rollout done; its throttling is being compared with before"
    return "waiting for the rollout to finish"


def with_series(
    result: ScanResult,
    metrics: MetricsSource,
    *,
    max_plots: int = PLOTTED,
    concurrency: int = CONCURRENCY,
    on_query: Callable[[str], None] | None = None,
) -> ScanResult:
    """The result with the series of its plotted and changed containers, and each changed
    Deployment's ``applied`` summary. Raises
    :class:`~unthrottle.metrics.source.MetricsError` when Prometheus cannot answer."""
    records = {(w.namespace, w.deployment): r for w in result.workloads
               if (r := record_in(w)) is not None}  # fmt: skip
    keys = set(plotted(result, max_plots))
    for w in result.workloads:
        if (w.namespace, w.deployment) in records:
            keys |= {WorkloadKey(w.namespace, w.deployment, c.name) for c in w.containers}
            rec = records[(w.namespace, w.deployment)]
            keys |= {WorkloadKey(w.namespace, w.deployment, c.name) for c in rec.containers}
    found = (fetch_series(metrics, keys, end=result.now, window_s=result.window_s,
                          concurrency=concurrency, on_query=on_query)
             if keys else {})  # fmt: skip
    workloads = []
    for w in result.workloads:
        containers = tuple(
            replace(c, series=found.get(WorkloadKey(w.namespace, w.deployment, c.name)))
            for c in w.containers
        )
        record = records.get((w.namespace, w.deployment))
        applied = None
        if record is not None:
            m = {c.name: measured(record, found.get(WorkloadKey(w.namespace, w.deployment,
                                                                c.name)),
                                  now=result.now, window_s=result.window_s)
                 for c in record.containers}  # fmt: skip
            applied = applied_json(record, m)
        workloads.append(replace(w, containers=containers, applied=applied))
    return replace(result, workloads=tuple(workloads))
