"""Recommendations for a big cluster from Prometheus: batched queries against per-workload ones.

    .venv/bin/python bench/cluster_query.py [--deployments 1000] [--days 7] [--step 3600]

Builds (once, cached under --cache) a Prometheus TSDB holding ``--days`` of
history for ``--deployments`` Deployments in 20 namespaces, 5 pods × 2
containers each (10,000 containers for 1,000), one in ten rolled out mid-window
(a second ReplicaSet, so churn), with the series a cluster with unthrottle has:
cAdvisor's four CPU counters, the agent's copies of them and its 28-bucket
demand histogram, and
kube-state-metrics' limits, requests and owners. OpenMetrics text is written at
one sample per ``--step`` seconds and backfilled with promtool.

Then, on a real Prometheus started here:
- ``fetch`` (what ``unthrottle recommend --no-cluster`` sends): queries, wall time,
  with its default concurrency and one query at a time;
- the same PromQL sent raw (HTTP body read, nothing parsed): wall time, and the
  server's own ``execTotalTime`` (``stats=all``);
- one query per metric per Deployment (pods matched by name, as tools that
  query per workload do), for every Deployment;
- the engine over every container found, on every usable core (``advise_all``).

A coarse step is the hard case for the 1.5× goal: Prometheus's work grows with
the samples in the window, ours with the series in the answer. Each timing is
the median of ``--repeat`` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests

from unthrottle.agent.exposition import ACTIVE, BACKLOG
from unthrottle.agent.sampling import BUCKETS_CORES
from unthrottle.cfs.backlog import fold
from unthrottle.evidence.fetching import CONCURRENCY, fetch, queries
from unthrottle.metrics.promql import AGENT_COUNTERS, any_of, equals, selector
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.recommend import Current, Policy
from unthrottle.scan.advise import Job, advise_all, usable_cpus
from unthrottle_lab.prometheus import PrometheusServer

NAMESPACES = 20
PODS = 5
CONTAINERS = ("main", "sidecar")
BOUNDS = [*(f"{b:g}" for b in BUCKETS_CORES), "+Inf"]
COUNTERS = (
    "container_cpu_usage_seconds_total",
    "container_cpu_cfs_periods_total",
    "container_cpu_cfs_throttled_periods_total",
    "container_cpu_cfs_throttled_seconds_total",
)


def shape(index: int) -> tuple[float, float, float, float]:
    """(base cores, burst share, burst cores, limit cores) of container ``index``.

    Four kinds in turn: bursty under a tight limit, steady, idle, and moderate.
    """
    kind = index % 4
    scale = 1 + (index * 7919 % 10) / 10
    if kind == 0:
        return 0.1 * scale, 0.1, 1.2 * scale, 0.5 * scale
    if kind == 1:
        return 0.6 * scale, 0.0, 0.0, 1.0 * scale
    if kind == 2:
        return 0.01, 0.0, 0.0, 1.0
    return 0.2 * scale, 0.03, 0.6 * scale, 1.0 * scale


def cdf(base: float, share: float, burst: float, bound: float) -> float:
    """Share of windows at or under ``bound``: base uniform on (0, 2·base], bursts at ±10 %."""
    quiet = min(1.0, bound / (2 * base)) if base > 0 else 1.0
    if share == 0:
        return quiet
    loud = min(1.0, max(0.0, (bound - 0.9 * burst) / (0.2 * burst)))
    return (1 - share) * quiet + share * loud


BACKLOG_WINDOWS = 20_000
"""Windows drawn to fold a workload's backlog series (seeded: the same every time)."""


def backlog_rates(base: float, share: float, burst: float) -> list[tuple[str, str, float]]:
    """The node agent's backlog series for windows shaped as :func:`cdf`'s, each window
    drawn on its own (no runs): ``(metric, extra labels, per second)``, 10 windows a
    second. What a current agent exports beside the histogram (the order of the windows,
    docs/recommend.md "Peaks in runs"); without it the engine assumes the worst order."""
    rng = np.random.default_rng(hash((base, share, burst)) % 2**32)
    quiet = rng.uniform(0, 2 * base, BACKLOG_WINDOWS)
    loud = rng.uniform(0.9 * burst, 1.1 * burst, BACKLOG_WINDOWS)
    cores = np.where(rng.random(BACKLOG_WINDOWS) < share, loud, quiet)
    counts = fold(np.rint(cores * 100_000).astype(np.int64), 100_000)
    per_second = 10 / BACKLOG_WINDOWS
    rates = [(BACKLOG, f'level="{level / 1000:g}",over="{over:g}"', n * per_second)
             for (level, over), n in counts.above.items()]  # fmt: skip
    return [*rates, (ACTIVE, "", counts.active * per_second)]


def write_history(path: Path, deployments: int, days: int, step: int, end: int) -> int:
    """OpenMetrics history; returns the number of series."""
    times = np.arange(end - days * 86_400, end + 1, step)
    n_series = 0
    with path.open("w") as out:

        def emit(name: str, labels: str, values: np.ndarray, at: np.ndarray) -> None:
            nonlocal n_series
            n_series += 1
            prefix = f"{name}{{{labels}}} "
            pairs = zip(values.tolist(), at.tolist(), strict=True)
            out.write("".join(f"{prefix}{v:.10g} {t}\n" for v, t in pairs))

        index = 0
        for d in range(deployments):
            ns, app = f"team-{d % NAMESPACES:02d}", f"app-{d // NAMESPACES:03d}"
            rollouts = [(f"{app}-5f7c{d % 97:02d}", times)]
            if d % 10 == 0:  # rolled out half-way: two ReplicaSets, each half the window
                half = times[len(times) // 2]
                rollouts = [(f"{app}-5f7c{d % 97:02d}", times[times <= half]),
                            (f"{app}-8a1b{d % 89:02d}", times[times >= half])]  # fmt: skip
            for rs, live in rollouts:
                ones = np.ones(len(live))
                emit("kube_replicaset_owner", f'namespace="{ns}",replicaset="{rs}",'
                     f'owner_kind="Deployment",owner_name="{app}"', ones, live)  # fmt: skip
                for p in range(PODS):
                    pod = f"{rs}-{'bcdfg'[p]}x7kz"  # as the ReplicaSet controller names
                    emit("kube_pod_owner", f'namespace="{ns}",pod="{pod}",'
                         f'owner_kind="ReplicaSet",owner_name="{rs}"', ones, live)  # fmt: skip
                    elapsed = (live - live[0]).astype(np.float64)
                    for c, container in enumerate(CONTAINERS):
                        base, share, burst, limit = shape(index + c)
                        labels = f'namespace="{ns}",pod="{pod}",container="{container}"'
                        for metric, value in (("limits", limit), ("requests", limit / 2)):
                            emit(f"kube_pod_container_resource_{metric}",
                                 f'{labels},resource="cpu"', ones * value, live)  # fmt: skip
                        throttled = 1 - cdf(base, share, burst, limit)
                        mean = (1 - share) * base + share * burst
                        rates = (min(mean, limit), 10.0, 10 * throttled,
                                 10 * throttled * 0.05 * max(1.0, burst / limit))  # fmt: skip
                        for metric, rate in zip(COUNTERS, rates, strict=True):
                            emit(metric, labels, elapsed * rate, live)
                            emit(AGENT_COUNTERS[metric], labels, elapsed * rate, live)
                        for le, bound in zip(BOUNDS, (*BUCKETS_CORES, math.inf), strict=True):
                            rate = 10 * cdf(base, share, burst, bound)
                            emit("unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"',
                                 elapsed * rate, live)  # fmt: skip
                index += len(CONTAINERS)
        out.write("# EOF\n")
    return n_series


def build(cache: Path, deployments: int, days: int, step: int) -> dict[str, Any]:
    """The TSDB for these parameters, built unless cached; its description."""
    folder = cache / f"d{deployments}-days{days}-step{step}"
    marker = folder / "built.json"
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    end = int(time.time()) // step * step
    history = folder / "history.om"
    began = time.monotonic()
    n_series = write_history(history, deployments, days, step, end)
    written = time.monotonic() - began
    size = history.stat().st_size
    began = time.monotonic()
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
         "--max-block-duration=162h", str(history), str(folder / "tsdb")],
        check=True,
    )  # fmt: skip
    backfilled = time.monotonic() - began
    history.unlink()
    info = {"end": end, "series": n_series, "om_bytes": size, "write_s": round(written, 1),
            "backfill_s": round(backfilled, 1)}  # fmt: skip
    marker.write_text(json.dumps(info))
    return info


def timed(repeat: int, run: Callable[[], object]) -> float:
    """Median wall time of ``repeat`` runs after a warm-up."""
    run()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


class Raw:
    """PromQL sent over plain HTTP: the body is read, nothing parsed (the floor for a client)."""

    def __init__(self, url: str, at: int) -> None:
        self.url, self.at = f"{url}/api/v1/query", at
        self.session = requests.Session()
        self.server_s = 0.0
        self.samples = 0

    def send(self, promql: str) -> int:
        reply = self.session.get(self.url, params={"query": promql, "time": self.at})
        reply.raise_for_status()
        return len(reply.content)

    def stats(self, promql: str) -> None:
        """Add the server's own time and samples for this query."""
        params = {"query": promql, "time": self.at, "stats": "all"}
        stats = self.session.get(self.url, params=params).json()["data"]["stats"]
        self.server_s += stats["timings"]["execTotalTime"]
        self.samples += stats["samples"]["totalQueryableSamples"]


def per_workload_queries(owners: dict[tuple[str, str], str], window: str) -> list[str]:
    """One query per metric per Deployment, its pods matched by name."""
    pods: dict[tuple[str, str], list[str]] = {}
    for (ns, pod), deploy in owners.items():
        pods.setdefault((ns, deploy), []).append(pod)
    queries = []
    for (ns, _), names in sorted(pods.items()):
        match = (equals("namespace", ns), any_of("pod", names))
        for metric in COUNTERS:
            queries.append(f"sum by (container) (increase({selector(metric, *match)}[{window}]))")
        bucket = selector("unthrottle_cpu_demand_cores_bucket", *match)
        queries.append(f"sum by (container, le) (increase({bucket}[{window}]))")
        for metric in ("limits", "requests"):
            queries.append(selector(f"kube_pod_container_resource_{metric}", *match))
    return queries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--step", type=int, default=3600, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/var/tmp/unthrottle-bench"))
    parser.add_argument("--save", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    info = build(args.cache, args.deployments, args.days, args.step)
    print(f"history: {info['series']} series, {info['om_bytes'] / 1e9:.2f} GB OpenMetrics "
          f"written in {info['write_s']} s, backfilled in {info['backfill_s']} s")  # fmt: skip
    folder = args.cache / f"d{args.deployments}-days{args.days}-step{args.step}"
    window, at = f"{args.days}d", info["end"]
    result: dict[str, Any] = {"deployments": args.deployments, "days": args.days,
                              "step_s": args.step, **info}  # fmt: skip
    with PrometheusServer(folder, tsdb=folder / "tsdb") as prom:
        source = PrometheusSource(PrometheusConfig(prom.url, timeout_s=600))
        found: dict[Any, Any] = {}

        def ours(concurrency: int) -> Callable[[], None]:
            def run() -> None:
                found.clear()
                found.update(fetch(source, [], args.days * 86_400, at=at, concurrency=concurrency))

            return run

        before = source.queries
        ours_s = timed(args.repeat, ours(CONCURRENCY))
        n_queries = (source.queries - before) // (args.repeat + 1)
        ours_sequential_s = timed(args.repeat, ours(1))
        containers = len(found)
        instances = sum(len(item.pods) for item in found.values())
        with_period = sum(1 for item in found.values() if item.kind == "period")
        raw = Raw(prom.url, at)
        sent = list(queries([], args.days * 86_400, with_owners=True).values())
        assert len(sent) == n_queries, (sent, n_queries)
        raw_s = timed(args.repeat, lambda: [raw.send(q) for q in sent])
        answer_bytes = sum(raw.send(q) for q in sent)
        for q in sent:
            raw.stats(q)
        owners = {(k.namespace, p): k.deployment for k, item in found.items() for p in item.pods}
        per_workload = per_workload_queries(owners, window)
        began = time.perf_counter()
        for q in per_workload:
            raw.send(q)
        per_workload_s = time.perf_counter() - began

    began = time.perf_counter()
    policy = Policy()
    jobs: list[Job] = [
        (item, Current(item.limit_millicores,
                       min(item.request_millicores, item.limit_millicores or 10**9)), policy, 1)
        for item in found.values()
    ]  # fmt: skip
    recs = advise_all(jobs)
    limited = sum(1 for rec in recs if rec is not None and rec.limit_millicores is not None)
    engine_s = time.perf_counter() - began
    result.update({
        "container_instances": instances, "deployment_containers": containers,
        "with_period_evidence": with_period, "queries": n_queries, "concurrency": CONCURRENCY,
        "ours_s": round(ours_s, 3), "ours_sequential_s": round(ours_sequential_s, 3),
        "raw_http_s": round(raw_s, 3),
        "server_exec_s": round(raw.server_s, 3), "samples_read": raw.samples,
        "answer_mb": round(answer_bytes / 1e6, 1),
        "ratio_to_raw_http": round(ours_s / raw_s, 2),
        "ratio_to_server": round(ours_s / raw.server_s, 2),
        "sequential_ratio_to_raw_http": round(ours_sequential_s / raw_s, 2),
        "per_workload_queries": len(per_workload), "per_workload_s": round(per_workload_s, 1),
        "fewer_queries": round(len(per_workload) / n_queries, 1),
        "engine_s": round(engine_s, 1), "engine_workers": usable_cpus(),
        "recommendations": limited,
    })  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.save:
        args.save.write_text(json.dumps(result, indent=2) + "\n")
    ok = result["sequential_ratio_to_raw_http"] <= 1.5 and result["fewer_queries"] >= 10
    print("goal (≤ 1.5× raw query time, ≥ 10× fewer queries):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
