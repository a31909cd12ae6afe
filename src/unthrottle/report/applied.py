"""What Apply did, as rows both the Markdown and the HTML report show: per container
changed, what changed and when, the throttle ratio before and after over the same length
of time (from the kernel's counters), and the verdict with why. Pure."""

from __future__ import annotations

from collections.abc import Iterator

from unthrottle.report import units
from unthrottle.report.model import Applied, AppliedContainer, Report, Settings, Workload

APPLIED_NOTE = (
    "Changes the policy's Apply mode made (the Deployment's unthrottle.io/last-applied "
    "record). Throttled before and after: the share of CFS periods throttled, from the "
    "kernel's counters, over as long a time on each side of the change (the after side "
    "starts when the rollout or the in-place canary's resize is done), inside the window. "
    "An in-place change (method InPlace) lives as long as its ReplicaSet: to keep it, put "
    "it in the manifests with the kustomize Component (unthrottle report POLICY --format "
    "kustomize)."
)


def _settings(before: Settings, after: Settings) -> str:
    parts = []
    if before.limit_millicores != after.limit_millicores:
        parts.append(f"limit {units.cpu(before.limit_millicores)} → "
                     f"{units.cpu(after.limit_millicores)}")  # fmt: skip
    if before.burst_us != after.burst_us:
        parts.append(f"burst {units.burst(before.burst_us)} → {units.burst(after.burst_us)}")
    if before.gomaxprocs != after.gomaxprocs:
        parts.append(f"GOMAXPROCS {units.count(before.gomaxprocs)} → "
                     f"{units.count(after.gomaxprocs)}")  # fmt: skip
    return "; ".join(parts) or "nothing"


def _side(ratio: float | None, span_s: int) -> str:
    if span_s <= 0:
        return f"{units.DASH} (not in the window)"
    return f"{units.pct(ratio)} over {units.duration(span_s)}"


def _why(a: Applied, ac: AppliedContainer, w: Workload) -> str:
    parts = [a.reason] if a.reason else []
    if ac.verified_ratio is not None:
        parts.append(f"verification measured {units.pct(ac.verified_ratio)}")
    if ac.expected_ratio is not None:
        parts.append(f"{units.pct(ac.expected_ratio)} expected")
    step = _next_step(ac, w)
    if step:
        parts.append(step)
    return "; ".join(parts)


def _next_step(ac: AppliedContainer, w: Workload) -> str:
    """The recommendation since the change, where it moves the applied limit: the second
    step (refined from the evidence since, unthrottled; docs/recommend.md, "Busy nodes")."""
    found = [c for c in w.containers if c.name == ac.name and c.recommendation is not None]
    if not found:
        return ""
    rec = found[0].recommendation
    assert rec is not None
    applied, now = ac.after.limit_millicores, rec.limit_millicores
    if now is None or applied is None or now == applied:
        return ""
    return (
        f"next step {units.cpu(applied)} → {units.cpu(now)}, from the evidence since "
        f"({units.expected(rec.expected_throttle_ratio, rec.expected_range())} expected)"
    )


def applied_rows(
    report: Report,
) -> Iterator[tuple[Workload, Applied, AppliedContainer, tuple[str, ...]]]:
    """Per container Apply changed, latest change first: its Deployment, the change, the
    container's part, and the cells (Deployment, container, changed, when, method,
    throttled before, throttled after, verdict, why), plain text."""
    for w in report.applied():
        a = w.applied
        assert a is not None
        for ac in a.containers:
            when = units.when(a.at)
            verdict = a.verdict + (f" ({units.when(a.verdict_at)})" if a.verdict_at else "")
            method = a.method + (f", canary {a.canary}" if a.canary else "")
            yield w, a, ac, (w.key, ac.name, _settings(ac.before, ac.after), when, method,
                             _side(ac.ratio_before, ac.span_s), _side(ac.ratio_after, ac.span_s),
                             verdict, _why(a, ac, w))  # fmt: skip
