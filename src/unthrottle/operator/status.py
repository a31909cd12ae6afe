"""A policy's status from a scan result: per Deployment a state, per container today vs
recommended, a summary, and conditions. Pure: the caller writes it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult
from unthrottle.units import format_cpu

IGNORE_ANNOTATION = "unthrottle.io/ignore"
"""``"true"`` on a Deployment leaves it out of every policy (listed as Skipped)."""


class State(StrEnum):
    """A Deployment's state in a policy's status."""

    RECOMMENDED = "Recommended"
    UP_TO_DATE = "UpToDate"
    NO_DATA = "NoData"
    SKIPPED = "Skipped"
    APPLIED = "Applied"
    """Apply mode: changed, and the change held up through apply.verifyFor."""
    VERIFYING = "Verifying"
    """Apply mode: changed; rolling out, or watched for apply.verifyFor."""
    ROLLED_BACK = "RolledBack"
    """Apply mode: the change made things worse (or its rollout failed) and was undone."""


def timestamp(unix: float) -> str:
    """RFC 3339, as Kubernetes writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _ms(us: int) -> str:
    return f"{us / 1000:g}ms"


def container_status(c: ContainerResult) -> dict[str, Any]:
    """One container: quantities as ``kubectl`` shows them."""
    rec = c.recommendation
    return {
        "name": c.name,
        "current": {
            "cpuLimit": None if c.limit_millicores is None else format_cpu(c.limit_millicores),
            "cpuRequest": format_cpu(c.request_millicores),
            "burst": _ms(c.burst_us),
            "gomaxprocs": c.gomaxprocs_env,
        },
        "recommended": None
        if rec is None
        else {
            "cpuLimit": None if rec.limit_millicores is None else format_cpu(rec.limit_millicores),
            "cpuLimitLowerBound": None
            if rec.lower_limit_millicores is None
            else format_cpu(rec.lower_limit_millicores),
            "burst": _ms(rec.burst_us),
            "gomaxprocs": rec.gomaxprocs,
        },
        "throttleRatio": None if c.throttle_ratio is None else round(c.throttle_ratio, 4),
        "expectedThrottleRatio": None
        if rec is None or rec.expected_throttle_ratio is None
        else round(rec.expected_throttle_ratio, 4),
        "expectedThrottleRatioRange": None
        if rec is None or rec.expected_throttle_ratio_range is None
        else [round(end, 4) for end in rec.expected_throttle_ratio_range],
        "confidence": 0.0 if rec is None else round(rec.confidence, 3),
        "evidence": c.evidence,
        "reason": (rec.reasons[-1] if rec and rec.reasons else "")
        if c.managed
        else "not managed: the policy's containers leave it out",
    }


def workload_state(w: WorkloadResult, skipped: dict[str, str]) -> tuple[State, str | None]:
    """The state of one Deployment, and why (for Skipped and NoData)."""
    if w.deployment in skipped:
        return State.SKIPPED, skipped[w.deployment]
    managed = [c for c in w.containers if c.managed]
    if not any(c.recommendation is not None for c in managed):
        if not w.containers:
            return State.NO_DATA, "its pod template has no containers"
        return (
            State.NO_DATA,
            "no CPU counters for its pods in the window (not running, or not scraped)",
        )
    if all(c.recommendation is None or c.up_to_date() for c in managed):
        return State.UP_TO_DATE, None
    return State.RECOMMENDED, None


@dataclass(frozen=True, slots=True)
class StatusView:
    """The status's workloads and summary, and the states of every Deployment."""

    workloads: list[dict[str, Any]]
    summary: dict[str, Any]
    states: dict[str, State]


def workloads_status(
    result: ScanResult,
    skipped: dict[str, str],
    *,
    limit: int,
    overrides: dict[str, tuple[State, str | None]] | None = None,
) -> StatusView:
    """Every Deployment's state (Apply mode's ``overrides`` win); the ``limit`` most harmful
    kept in status."""
    entries, states = [], {}
    over, containers = 0, 0
    worst: float | None = None
    for w in result.workloads:
        state, message = (overrides or {}).get(w.deployment) or workload_state(w, skipped)
        states[w.deployment] = state
        containers += len(w.containers)
        if state != State.SKIPPED:
            for c in w.containers:
                if c.throttle_ratio is not None:
                    worst = c.throttle_ratio if worst is None else max(worst, c.throttle_ratio)
            if any((c.throttle_ratio or 0.0) > result.target for c in w.containers):
                over += 1
        entries.append({
            "deployment": w.deployment,
            "kind": w.kind,
            "name": w.name,
            "state": state.value,
            "message": message or "",
            "containers": [container_status(c) for c in w.containers],
        })  # fmt: skip
    summary = {
        "deployments": len(entries),
        "containers": containers,
        "overTarget": over,
        "worstThrottleRatio": None if worst is None else round(worst, 4),
        "leftOut": max(0, len(entries) - limit),
    }
    return StatusView(entries[:limit], summary, states)


def condition(
    previous: list[dict[str, Any]] | None,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: float,
    generation: int | None,
) -> dict[str, Any]:
    """A metav1.Condition; its lastTransitionTime moves only when its status does."""
    value = "True" if status else "False"
    before = next((c for c in previous or [] if c.get("type") == kind), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == value and before.get("lastTransitionTime")
        else timestamp(now)
    )
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }
