"""How long the reports take to render over a big cluster, and how large they are.

    .venv/bin/python bench/report_size.py [--deployments 1000] [--containers 2] [--runs 3]

A scan result of 1,000 Deployments with 2 containers each (2,000 containers), as the
scan would return it: each container has the agent's histogram of a demand shape
(bench/cluster_query.py's), real recommendations from the engine (24 shapes are
computed and shared, so the set-up stays short), one Deployment in twenty without
evidence. Markdown, HTML (plots for the 50 most harmed containers over target), JSON and
kustomize are rendered ``--runs`` times; the median time and the size are printed.
:func:`synthetic` is also what the report tests use for a big or odd report.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]
from cluster_query import cdf  # noqa: E402
from unthrottle.agent.sampling import BUCKETS_CORES  # noqa: E402
from unthrottle.recommend import Current, Policy, Runtime, recommend  # noqa: E402
from unthrottle.recommend.histogram import evidence_from_histogram  # noqa: E402
from unthrottle.report import RenderOptions, Report, render  # noqa: E402
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult  # noqa: E402

WEEK_WINDOWS = 7 * 86_400 * 10
BOUNDS = (*BUCKETS_CORES, math.inf)
NOW = 1_796_000_000.0  # a fixed clock: the same report every run


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


def _size(output: str | dict[str, str]) -> int:
    if isinstance(output, str):
        return len(output.encode())
    return sum(len(text.encode()) for text in output.values())


def measure(result: ScanResult, runs: int) -> list[tuple[str, float, int]]:
    """(format, median seconds, bytes) for the report formats, and for the model itself."""
    rows = []
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        report = Report.from_scan(result, window="7d", prometheus="http://prometheus:9090")
        seconds.append(time.perf_counter() - started)
    rows.append(("model (from_scan)", statistics.median(seconds), 0))
    for fmt in ("markdown", "html", "json", "kustomize"):
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            output = render(report, fmt, RenderOptions())
            seconds.append(time.perf_counter() - started)
        rows.append((fmt, statistics.median(seconds), _size(output)))
    return rows


def main() -> None:
    """Print the table for docs/benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--containers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    result = synthetic(args.deployments, args.containers)
    report = Report.from_scan(result, window="7d")
    over = len(report.over_target())
    print(f"{args.deployments} Deployments, {args.deployments * args.containers} containers, "
          f"{over} over target (set-up {time.perf_counter() - started:.1f} s)")  # fmt: skip
    print(f"| format | render time (median of {args.runs}) | size |")
    print("|---|---|---|")
    for fmt, secs, size in measure(result, args.runs):
        print(f"| {fmt} | {secs:.2f} s | {size / 1024:,.0f} KiB |" if size else
              f"| {fmt} | {secs:.2f} s | |")  # fmt: skip


if __name__ == "__main__":
    main()
