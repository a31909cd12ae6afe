"""A scan result as Markdown, for a pull request comment or a report ConfigMap."""

from __future__ import annotations

from unthrottle.cfs.settings import format_cpu
from unthrottle.scan import ContainerResult, ScanResult


def _cpu(millicores: int | None) -> str:
    return "none" if millicores is None else format_cpu(millicores)


def _pct(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio * 100:.1f} %"


def _cell(text: object) -> str:
    """Table cell text: pipes and newlines from the cluster cannot break the table."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(deployment: str, c: ContainerResult) -> str:
    rec = c.recommendation
    demand = c.demand or {}
    cells = [
        deployment,
        c.name,
        _cpu(c.limit_millicores),
        _cpu(rec.limit_millicores) if rec else "–",
        f"{c.burst_us / 1000:g} → {rec.burst_us / 1000:g} ms" if rec else "–",
        _pct(c.throttle_ratio),
        _pct(rec.expected_throttle_ratio) if rec else "–",
        " / ".join(_cpu(demand.get(k)) for k in ("p50_millicores", "p99_millicores",
                                                  "max_millicores")) if demand else "–",
        c.evidence,
        f"{rec.confidence:.2f}" if rec else "–",
        (rec.reasons[-1] if rec and rec.reasons else "no evidence in the window"),
    ]  # fmt: skip
    return "| " + " | ".join(_cell(x) for x in cells) + " |"


def markdown(result: ScanResult, *, title: str, states: dict[str, str] | None = None,
             max_workloads: int | None = None) -> str:  # fmt: skip
    """Summary, then one row per container, most harmful Deployment first."""
    workloads = list(result.workloads)
    over = [w for w in workloads if any((c.throttle_ratio or 0) > result.target
                                        for c in w.containers)]  # fmt: skip
    lines = [
        f"# {_cell(title)}",
        "",
        f"{len(workloads)} Deployments, {sum(len(w.containers) for w in workloads)} containers; "
        f"{len(over)} over the target of {result.target * 100:g} % of periods throttled "
        f"(window {result.window_s // 3600} h).",
        "",
        "| Deployment | container | limit | recommended | burst | throttled | expected | "
        "demand p50 / p99 / max | evidence | confidence | reason |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    shown = workloads if max_workloads is None else workloads[:max_workloads]
    for w in shown:
        name = w.deployment if not states or w.deployment not in states else (
            f"{w.deployment} ({states[w.deployment]})")  # fmt: skip
        lines.extend(_row(name, c) for c in w.containers)
    if len(shown) < len(workloads):
        lines += ["", f"… and {len(workloads) - len(shown)} more Deployments (left out for size)."]
    return "\n".join(lines) + "\n"
