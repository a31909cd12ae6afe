"""A report as Markdown, for a pull request comment or the operator's report ConfigMap.

Summary first (what is throttled, what changes, what it costs, the worst offenders),
then one table row per container of the Deployments with evidence, each container's
reasons folded under ``<details>``, and the Deployments without evidence apart, with why.
Every text that came from the cluster is escaped: it cannot open a link, an HTML tag or
a table cell of its own.
"""

from __future__ import annotations

import html

from unthrottle.report import units
from unthrottle.report.applied import APPLIED_NOTE, applied_rows
from unthrottle.report.model import Container, Report, Summary, Workload
from unthrottle.scan import ScanResult

_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]|#"})


def text(value: object) -> str:
    """Cluster text made inert: HTML escaped, Markdown specials and pipes backslashed,
    one line."""
    return html.escape(" ".join(str(value).split()), quote=False).translate(_SPECIAL)


def _provenance(report: Report) -> str:
    parts = [
        f"window {text(report.window)} ending {text(report.generated_at)}",
        f"target {report.target * 100:g} % of periods throttled",
    ]
    if report.prometheus:
        parts.append(f"Prometheus {text(report.prometheus)}")
    if report.policy:
        parts.append(f"policy {text(report.policy.namespace)}/{text(report.policy.name)}")
    return "\n>\n".join(["> " + " · ".join(parts), *(f"> note: {text(n)}" for n in report.notes)])


def _summary(report: Report, s: Summary) -> list[str]:
    lines = [
        "## Summary",
        "",
        f"- **{units.plural(s.deployments, report.noun)}**, "
        f"{units.plural(s.containers, 'container')}: **{s.over_target} over the target**; "
        f"{s.to_change} to change; {s.deployments - s.with_evidence} without evidence.",
        f"- CPU limit: **{units.signed_cpu(s.added_millicores)} added** "
        f"({units.plural(s.raised, 'container')}), "
        f"**{units.cpu(s.freed_millicores)} freed** ({units.plural(s.lowered, 'container')})"
        f", net {units.signed_cpu(s.added_millicores - s.freed_millicores)}"
        + (f"; {units.plural(s.newly_limited, 'container')} limited for the first time"
           if s.newly_limited else "") + ".",
    ]  # fmt: skip
    if s.worst:
        lines += ["- Worst offenders:"]
        for o in s.worst:
            rec = o.container.recommendation
            after = (f" → {units.expected(rec.expected_throttle_ratio, rec.expected_range())}"
                     " expected with "
                     f"{units.cpu(rec.limit_millicores)}"
                     + (f" + {units.burst(rec.burst_us)} burst" if rec.burst_us else "")
                     if rec else "")  # fmt: skip
            now = units.pct(o.container.throttle_ratio)
            lines.append(f"  1. {text(o.workload.key)} · {text(o.container.name)}: {now} of "
                         f"periods throttled{after}")  # fmt: skip
    if report.truncated:
        lines += ["", f"… and {report.truncated.left_out} more {report.noun}s, left out for size "
                      f"(only the {report.truncated.shown} most harmful are shown)."]  # fmt: skip
    return lines


def _row(w: Workload, c: Container, target: float) -> str:
    rec, now, demand = c.recommendation, c.current, c.demand
    throttled = units.pct(c.throttle_ratio)
    cells = [
        text(w.key) + (f" ({text(w.state)})" if w.state else ""),
        text(c.name) + ("" if c.managed else " (not managed)"),
        f"**{throttled}**" if c.over(target) else throttled,
        units.expected(rec.expected_throttle_ratio, rec.expected_range()) if rec else units.DASH,
        units.change(units.cpu(now.limit_millicores),
                     units.limit(rec.limit_millicores, rec.lower_limit_millicores))
        if rec and rec.limit_millicores is not None else units.cpu(now.limit_millicores),
        units.change(units.burst(now.burst_us), units.burst(rec.burst_us)) if rec
        else units.burst(now.burst_us),
        units.change(units.count(now.gomaxprocs), units.count(rec.gomaxprocs))
        if rec and rec.gomaxprocs is not None else units.count(now.gomaxprocs),
        " / ".join(units.cpu(v) for v in (demand.p50_millicores, demand.p99_millicores,
                                          demand.max_millicores)) if demand else units.DASH,
        f"{rec.confidence:.2f}" if rec else units.DASH,
        text(c.evidence),
        "yes" if c.change() else "no",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _reasons(w: Workload, c: Container) -> list[str]:
    rec = c.recommendation
    if rec is None:
        return []
    extra = f"; set -XX:ActiveProcessorCount={rec.jvm_processors}" if rec.jvm_processors else ""
    return [
        f"<details><summary>{text(w.key)} · {text(c.name)}: confidence "
        f"{rec.confidence:.2f}{extra}</summary>",
        "",
        *(f"- {text(r)}" for r in c.notes()),
        "",
        "</details>",
    ]


def render_markdown(report: Report, *, title: str | None = None) -> str:
    """The whole report as Markdown."""
    lines = [f"# {text(title or report.title())}", "", _provenance(report), ""]
    lines += _summary(report, report.summary())
    with_evidence = [w for w in report.workloads if w.has_evidence()]
    without = [w for w in report.workloads if not w.has_evidence()]
    if with_evidence:
        lines += [
            "",
            "## Recommendations",
            "",
            "Most harmful first. Throttled: share of periods today → expected; demand: CPU "
            "wanted per 100 ms window, p50 / p99 / largest. A limit shown with a range "
            "(`1640m (580m–1640m)`) was made from throttled data: it is an upper bound, the "
            "limit the demand itself asks for lies in the range, and the recommendation "
            "is refined from the unthrottled evidence once applied. On a shared node the "
            "expected share is a range too (`99.7 % (0.0–99.7 %)`): beside the same "
            "neighbours, and if the node goes quiet, the end the limit is sized to.",
            "",
            f"| {report.noun.capitalize()} | container | throttled | expected | limit | burst "
            "| GOMAXPROCS "
            "| demand p50 / p99 / max | confidence | evidence | changes |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [_row(w, c, report.target) for w in with_evidence for c in w.containers]
        lines += ["", "### Why", ""]
        for w in with_evidence:
            for c in w.containers:
                lines += _reasons(w, c)
    rows = list(applied_rows(report))
    if rows:
        lines += ["", "## What Apply changed", "", APPLIED_NOTE, "",
                  f"| {report.noun.capitalize()} | container | changed | when | method "
                  "| throttled before "
                  "| throttled after | verdict | why |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        lines += ["| " + " | ".join(text(cell) for cell in cells) + " |"
                  for *_, cells in rows]  # fmt: skip
    if without:
        lines += ["", "## Without evidence", "", f"| {report.noun.capitalize()} | containers "
                  "| why |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {text(w.key)} | {', '.join(text(c.name) for c in w.containers) or units.DASH}"
                  f" | {text(w.why_not())} |" for w in without]  # fmt: skip
    return "\n".join(lines) + "\n"


def markdown(result: ScanResult, *, title: str, states: dict[str, str] | None = None,
             max_workloads: int | None = None) -> str:  # fmt: skip
    """The operator's ``report.md``: a scan result as Markdown, the ``max_workloads`` most
    harmful Deployments (with a note on the rest)."""
    report = Report.from_scan(result, states=states).top(max_workloads)
    return render_markdown(report, title=title)
