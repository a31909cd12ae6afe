"""What Apply mode would change in a Deployment's containers: the limit, the burst
annotation and GOMAXPROCS a recommendation asks for against what the Deployment holds
(pure: the Deployment as read in, the changes out), and how a change is described in
events and records."""

from __future__ import annotations

from typing import Any

from unthrottle.kube.patching import (
    ContainerChange,
    Record,
    RecordError,
    Settings,
    record_of,
)
from unthrottle.model.podlevel import POD_ROW
from unthrottle.model.policy import ThrottlePolicySpec
from unthrottle.scan import (
    WorkloadResult,
)
from unthrottle.units import MIN_QUOTA_US, format_cpu, quota_of


def percent(ratio: float | None) -> str:
    """A throttle ratio as people read it (``?`` when unknown)."""
    return "?" if ratio is None else f"{ratio * 100:.0f} %"


def in_ms(us: int) -> str:
    """Microseconds as milliseconds (``15ms``)."""
    return f"{us / 1000:g}ms"


def describe(change: ContainerChange, policy: str) -> str:
    """``raised CPU limit of api 500m → 900m, burst 20ms (policy p: 41 % …; expected 2 %)``."""
    before, after = change.before, change.after
    parts = []
    if after.cpu_limit != before.cpu_limit and after.cpu_limit is not None:
        verb = "raised" if before.cpu_limit is None or after.cpu_limit > before.cpu_limit else (
            "lowered")  # fmt: skip
        was = "none" if before.cpu_limit is None else format_cpu(before.cpu_limit)
        parts.append(f"{verb} CPU limit of {change.name} {was} → {format_cpu(after.cpu_limit)}")
    if after.burst_us != before.burst_us:
        parts.append(f"burst {in_ms(after.burst_us)}")
    if after.gomaxprocs != before.gomaxprocs and after.gomaxprocs is not None:
        parts.append(f"GOMAXPROCS {after.gomaxprocs}")
    if not parts:
        parts.append(f"{change.name} unchanged")
    return (f"{', '.join(parts)} (policy {policy}: {percent(change.ratio_before)} of periods "
            f"throttled; expected {percent(change.expected_ratio)})")  # fmt: skip


def _gomaxprocs_env(container: dict[str, Any]) -> tuple[bool, int | None]:
    """(present, value): GOMAXPROCS in the container's env (a valueFrom counts as present)."""
    for entry in container.get("env") or []:
        if entry.get("name") == "GOMAXPROCS":
            value = entry.get("value")
            return True, int(value) if isinstance(value, str) and value.isdigit() else None
    return False, None


def changes_for(workload: WorkloadResult, raw: dict[str, Any], spec: ThrottlePolicySpec,
                previous: Record | None) -> list[ContainerChange]:  # fmt: skip
    """The containers whose recommendation changes something, as valid changes only:
    never a limit below the request, a quota under 1 ms or a burst above the quota, each
    at the container's own CFS period (the kubelet writes ``limit × period / 1000`` µs)."""
    template = raw["spec"]["template"]["spec"]
    containers = {c.get("name"): c for c in template.get("containers", [])}
    if ((template.get("resources") or {}).get("limits") or {}).get("cpu") is not None:
        containers[POD_ROW] = template  # the pod-level limit's row (model.podlevel)
    ours_before = {c.name: c.after.gomaxprocs for c in (previous.containers if previous else ())}
    out = []
    for c in workload.containers:
        rec = c.recommendation
        if rec is None or not c.managed or rec.limit_millicores is None or c.name not in containers:
            continue
        limit = max(rec.limit_millicores, c.request_millicores)
        quota = quota_of(limit, rec.period_us)
        burst = min(rec.burst_us, quota) if spec.burst.enabled else c.burst_us
        present, env_value = _gomaxprocs_env(containers[c.name])
        ours = not present or (env_value is not None and ours_before.get(c.name) == env_value)
        gomaxprocs = env_value
        if spec.processors.enabled and rec.gomaxprocs is not None and ours:
            gomaxprocs = rec.gomaxprocs
        if quota < MIN_QUOTA_US or burst > quota:
            continue  # never an invalid patch (the engine does not produce these)
        before = Settings(c.limit_millicores, c.burst_us, env_value)
        after = Settings(limit, burst, gomaxprocs)
        if before != after:
            out.append(ContainerChange(c.name, before, after, c.throttle_ratio,
                                       rec.expected_throttle_ratio, ours,
                                       period_us=rec.period_us))  # fmt: skip
    return out


def judged_against(c: ContainerChange) -> float | None:
    """The throttle ratio a change's result is judged against: the ratio before it, or the
    engine's expected ratio when that is higher (a step the caps held below what the demand
    needs, predicted to stay as throttled): a result as predicted is not "worse". A capped
    500m -> 1000m step of a workload that wants 2 cores was expected at 100 % of periods
    and rolled back for 92 % -> 100 %, though it halved the stall."""
    if c.expected_ratio is not None and (c.ratio_before is None
                                         or c.expected_ratio > c.ratio_before):  # fmt: skip
        return c.expected_ratio
    return c.ratio_before


def changes_as_read(w: WorkloadResult, raw: dict[str, Any],
             spec: ThrottlePolicySpec) -> list[ContainerChange]:  # fmt: skip
    """:func:`changes_for` the Deployment as read, with its record if it has a readable one."""
    try:
        previous = record_of(raw)
    except RecordError:
        previous = None
    return changes_for(w, raw, spec, previous)
