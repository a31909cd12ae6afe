"""How long the reports take to render over a big cluster, and how large they are.

    .venv/bin/python bench/report_size.py [--deployments 1000] [--containers 2] [--runs 3]
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
from unthrottle.metrics.advise import advise  # noqa: E402
from unthrottle.metrics.evidence import ContainerEvidence, WorkloadKey  # noqa: E402
from unthrottle.metrics.plots import ContainerSeries, step_for  # noqa: E402
from unthrottle.model.durations import parse_duration  # noqa: E402
from unthrottle.operator.reconcile import MARKDOWN_ROWS, PLOTTED  # noqa: E402
from unthrottle.operator.settings import OperatorSettings  # noqa: E402
from unthrottle.recommend import Current, Policy, Runtime, recommend  # noqa: E402
from unthrottle.recommend.histogram import evidence_from_histogram  # noqa: E402
from unthrottle.report import RenderOptions, Report, markdown, render  # noqa: E402
from unthrottle.report.thinning import CONFIGMAP_POINTS, thin  # noqa: E402
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult  # noqa: E402
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
    keys = set(plotted(result))
    return replace(result, workloads=tuple(
        replace(w, containers=tuple(
            replace(c, series=series[k]) if (k := WorkloadKey(w.namespace, w.deployment, c.name))
            in keys else c for c in w.containers))
        for w in result.workloads))  # fmt: skip


def _size(output: str | dict[str, str]) -> int:
    if isinstance(output, str):
        return len(output.encode())
    return sum(len(text.encode()) for text in output.values())


def _timed(runs: int, make: Callable[[], Any]) -> tuple[float, Any]:
    """The median seconds of ``runs`` calls, and the last call's answer."""
    seconds, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = make()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), out


def measure(result: ScanResult, runs: int) -> list[tuple[str, float, int]]:
    """(format, median seconds, bytes) for the report formats, and for the model itself."""
    secs, report = _timed(runs, lambda: Report.from_scan(
        result, window="7d", prometheus="http://prometheus:9090"))  # fmt: skip
    rows = [("model (from_scan)", secs, 0)]
    for fmt in ("markdown", "html", "json", "kustomize"):
        secs, output = _timed(runs, lambda fmt=fmt: render(report, fmt, RenderOptions()))
        rows.append((fmt, secs, _size(output)))
    return rows


COUNTER_FORMATS = (
    ("Markdown", "markdown", RenderOptions()),
    ("JSON", "json", RenderOptions()),
    ("HTML", "html", RenderOptions()),
    ("HTML, no plots", "html", RenderOptions(max_plots=0)),
)
"""(label, format, options) of the counters-only report."""


def _svgs(text: str) -> int:
    return text.count("<svg")


def measure_counters(result: ScanResult, runs: int, window: str) -> dict[str, Any]:
    """Render times, sizes and ``<svg>`` counts of a counters-only report with its series."""
    secs, report = _timed(runs, lambda: Report.from_scan(
        result, window=window, prometheus="http://prometheus:9090"))  # fmt: skip
    with_series = [c for w in report.workloads for c in w.containers if c.usage_series]
    out: dict[str, Any] = {
        "model_s": round(secs, 3),
        "containers_with_series": len(with_series),
        "series_step_s": with_series[0].series_step_s if with_series else None,
        "points_per_series": len(with_series[0].usage_series) if with_series else 0,
        "formats": {},
    }
    for label, fmt, options in COUNTER_FORMATS:
        secs, text = _timed(runs, lambda f=fmt, o=options: render(report, f, o))
        out["formats"][label] = {"s": round(secs, 3), "bytes": _size(text), "svg": _svgs(text)}
    return out


def _states(result: ScanResult) -> dict[str, str]:
    """The operator's states as a Recommend-mode policy would give them."""

    def state(w: WorkloadResult) -> str:
        if not any(c.recommendation for c in w.containers):
            return "NoData"
        return "UpToDate" if all(c.up_to_date() for c in w.containers
                                 if c.recommendation) else "Recommended"  # fmt: skip

    return {w.deployment: state(w) for w in result.workloads}


def configmap(result: ScanResult, runs: int, window: str) -> dict[str, Any]:
    """The operator's report ConfigMap as ``Reconciler._write_report`` builds it (thin, the
    histograms of the first :data:`PLOTTED` only, cut until report.json and report.md fit
    ``report_max_bytes``), and the HTML ``unthrottle report POLICY`` renders from it."""
    cap = OperatorSettings.__dataclass_fields__["report_max_bytes"].default
    states, title = _states(result), "unthrottle: policy bench/all"
    raw = json.dumps(dict(result.to_json(window), policy={"namespace": "bench", "name": "all"}),
                     separators=(",", ":"))  # fmt: skip
    thin_s, doc = _timed(runs, lambda: thin(result.to_json(window), CONFIGMAP_POINTS))
    doc["policy"] = {"namespace": "bench", "name": "all"}
    for rank, w in enumerate(doc["workloads"]):
        w["state"] = states.get(w["deployment"])
        if rank >= PLOTTED:
            for c in w["containers"]:
                c["histogram"] = []
    total = limit = len(doc["workloads"])
    cuts = 0
    while True:  # the reconcile's loop, as it is
        shown = dict(doc, workloads=doc["workloads"][:limit])
        if limit < total:
            shown["truncated"] = {"shown": limit, "left_out": total - limit}
        text_json = json.dumps(shown, separators=(",", ":"))
        text_md = markdown(result, title=title, states=states,
                           max_workloads=min(limit, MARKDOWN_ROWS))  # fmt: skip
        size = len(text_json) + len(text_md)
        if size <= cap or limit == 0:
            break
        cuts += 1
        limit = min(limit - 1, int(limit * cap / size * 0.9))
    thinned = [c for w in shown["workloads"] for c in w["containers"] if c.get("usage_series")]
    series_bytes = sum(len(json.dumps({k: c[k] for k in ("throttle_series", "usage_series")},
                                      separators=(",", ":"))) for c in thinned)  # fmt: skip
    html_s, html = _timed(runs, lambda: render(Report.from_json(json.loads(text_json)), "html",
                                               RenderOptions(title=title)))  # fmt: skip
    return {
        "cap_bytes": cap,
        "json_unthinned_bytes": len(raw),
        "thin_s": round(thin_s, 4),
        "json_bytes": len(text_json),
        "markdown_bytes": len(text_md),
        "total_bytes": size,
        "deployments_shown": limit,
        "deployments": total,
        "cuts": cuts,
        "containers_with_series": len(thinned),
        "points_per_series": len(thinned[0]["usage_series"]) if thinned else 0,
        "series_step_s": thinned[0].get("series_step_s") if thinned else None,
        "series_bytes": series_bytes,
        "html_from_configmap": {"s": round(html_s, 3), "bytes": len(html.encode()),
                                "svg": _svgs(html)},
    }  # fmt: skip


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def print_counters(c: dict[str, Any], cm: dict[str, Any], runs: int) -> None:
    """The counters-only tables for docs/benchmarks.md."""
    print(f"\ncounters only: {c['containers_with_series']} containers with series, "
          f"{c['points_per_series']} points at {c['series_step_s']} s; "
          f"model {c['model_s']:.2f} s")  # fmt: skip
    print(f"| format | render time (median of {runs}) | size | `<svg>` |")
    print("|---|---|---|---|")
    for fmt, row in c["formats"].items():
        print(f"| {fmt} | {row['s']:.2f} s | {_kib(row['bytes'])} | {row['svg']} |")
    h = cm["html_from_configmap"]
    print(f"| HTML from the ConfigMap ({cm['points_per_series']} points) | {h['s']:.2f} s | "
          f"{_kib(h['bytes'])} | {h['svg']} |")  # fmt: skip
    print(
        f"\nConfigMap: JSON {_kib(cm['json_unthinned_bytes'])} unthinned → "
        f"{_kib(cm['json_bytes'])} thinned ({cm['thin_s'] * 1000:.0f} ms; series "
        f"{_kib(cm['series_bytes'])}) + Markdown {_kib(cm['markdown_bytes'])} = "
        f"{_kib(cm['total_bytes'])} of {_kib(cm['cap_bytes'])}; "
        f"{cm['deployments_shown']} of {cm['deployments']} Deployments, {cm['cuts']} cuts"
    )


def main() -> None:
    """Print the tables for docs/benchmarks.md and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--containers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--window", default="24h", help="the counters-only report's window")
    parser.add_argument("--save", type=Path, default=RESULTS)
    args = parser.parse_args()
    began = started = time.perf_counter()
    result = synthetic(args.deployments, args.containers)
    report = Report.from_scan(result, window="7d")
    over = len(report.over_target())
    print(f"{args.deployments} Deployments, {args.deployments * args.containers} containers, "
          f"{over} over target (set-up {time.perf_counter() - started:.1f} s)")  # fmt: skip
    print(f"| format | render time (median of {args.runs}) | size |")
    print("|---|---|---|")
    rows = measure(result, args.runs)
    for fmt, secs, size in rows:
        print(f"| {fmt} | {secs:.2f} s | {size / 1024:,.0f} KiB |" if size else
              f"| {fmt} | {secs:.2f} s | |")  # fmt: skip
    started = time.perf_counter()
    window = args.window
    counters = counters_only(args.deployments, args.containers, window_s=parse_duration(window))
    over_c = len(Report.from_scan(counters, window=window).over_target())
    print(f"\ncounters only, {window} window: {over_c} over target "
          f"(set-up {time.perf_counter() - started:.1f} s)")  # fmt: skip
    c = measure_counters(counters, args.runs, window)
    cm = configmap(counters, args.runs, window)
    print_counters(c, cm, args.runs)
    total = time.perf_counter() - began
    print(f"\nwall {total:.0f} s")
    args.save.write_text(json.dumps({
        "measured": time.strftime("%Y-%m-%d"), "load_average": round(os.getloadavg()[0], 1),
        "deployments": args.deployments, "containers": args.deployments * args.containers,
        "runs": args.runs, "wall_s": round(total, 1),
        "histogram": {"window": "7d", "over_target": over,
                      "formats": {f: {"s": round(t, 3), "bytes": b} for f, t, b in rows}},
        "counters_only": {"window": window, "over_target": over_c, **c, "configmap": cm},
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
