"""How long the reports take to render over a big cluster, and how large they are.

    .venv/bin/python bench/report_size.py [--deployments 1000] [--containers 2] [--runs 5]
                                          [--window 24h] [--save bench/results/report-size.json]

A scan result of 1,000 Deployments with 2 containers each (2,000 containers), as the
scan would return it: each container has the agent's histogram of a demand shape
(bench/cluster_query.py's), real recommendations from the engine (24 shapes are
computed and shared, so the set-up stays short), one Deployment in twenty without
evidence. Markdown, HTML (plots for the 50 most harmed containers over target), JSON and
kustomize are rendered ``--runs`` times; the median time and the size are printed.
:func:`synthetic` is also what the report tests use for a big or odd report.

Then the same Deployments as a cluster without the node agent has them
(:func:`counters_only`): cAdvisor's counters over ``--window`` (default 24 h, the
policy's default), recommendations from the counters, and the counters step by step (at
``step_for(window)``) on the containers the report plots, as ``with_series`` attaches
them. Markdown, JSON and HTML are rendered, with the ``<svg>`` count; then the operator's
report ConfigMap is built as the reconcile builds it (``thin`` to
``CONFIGMAP_POINTS`` points, the cut to ``report_max_bytes``), and the HTML that
``unthrottle report POLICY`` renders from it. Everything is saved as JSON (``--save``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent)]
from cluster_query import cdf  # noqa: E402
from unthrottle.agent.sampling import BUCKETS_CORES  # noqa: E402
from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey  # noqa: E402
from unthrottle.evidence.plots import ContainerSeries, step_for  # noqa: E402
from unthrottle.model.durations import parse_duration  # noqa: E402
from unthrottle.operator.reconcile import MARKDOWN_ROWS, PLOTTED  # noqa: E402
from unthrottle.operator.settings import OperatorSettings  # noqa: E402
from unthrottle.recommend import Current, Policy, Runtime, recommend  # noqa: E402
from unthrottle.recommend.histogram import evidence_from_histogram  # noqa: E402
from unthrottle.report import RenderOptions, Report, markdown, render  # noqa: E402
from unthrottle.report.html import MAX_PLOTS  # noqa: E402
from unthrottle.report.thinning import CONFIGMAP_POINTS, thin  # noqa: E402
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult  # noqa: E402
from unthrottle.scan.advise import advise  # noqa: E402
from unthrottle.scan.result import Problem, ProblemKind  # noqa: E402
from unthrottle.scan.series import plotted  # noqa: E402

WEEK_WINDOWS = 7 * 86_400 * 10
BOUNDS = (*BUCKETS_CORES, math.inf)
NOW = 1_796_000_000.0  # a fixed clock: the same report every run
RESULTS = Path(__file__).resolve().parent / "results" / "report-size.json"
PODS = 3
ACTIVE = 0.9
"""Share of a pod's CFS periods in which it ran (the counters count only those)."""


def _shape(i: int) -> tuple[float, float, float, float]:
    """(base cores, burst share, burst cores, limit cores): a spread of throttling."""
    base = (0.05, 0.1, 0.2, 0.4)[i % 4]
    share = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)[i % 6]
    burst = (0.6, 1.2, 2.0)[i % 3]
    limit = (0.25, 0.5, 1.0, 2.0)[(i // 4) % 4]
    return base, share, burst, limit


def _container(i: int, name: str, policy: Policy, cache: dict[int, ContainerResult]) -> (
    ContainerResult
):  # fmt: skip
    key = i % 24
    if key not in cache:
        base, share, burst, limit = _shape(key)
        cumulative = tuple(WEEK_WINDOWS * cdf(base, share, burst, b) for b in BOUNDS)
        evidence = evidence_from_histogram(BOUNDS, cumulative, period_us=100_000)
        runtime = Runtime.GO if key % 3 == 0 else Runtime.OTHER
        millicores = round(limit * 1000)
        rec = recommend(evidence, Current(millicores, millicores // 2, runtime=runtime), policy)
        demand = evidence.demand_us // 100  # µs per 100 ms → millicores
        cache[key] = ContainerResult(
            name=name, limit_millicores=millicores, request_millicores=millicores // 2,
            burst_us=0, gomaxprocs_env=None, runtime=runtime, evidence="period", pods=3,
            throttle_ratio=1 - cdf(base, share, burst, limit),
            demand={"p50_millicores": int(_pct(demand, 50)),
                    "p99_millicores": int(_pct(demand, 99)), "max_millicores": int(demand.max())},
            recommendation=rec, histogram=tuple(zip(BOUNDS, cumulative, strict=True)),
        )  # fmt: skip
    return replace(cache[key], name=name)


def _pct(values: object, q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q))  # type: ignore[call-overload]


def synthetic(deployments: int = 1000, containers: int = 2, *, target: float = 0.05) -> ScanResult:
    """A scan result of ``deployments`` × ``containers``, most harmful first."""
    policy = Policy(target_ratio=target)
    cache: dict[int, ContainerResult] = {}
    names = ("app", "sidecar", "proxy", "worker")
    workloads = []
    for d in range(deployments):
        ns, name = f"team-{d % 40:02d}", f"app-{d:04d}"
        if d % 20 == 19:  # no evidence: idle, or not scraped
            cs = tuple(ContainerResult(n, 500, 250, 0, None, Runtime.UNKNOWN, "none", 1, None,
                                       None, None) for n in names[:containers])  # fmt: skip
        else:
            cs = tuple(_container(d * containers + c, names[c % 4], policy, cache)
                       for c in range(containers))  # fmt: skip
        workloads.append(WorkloadResult(ns, name, cs, labels={"team": ns}))
    workloads.sort(key=lambda w: (-w.harm(target), w.namespace, w.deployment))
    return ScanResult(NOW, 7 * 86_400, target, tuple(workloads))


# -- counters only: what a cluster without the node agent gives -----------------------------


def _used_cores(i: int) -> float:
    """The mean CPU a shape uses per pod, cores: its demand, cut at the limit."""
    base, share, burst, limit = _shape(i % 24)
    return (1 - share) * min(base, limit) + share * min(burst, limit)


def _series(i: int, end: float, window_s: int) -> ContainerSeries:
    """A container's counters step by step: its shape's throttle ratio and usage, swung by
    a day's rhythm (a phase of its own) and noise, summed over :data:`PODS` pods."""
    step = step_for(window_s)
    rng = np.random.default_rng(i)
    times = np.arange(end - window_s + step, end + 1, step, dtype=float)
    phase = rng.uniform(0, 86_400)
    swing = 1 + 0.6 * np.sin(2 * np.pi * (times - phase) / 86_400)
    busy = np.clip(swing + rng.normal(0, 0.15, times.size), 0.05, None)
    base, share, burst, limit = _shape(i % 24)
    ratio = np.clip((1 - cdf(base, share, burst, limit)) * busy, 0, 1)
    periods = np.full(times.size, PODS * ACTIVE * step / 0.1)
    used = np.minimum(_used_cores(i) * busy, limit)
    peak = np.minimum(used * rng.uniform(1.2, 1.6, times.size), limit)
    return ContainerSeries(step, times.tolist(), periods.tolist(), (ratio * periods).tolist(),
                           used.tolist(), peak.tolist())  # fmt: skip


def _counter_container(i: int, name: str, policy: Policy, series: ContainerSeries,
                       window_s: int) -> ContainerResult:  # fmt: skip
    """A container whose evidence is the window's totals of ``series`` (no histogram)."""
    _, share, burst, limit = _shape(i % 24)
    millicores = round(limit * 1000)
    item = ContainerEvidence(
        WorkloadKey("", "", name), pods={f"p{n}" for n in range(PODS)},
        usage_s=sum(series.usage_cores) * PODS * series.step_s,
        periods=sum(series.periods), throttled_periods=sum(series.throttled),
        # a throttled period waits out what its burst wanted beyond the quota
        throttled_s=sum(series.throttled) * 0.1 * (1 - min(1.0, limit / burst)) if share else 0.0,
        limit_millicores=millicores, request_millicores=millicores // 2,
    )  # fmt: skip
    runtime = Runtime.GO if i % 3 == 0 else Runtime.OTHER
    rec = advise((item, Current(millicores, millicores // 2, runtime=runtime), policy, window_s))
    return ContainerResult(
        name=name, limit_millicores=millicores, request_millicores=millicores // 2, burst_us=0,
        gomaxprocs_env=None, runtime=runtime, evidence=item.kind, pods=PODS,
        throttle_ratio=item.throttle_ratio(), demand=None, recommendation=rec,
    )  # fmt: skip


def counters_only(deployments: int = 1000, containers: int = 2, *, target: float = 0.05,
                  window_s: int = 86_400) -> ScanResult:  # fmt: skip
    """:func:`synthetic`'s Deployments as a cluster without the node agent shows them:
    cAdvisor's counters over ``window_s``, recommendations from the counters, and the
    series of the plotted containers (the 50 most harmed over target) at
    ``step_for(window_s)``, as ``with_series`` attaches them."""
    policy = Policy(target_ratio=target)
    names = ("app", "sidecar", "proxy", "worker")
    workloads = []
    series: dict[WorkloadKey, ContainerSeries] = {}
    for d in range(deployments):
        ns, name = f"team-{d % 40:02d}", f"app-{d:04d}"
        if d % 20 == 19:  # no evidence: idle, or not scraped
            cs = tuple(ContainerResult(n, 500, 250, 0, None, Runtime.UNKNOWN, "none", 1, None,
                                       None, None) for n in names[:containers])  # fmt: skip
        else:
            made = []
            for c in range(containers):
                i, key = d * containers + c, WorkloadKey(ns, name, names[c % 4])
                series[key] = _series(i, NOW, window_s)
                made.append(_counter_container(i, key.container, policy, series[key], window_s))
            cs = tuple(made)
        workloads.append(WorkloadResult(ns, name, cs, labels={"team": ns}))
    workloads.sort(key=lambda w: (-w.harm(target), w.namespace, w.deployment))
    note = Problem(ProblemKind.COUNTERS_ONLY, "no unthrottle agent series; recommending from "
                   "cAdvisor counters (coarse: 15-60 s samples cannot show 100 ms bursts), at "
                   "a CFS period of 100 ms (the default)")  # fmt: skip
    result = ScanResult(NOW, window_s, target, tuple(workloads), (note,))
    keys = set(plotted(result))  # the containers with_series reads the series of
    attached = []
    for w in result.workloads:
        cs = []
        for c in w.containers:
            key = WorkloadKey(w.namespace, w.deployment, c.name)
            cs.append(replace(c, series=series[key]) if key in keys else c)
        attached.append(replace(w, containers=tuple(cs)))
    return replace(result, workloads=tuple(attached))


def _size(output: str | dict[str, str]) -> int:
    if isinstance(output, str):
        return len(output.encode())
    return sum(len(text.encode()) for text in output.values())


def _timed(runs: int, make: Callable[[], Any]) -> tuple[list[float], Any]:
    """The seconds of ``runs`` calls, and the last call's answer."""
    seconds, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = make()
        seconds.append(time.perf_counter() - started)
    return seconds, out


def _row(seconds: list[float], output: str | dict[str, str] | None = None) -> dict[str, Any]:
    """Median and every run's seconds; the output's bytes and ``<svg>`` elements."""
    row: dict[str, Any] = {"s": round(statistics.median(seconds), 3),
                           "runs_s": [round(x, 3) for x in seconds]}  # fmt: skip
    if output is not None:
        row["bytes"] = _size(output)
        row["svg"] = output.count("<svg") if isinstance(output, str) else 0
    return row


GITHUB_COMMENT_CHARS = 65_536
"""The longest comment GitHub takes, characters."""


def comment_fit(report: Report) -> dict[str, int]:
    """Characters of ``recommend --top N --format markdown`` at 25 and 50, and the largest
    ``--top`` whose Markdown fits one GitHub comment."""

    def chars(n: int) -> int:
        text = render(report.top(n), "markdown")
        assert isinstance(text, str)
        return len(text)

    low, high = 0, len(report.workloads)
    while low < high:  # the largest n with chars(n) <= the limit
        mid = (low + high + 1) // 2
        low, high = (mid, high) if chars(mid) <= GITHUB_COMMENT_CHARS else (low, mid - 1)
    return {"top_25_chars": chars(25), "top_50_chars": chars(50), "largest_top_that_fits": low}


def measure(result: ScanResult, runs: int) -> dict[str, dict[str, Any]]:
    """Each report format's render time, bytes and plots, and the model's build time."""
    seconds, report = _timed(runs, lambda: Report.from_scan(
        result, window="7d", prometheus="http://prometheus:9090"))  # fmt: skip
    rows = {"model (from_scan)": _row(seconds)}
    for label, fmt, options in HISTOGRAM_FORMATS:
        seconds, output = _timed(runs, lambda f=fmt, o=options: render(report, f, o))
        rows[label] = _row(seconds, output)
    return rows


HISTOGRAM_FORMATS = (
    ("Markdown", "markdown", RenderOptions()),
    ("HTML, 50 plots", "html", RenderOptions()),
    ("HTML, no plots (`max_plots=0`)", "html", RenderOptions(max_plots=0)),
    ("JSON (`indent=2`)", "json", RenderOptions()),
    ("kustomize", "kustomize", RenderOptions()),
)
"""(label, format, options) of the report with the agent's histograms."""
COUNTER_FORMATS = (
    ("Markdown", "markdown", RenderOptions(), True),
    ("JSON (`indent=2`)", "json", RenderOptions(), True),
    ("JSON (`indent=2`) without the series", "json", RenderOptions(), False),
    ("HTML, 50 containers plotted", "html", RenderOptions(), True),
    ("HTML, no plots (`max_plots=0`)", "html", RenderOptions(max_plots=0), True),
)
"""(label, format, options, with the series?) of the counters-only report."""


def measure_counters(result: ScanResult, runs: int, window: str) -> dict[str, Any]:
    """Render times, sizes and ``<svg>`` counts of a counters-only report with its series."""
    seconds, report = _timed(runs, lambda: Report.from_scan(
        result, window=window, prometheus="http://prometheus:9090"))  # fmt: skip
    plotted_ = [c for w in report.workloads for c in w.containers if c.usage_series]
    bare = Report.from_scan(without_series(result), window=window,
                            prometheus="http://prometheus:9090")  # fmt: skip
    rows = {"model (from_scan)": _row(seconds)}
    for label, fmt, options, series in COUNTER_FORMATS:
        seconds, output = _timed(runs, lambda f=fmt, o=options, r=report if series else bare:
                                 render(r, f, o))  # fmt: skip
        rows[label] = _row(seconds, output)
    return {
        "containers_with_series": len(plotted_),
        "series_step_s": plotted_[0].series_step_s if plotted_ else None,
        "points_per_series": len(plotted_[0].usage_series) if plotted_ else 0,
        "formats": rows,
    }


def without_series(result: ScanResult) -> ScanResult:
    """The result as a report without plots has it."""
    return replace(result, workloads=tuple(
        replace(w, containers=tuple(replace(c, series=None) for c in w.containers))
        for w in result.workloads))  # fmt: skip


def _states(result: ScanResult) -> dict[str, str]:
    """The operator's states as a Recommend-mode policy would give them."""

    def state(w: WorkloadResult) -> str:
        if not any(c.recommendation for c in w.containers):
            return "NoData"
        return "UpToDate" if all(c.up_to_date() for c in w.containers
                                 if c.recommendation) else "Recommended"  # fmt: skip

    return {w.deployment: state(w) for w in result.workloads}


POLICY = {"namespace": "bench", "name": "all"}
TITLE = "unthrottle: policy bench/all"


def configmap(result: ScanResult, window: str, *,
              max_points: int | None = CONFIGMAP_POINTS) -> tuple[dict[str, Any], str]:  # fmt: skip
    """The operator's report ConfigMap as ``Reconciler._write_report`` builds it: series
    thinned to ``max_points`` (None: not thinned), histograms past the first
    :data:`PLOTTED` Deployments dropped, then cut until report.json and report.md fit
    ``report_max_bytes``. Its figures, and its report.json."""
    cap = OperatorSettings.__dataclass_fields__["report_max_bytes"].default
    states = _states(result)
    doc = result.to_json(window)
    started = time.perf_counter()
    if max_points is not None:
        thin(doc, max_points)
    thin_s = time.perf_counter() - started
    doc["policy"] = POLICY
    for rank, w in enumerate(doc["workloads"]):
        w["state"] = states.get(w["deployment"])
        if rank >= PLOTTED:
            for c in w["containers"]:
                c["histogram"] = []
    total = limit = len(doc["workloads"])
    whole = len(json.dumps(doc, separators=(",", ":")))
    cuts = 0
    while True:  # the reconcile's loop, as it is
        shown = dict(doc, workloads=doc["workloads"][:limit])
        if limit < total:
            shown["truncated"] = {"shown": limit, "left_out": total - limit}
        text_json = json.dumps(shown, separators=(",", ":"))
        text_md = markdown(result, title=TITLE, states=states,
                           max_workloads=min(limit, MARKDOWN_ROWS))  # fmt: skip
        size = len(text_json) + len(text_md)
        if size <= cap or limit == 0:
            break
        cuts += 1
        limit = min(limit - 1, int(limit * cap / size * 0.9))
    drawn = [c for w in shown["workloads"] for c in w["containers"] if c.get("usage_series")]
    series_bytes = sum(len(json.dumps({k: c[k] for k in ("throttle_series", "usage_series")},
                                      separators=(",", ":"))) for c in drawn)  # fmt: skip
    return {
        "cap_bytes": cap, "thin_s": round(thin_s, 3), "json_all_deployments_bytes": whole,
        "json_bytes": len(text_json), "markdown_bytes": len(text_md), "total_bytes": size,
        "deployments_shown": limit, "deployments": total, "cuts": cuts,
        "containers_with_series": len(drawn),
        "points_per_series": len(drawn[0]["usage_series"]) if drawn else 0,
        "series_step_s": drawn[0].get("series_step_s") if drawn else None,
        "series_bytes": series_bytes,
    }, text_json  # fmt: skip


def configmaps(result: ScanResult, runs: int, window: str) -> dict[str, Any]:
    """The ConfigMap as the operator writes it (thinned), and as it would be with the
    series whole or without them; the HTML ``unthrottle report POLICY`` renders from the
    first."""
    written, text_json = configmap(result, window)
    report = Report.from_json(json.loads(text_json))
    html = {}
    for label, plots in (("html_from_configmap", MAX_PLOTS), ("html_from_configmap_no_plots", 0)):
        seconds, text = _timed(runs, lambda n=plots: render(
            report, "html", RenderOptions(title=TITLE, max_plots=n)))  # fmt: skip
        html[label] = _row(seconds, text)
    return {
        "thinned": written,
        "not thinned": configmap(result, window, max_points=None)[0],
        "no series": configmap(without_series(result), window)[0],
        **html,
    }


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def print_formats(rows: dict[str, dict[str, Any]], runs: int) -> None:
    """A table of formats: render time, size, plots."""
    print(f"| format | render time (median of {runs}) | size | `<svg>` |")
    print("|---|---|---|---|")
    for label, row in rows.items():
        size = _kib(row["bytes"]) if "bytes" in row else ""
        print(f"| {label} | {row['s']:.2f} s | {size} | {row.get('svg', '')} |")


def print_fit(fit: dict[str, int]) -> None:
    """What of the Markdown fits a GitHub comment."""
    print(f"Markdown --top 25: {fit['top_25_chars']:,} characters, --top 50: "
          f"{fit['top_50_chars']:,}; a GitHub comment ({GITHUB_COMMENT_CHARS:,}) holds "
          f"--top {fit['largest_top_that_fits']}")  # fmt: skip


def print_configmaps(cms: dict[str, Any]) -> None:
    """The ConfigMap table."""
    cap = next(iter(cms.values()))["cap_bytes"]
    print(
        f"| series in the ConfigMap (cap {_kib(cap)}) | points × step | report.json, all "
        "Deployments | report.json + report.md written | Deployments shown | series |"
    )
    print("|---|---|---|---|---|---|")
    for label in ("thinned", "not thinned", "no series"):
        cm = cms[label]
        points = (f"{cm['points_per_series']} × {cm['series_step_s'] // 60} min"
                  if cm["points_per_series"] else "")  # fmt: skip
        print(
            f"| {label} | {points} | {_kib(cm['json_all_deployments_bytes'])} | "
            f"{_kib(cm['json_bytes'])} + {_kib(cm['markdown_bytes'])} | "
            f"{cm['deployments_shown']} of {cm['deployments']} | {_kib(cm['series_bytes'])} |"
        )


def main() -> None:
    """Print the tables for docs/benchmarks.md and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--containers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--window", default="24h", help="the counters-only report's window")
    parser.add_argument("--save", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    began = started = time.perf_counter()
    result = synthetic(args.deployments, args.containers)
    over = len(Report.from_scan(result, window="7d").over_target())
    print(f"{args.deployments} Deployments, {args.deployments * args.containers} containers, "
          f"{over} over target (set-up {time.perf_counter() - started:.1f} s)")  # fmt: skip
    rows = measure(result, args.runs)
    print_formats(rows, args.runs)
    fit = comment_fit(Report.from_scan(result, window="7d", prometheus="http://prometheus:9090"))
    print_fit(fit)
    started = time.perf_counter()
    counters = counters_only(args.deployments, args.containers,
                             window_s=parse_duration(args.window))  # fmt: skip
    over_c = len(Report.from_scan(counters, window=args.window).over_target())
    setup = time.perf_counter() - started
    c = measure_counters(counters, args.runs, args.window)
    print(f"\ncounters only, {args.window} window: {over_c} over target, "
          f"{c['containers_with_series']} with series of {c['points_per_series']} points at "
          f"{c['series_step_s']} s (set-up {setup:.1f} s)")  # fmt: skip
    cms = configmaps(counters, args.runs, args.window)
    shown = cms["thinned"]["deployments_shown"]
    print_formats({**c["formats"], f"HTML from the ConfigMap's report.json ({shown} "
                   f"Deployments, {cms['thinned']['points_per_series']} points)":
                   cms["html_from_configmap"], "… no plots": cms["html_from_configmap_no_plots"],
                   }, args.runs)  # fmt: skip
    fit_c = comment_fit(Report.from_scan(counters, window=args.window,
                                         prometheus="http://prometheus:9090"))  # fmt: skip
    print_fit(fit_c)
    print()
    print_configmaps(cms)
    total = time.perf_counter() - began
    load = (round(load_before, 1), round(os.getloadavg()[0], 1))
    print(f"\nwall {total:.0f} s, load average {load[0]} → {load[1]}")
    args.save.write_text(json.dumps({
        "measured": time.strftime("%Y-%m-%d"), "load_average": load,
        "deployments": args.deployments, "containers": args.deployments * args.containers,
        "runs": args.runs, "wall_s": round(total, 1),
        "histogram": {"window": "7d", "over_target": over, "formats": rows,
                      "github_comment": fit},
        "counters_only": {"window": args.window, "over_target": over_c, **c,
                          "github_comment": fit_c, "configmap": cms},
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
