"""A report as one self-contained HTML page: the Markdown's content, a table sortable by
harm, and plots for the containers over target (the ``max_plots`` most harmed).

Jinja2 with autoescaping on lays the page out; everything here is turned into plain
strings first, so every name, label and reason from the cluster is escaped by the
template. The only markup not escaped is the plots' SVG, which matplotlib draws from
numbers (names reach it only through the escaped title and description).
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
from markupsafe import Markup

from unthrottle import __version__
from unthrottle.report import page, units
from unthrottle.report.applied import APPLIED_NOTE, applied_rows
from unthrottle.report.model import Container, Report, Workload

MAX_PLOTS = 50
"""Containers over target that get plots: beyond 50 a page stops being read, and each
plot costs about 50 ms and 15 kB."""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_PAGE = _ENV.from_string(page.TEMPLATE)
COLUMNS = (  # (header, sort as, alignment)
    ("rank", "number", "n"), ("Deployment", "text", ""), ("container", "text", ""),
    ("throttled", "number", "n"), ("expected", "number", "n"), ("limit", "number", "n"),
    ("burst", "number", "n"), ("GOMAXPROCS", "number", "n"),
    ("demand p50 / p99 / max", "number", "n"), ("confidence", "number", "n"),
    ("evidence", "text", ""), ("why", "number", ""),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Cell:
    """One table cell: its text and the key it sorts by."""

    text: str
    sort: str
    numeric: bool = False
    anchor: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One container's row."""

    cells: tuple[Cell, ...]
    reasons: tuple[str, ...]
    over: bool


def _num(text: str, value: float | None, anchor: str = "") -> Cell:
    return Cell(text, "-1" if value is None else f"{value:.6g}", True, anchor)


def _row(rank: int, w: Workload, c: Container, target: float, anchor: str) -> Row:
    rec, now, d = c.recommendation, c.current, c.demand
    limit = rec.limit_millicores if rec else None
    state = f" ({w.state})" if w.state else ""
    cells = (
        _num(str(rank), rank, anchor),  # the report's order: most harmful first
        Cell(w.key + state, w.key),
        Cell(c.name + ("" if c.managed else " (not managed)"), c.name),
        _num(units.pct(c.throttle_ratio), c.throttle_ratio),
        _num(units.expected(rec.expected_throttle_ratio, rec.expected_range()) if rec
             else units.DASH,
             rec.expected_throttle_ratio if rec else None),
        _num(units.change(units.cpu(now.limit_millicores),
                          units.limit(limit, rec.lower_limit_millicores if rec else None))
             if limit is not None else units.cpu(now.limit_millicores),
             limit if limit is not None else now.limit_millicores),  # sorts by the new limit
        _num(units.change(units.burst(now.burst_us), units.burst(rec.burst_us)) if rec
             else units.burst(now.burst_us), rec.burst_us if rec else now.burst_us),
        _num(units.change(units.count(now.gomaxprocs), units.count(rec.gomaxprocs))
             if rec and rec.gomaxprocs else units.count(now.gomaxprocs),
             rec.gomaxprocs if rec and rec.gomaxprocs else now.gomaxprocs),
        _num(" / ".join(units.cpu(v) for v in (d.p50_millicores, d.p99_millicores,
                                               d.max_millicores)) if d else units.DASH,
             d.p99_millicores if d else None),  # sorts by p99
        _num(f"{rec.confidence:.2f}" if rec else units.DASH, rec.confidence if rec else None),
        Cell(c.evidence, c.evidence),
    )  # fmt: skip
    return Row(cells, c.notes(), c.over(target))


def _alt(w: Workload, c: Container) -> str:
    rec, d = c.recommendation, c.demand
    parts = [f"Demand per 100 ms window of {c.name} in {w.key}" if d is not None
             else f"{c.name} in {w.key}, from the kernel's counters"]  # fmt: skip
    if d is not None:
        parts.append(f"median {units.cpu(d.p50_millicores)}, p99 {units.cpu(d.p99_millicores)}, "
                     f"largest {units.cpu(d.max_millicores)}")  # fmt: skip
    parts.append(f"today's limit {units.cpu(c.current.limit_millicores)}, "
                 f"{units.pct(c.throttle_ratio)} of periods throttled")  # fmt: skip
    if rec is not None:
        bounds = rec.limit_range()
        parts.append(f"recommended {units.cpu(rec.limit_millicores)}"
                     + (f" (an upper bound: what the demand itself asks for is "
                        f"between {units.cpu(bounds[0])} and {units.cpu(bounds[1])})"
                        if bounds else "")
                     + (f" with a {units.burst(rec.burst_us)} burst" if rec.burst_us else "")
                     + f", {units.pct(rec.expected_throttle_ratio)} expected")  # fmt: skip
    return "; ".join(parts) + "."


def _usage_alt(w: Workload, c: Container) -> str:
    points = c.usage_series
    peak = max((p.peak for p in points), default=0.0)
    mean = sum(p.cores for p in points) / len(points) if points else 0.0
    rec = c.recommendation
    return (f"CPU used by {c.name} in {w.key} over the window: {mean:.2f} cores per pod on "
            f"average, the busiest pod at most {peak:.2f} cores in a "
            f"{units.duration(c.series_step_s or 0)} step; today's limit "
            f"{units.cpu(c.current.limit_millicores)}"
            + (f", recommended {units.cpu(rec.limit_millicores)}" if rec else "")
            + ". Samples 15-60 s apart average sub-second bursts away, so the limit sits "
            "above the usage line.")  # fmt: skip


def _throttle_alt(c: Container, target: float) -> str:
    points = c.throttle_series
    worst = max((p.ratio for p in points), default=0.0)
    above = sum(1 for p in points if p.ratio > target)
    return (f"Share of periods throttled over the window, against the target of "
            f"{target * 100:g} %: at most {units.pct(worst)} in a step, above the target in "
            f"{above} of {len(points)} steps.")  # fmt: skip


def _plots(over: list[tuple[Workload, Container]], anchors: dict[tuple[str, str], str],
           target: float) -> list[dict[str, object]]:  # fmt: skip
    from unthrottle.report.plots import (  # matplotlib: here only
        Plot,
        demand_plot,
        throttle_plot,
        usage_plot,
    )

    out: list[dict[str, object]] = []
    for w, c in over:
        anchor = anchors[(w.key, c.name)]
        drawn: list[Plot] = []
        title = f"Demand of {c.name} in {w.key} against today's and the recommended limit"
        demand = (demand_plot(c, prefix=f"{anchor}-d", title=title, alt=_alt(w, c))
                  if c.histogram or not c.usage_series else None)  # fmt: skip
        if demand is not None:
            drawn.append(demand)
        series = throttle_plot(c, target, prefix=f"{anchor}-t",
                               title=f"Throttling of {c.name} in {w.key} over the window",
                               alt=_throttle_alt(c, target))  # fmt: skip
        if series is not None:
            drawn.append(series)
        usage = usage_plot(c, prefix=f"{anchor}-u",
                           title=f"CPU used by {c.name} in {w.key} against today's and the "
                                 "recommended limit", alt=_usage_alt(w, c))  # fmt: skip
        if usage is not None:
            drawn.append(usage)
        out.append({"anchor": anchor, "key": w.key, "container": c.name, "plots": drawn,
                    "figures": _alt(w, c)})  # fmt: skip
    return out


APPLIED_COLUMNS = ("Deployment", "container", "changed", "when", "method",
                   "throttled before", "throttled after", "verdict", "why")  # fmt: skip


def _applied(report: Report) -> list[dict[str, object]]:
    """One row (and a before/after plot) per container Apply changed."""
    from unthrottle.report.plots import applied_plot  # matplotlib: here only

    out: list[dict[str, object]] = []
    for i, (w, a, ac, cells) in enumerate(applied_rows(report)):
        c = next((x for x in w.containers if x.name == ac.name), None)
        plot = None
        if c is not None:
            plot = applied_plot(
                c.throttle_series, at=a.at, after_from=ac.after_from, target=report.target,
                prefix=f"a{i + 1}", title=f"Throttling of {ac.name} in {w.key} before and "
                f"after the change of {cells[3]}",
                alt=f"Share of periods throttled before and after the change ({cells[2]}), "
                f"the change marked: {cells[5]} before, {cells[6]} after; {cells[7]}.",
            )  # fmt: skip
        out.append({"cells": cells, "plot": plot})
    return out


def render_html(report: Report, *, title: str | None = None, max_plots: int = MAX_PLOTS) -> str:
    """The whole report as one HTML page."""
    s = report.summary()
    over = report.over_target()
    anchors = {(w.key, c.name): f"c{i + 1}" for i, (w, c) in enumerate(over[:max_plots])}
    rows: list[Row] = []
    for w in report.workloads:
        if w.has_evidence():
            for c in w.containers:
                anchor = anchors.get((w.key, c.name), "")
                rows.append(_row(len(rows) + 1, w, c, report.target, anchor))
    plots = _plots(over[:max_plots], anchors, report.target)
    provenance = [f"window {report.window} ending {report.generated_at}",
                  f"target {report.target * 100:g} % of periods throttled"]  # fmt: skip
    if report.prometheus:
        provenance.append(f"Prometheus {report.prometheus}")
    if report.policy:
        provenance.append(f"policy {report.policy.namespace}/{report.policy.name}")
    figures = [
        (f"{report.noun.capitalize()}s", str(s.deployments)),
        ("containers", str(s.containers)),
        ("over target", str(s.over_target)),
        ("to change", str(s.to_change)),
        ("CPU limit added", units.signed_cpu(s.added_millicores)),
        ("CPU limit freed", units.cpu(s.freed_millicores)),
        ("net", units.signed_cpu(s.added_millicores - s.freed_millicores)),
        ("without evidence", str(s.deployments - s.with_evidence)),
    ]
    worst = []
    for o in s.worst:
        rec = o.container.recommendation
        after = (f" → {units.expected(rec.expected_throttle_ratio, rec.expected_range())}"
                 " expected with "
                 f"{units.cpu(rec.limit_millicores)}"
                 + (f" + {units.burst(rec.burst_us)} burst" if rec.burst_us else "")
                 if rec else "")  # fmt: skip
        anchor = anchors.get((o.workload.key, o.container.name), "recommendations")
        worst.append({"anchor": anchor,
                      "key": o.workload.key, "container": o.container.name,
                      "now": units.pct(o.container.throttle_ratio), "after": after})  # fmt: skip
    truncated = (f"… and {report.truncated.left_out} more {report.noun}s, left out for size (only "
                 f"the {report.truncated.shown} most harmful are shown)."
                 if report.truncated else "")  # fmt: skip
    plots_note = (f"Plots for the {len(plots)} most harmed of {len(over)} containers over "
                  "target." if len(over) > len(plots) else f"Plots for the {len(over)} "
                  "containers over target.")  # fmt: skip
    plots_note += (
        " Demand (from the node agent): windows right of today's limit (dashed) are "
        "the throttled ones. Throttling and CPU used over the window come from "
        "the kernel's counters, as cAdvisor exports them."
    )
    without = [{"key": w.key, "containers": ", ".join(c.name for c in w.containers) or units.DASH,
                "why": w.why_not()} for w in report.workloads if not w.has_evidence()]  # fmt: skip
    return _PAGE.render(
        title=title or report.title(), csp=page.CSP, css=Markup(page.CSS),
        script=Markup(page.SCRIPT), provenance=provenance, figures=figures,
        worst=worst, truncated=truncated, plots=plots, noun=report.noun.capitalize(),
        columns=[(report.noun.capitalize() if h == "Deployment" else h, *rest)
                 for h, *rest in COLUMNS], rows=rows,
        plots_note=plots_note, without=without, version=__version__, notes=report.notes,
        applied=_applied(report), applied_note=APPLIED_NOTE, applied_columns=[
            report.noun.capitalize() if h == "Deployment" else h for h in APPLIED_COLUMNS],
    )  # fmt: skip
