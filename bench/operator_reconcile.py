"""The operator's reconcile at scale: one policy over 1,000 Deployments, a day's window.

    .venv/bin/python bench/operator_reconcile.py [--deployments 1000] [--cache DIR] [--save F]

History: 1,000 Deployments, one pod and one container each (four kinds in turn:
bursty under a tight limit, steady, idle, moderate, as bench/cluster_query.py),
the agent's counters and 28-bucket histogram, one sample a minute for 25 hours
(32,000 series, 48 million samples), backfilled once into a cached TSDB. The
Deployments are on a real control plane (unthrottle_lab.kube: etcd, kube-apiserver,
the controller manager and scheduler, kwok's fake nodes), which makes their ReplicaSets
and pods; its processes are not this one, so their memory and CPU are not counted as the
operator's. The history names each Deployment's pod after its real ReplicaSet (the
pod-template-hash depends only on the template, so the cached TSDB stays valid while
the templates and the Kubernetes release do not change; it is rebuilt when they do).

Measured, on a clock the benchmark moves (the history's last hour):
- ``recommend``'s scan of the 24 h window (the same pipeline, in process);
- the operator's first reconcile of a policy over the namespace, then twelve more, five
  minutes apart (an hour: the twelfth also reads the first read's tail, once a 1 h slot
  of it has left the window): wall time, this process's CPU time, queries, what was
  read, and the samples Prometheus read (each query replayed with ``stats=all`` after
  the timing);
- the RSS after 2 and after 12 reconciles, and whether the last reconcile's
  recommendations equal a fresh full-window scan's.
Results: docs/benchmarks.md §9, bench/results/operator-reconcile.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
from cluster_query import BOUNDS, cdf, shape  # noqa: E402
from kube import api_requests as counted  # noqa: E402
from unthrottle.agent.sampling import BUCKETS_CORES  # noqa: E402
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource, RangeSeries, Sample  # noqa: E402
from unthrottle_lab.kube import ControlPlane, ensure_built, fake_node  # noqa: E402
from unthrottle_lab.prometheus import PrometheusServer  # noqa: E402

NS, HOUR, STEP, WINDOW = "bench", 3600, 60, 86_400
PREFIX = "unthrottle_cpu_"


class Recording:
    """A MetricsSource that remembers what it sent, to replay it with ``stats=all``."""

    def __init__(self, inner: PrometheusSource) -> None:
        self.inner, self.sent = inner, []  # type: ignore[var-annotated]

    @property
    def queries(self) -> int:
        return self.inner.queries

    @property
    def config(self) -> PrometheusConfig:
        return self.inner.config

    def instant(self, promql: str, at: float | None = None) -> list[Sample]:
        self.sent.append(("query", {"query": promql, "time": at}))
        return self.inner.instant(promql, at)

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        self.sent.append(("query_range", {"query": promql, "start": start, "end": end,
                                          "step": step_s}))  # fmt: skip
        return self.inner.range(promql, start, end, step_s)

    def samples(self, url: str, since: int) -> int:
        """Samples Prometheus read for the queries sent since index ``since``."""
        total = 0
        for kind, params in self.sent[since:]:
            query = urllib.parse.urlencode({**{k: v for k, v in params.items() if v is not None},
                                            "stats": "all"})  # fmt: skip
            with urllib.request.urlopen(f"{url}/api/v1/{kind}?{query}", timeout=600) as reply:
                stats = json.load(reply)["data"]["stats"]["samples"]
            total += int(stats["totalQueryableSamples"])
        return total


def write_history(path: Path, replicasets: list[str], end: int) -> int:
    times = np.arange(end - WINDOW - HOUR, end + 1, STEP)
    elapsed = (times - times[0]).astype(np.float64)
    series = 0
    with path.open("w") as out:

        def emit(name: str, labels: str, rate: float) -> None:
            nonlocal series
            series += 1
            prefix = f"{name}{{{labels}}} "
            out.write("".join(f"{prefix}{v:.10g} {t}\n"
                              for v, t in zip((elapsed * rate).tolist(), times.tolist(),
                                              strict=True)))  # fmt: skip

        for d, rs in enumerate(replicasets):
            base, share, burst, limit = shape(d)
            labels = f'namespace="{NS}",pod="{rs}-bx7kz",container="app"'
            throttled = 1 - cdf(base, share, burst, limit)
            mean = (1 - share) * base + share * burst
            for metric, rate in (("usage_seconds", min(mean, limit)), ("cfs_periods", 10.0),
                                 ("cfs_throttled_periods", 10 * throttled),
                                 ("cfs_throttled_seconds", 10 * throttled * 0.05)):  # fmt: skip
                emit(f"{PREFIX}{metric}_total", labels, rate)
            for le, bound in zip(BOUNDS, (*BUCKETS_CORES, math.inf), strict=True):
                emit(f"{PREFIX}demand_cores_bucket", f'{labels},le="{le}"',
                     10 * cdf(base, share, burst, bound))  # fmt: skip
        out.write("# EOF\n")
    return series


def build(cache: Path, replicasets: list[str]) -> tuple[Path, int]:
    """The cached TSDB and the history's end (built again when the ReplicaSets' names, so
    the pods' names, are not the ones it was built for)."""
    import shutil
    import subprocess

    folder = cache / f"operator-d{len(replicasets)}"
    info = folder / "info.json"
    if info.exists():
        kept = json.loads(info.read_text())
        if kept.get("replicasets") == replicasets:
            return folder, int(kept["end"])
        print("history: built for other ReplicaSets, building it again", flush=True)
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    end = int(time.time()) // STEP * STEP
    text = folder / "history.om"
    started = time.monotonic()
    series = write_history(text, replicasets, end)
    print(f"history: {series} series written in {time.monotonic() - started:.0f} s", flush=True)
    started = time.monotonic()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=24h", str(text), str(folder / "tsdb")],
                   check=True, capture_output=True)  # fmt: skip
    print(f"backfilled in {time.monotonic() - started:.0f} s", flush=True)
    text.unlink()
    info.write_text(json.dumps({"end": end, "series": series, "replicasets": replicasets}))
    return folder, end


def deployment(d: int) -> dict[str, Any]:
    """Deployment number ``d``: one pod, one container, its kind's limit."""
    _, _, _, limit = shape(d)
    name = f"app-{d:04d}"
    cpu = {"limits": {"cpu": f"{round(limit * 1000)}m"},
           "requests": {"cpu": f"{round(limit * 500)}m"}}  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": NS, "name": name, "labels": {"tier": "bench"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1",
                                         "resources": cpu}]},
            },
        },
    }  # fmt: skip


def start_cluster(folder: Path, deployments: int) -> tuple[ControlPlane, list[str]]:
    """A control plane holding the Deployments, once every one has its ReplicaSet and its
    pod placed on a fake node; and the ReplicaSets' names, in the Deployments' order."""

    from concurrent.futures import ThreadPoolExecutor

    # the controllers' and scheduler's client-side limits (20 and 50 requests a second)
    # would take most of an hour over 10,000 Deployments; the operator's figures do not
    # depend on how fast the cluster was built
    plane = ControlPlane(folder / "plane", binaries=ensure_built(), client_qps=500).start()
    started = time.monotonic()
    # room for every pod (its request is half its limit): 110 pods a fake node
    for i in range(-(-deployments // 100)):
        plane.request("POST", "/api/v1/nodes", fake_node(f"bench-{i}", cpu="1000"))
    plane.install_crds(ROOT / "crds" / "throttlepolicy.yaml")
    plane.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NS}})  # fmt: skip

    def create(d: int) -> None:
        status, reply = plane.request("POST", f"/apis/apps/v1/namespaces/{NS}/deployments",
                                      deployment(d))  # fmt: skip
        if status != 201:
            raise RuntimeError(f"Deployment {d}: HTTP {status}: {reply}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, range(deployments)))
    print(f"cluster: {deployments} Deployments created in {time.monotonic() - started:.0f} s",
          flush=True)  # fmt: skip
    deadline = time.monotonic() + 3600
    while True:
        ready = sum(1 for item in listed(plane, "deployments")
                    if (item.get("status") or {}).get("availableReplicas") == 1)  # fmt: skip
        if ready == deployments:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {ready} of {deployments} Deployments rolled out")
        time.sleep(max(2, deployments // 1000))
    owner = {rs["metadata"]["ownerReferences"][0]["name"]: rs["metadata"]["name"]
             for rs in listed(plane, "replicasets")}  # fmt: skip
    print(f"cluster: {deployments} Deployments rolled out in "
          f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    return plane, [owner[f"app-{d:04d}"] for d in range(deployments)]


def listed(plane: ControlPlane, resource: str) -> list[dict[str, Any]]:
    """Every object of the namespace, a page of 500 at a time (one answer for 10,000
    Deployments would outlast the admin client's timeout)."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        page = f"limit=500&continue={urllib.parse.quote(token)}" if token else "limit=500"
        _, reply = plane.request("GET", f"/apis/apps/v1/namespaces/{NS}/{resource}?{page}")
        items += reply["items"]
        token = (reply.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def rss_mb() -> float:
    """Resident memory after a full collection, with freed memory handed back to the
    system (glibc's malloc_trim): what is still held, not what the allocator kept."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def api_requests(plane: ControlPlane) -> collections.Counter[str]:
    """The API server's own count of requests so far (``apiserver_request_total``), by verb,
    resource and scope; the nodes' heartbeats (leases, node status) and the watches' own
    renewals left out. The benchmark's requests are counted too: one GET of the policy and
    the operator's writes (status, report, checkpoints, events) per reconcile."""
    out: collections.Counter[str] = collections.Counter()
    for found, value in counted(plane):
        if found.get("resource") in ("leases", "nodes") or found.get("verb") == "WATCH":
            continue
        sub = f"/{found['subresource']}" if found.get("subresource") else ""
        out[f"{found['verb']} {found.get('resource')}{sub} ({found.get('scope')})"] += value
    return out


LISTED = ("deployments", "replicasets", "pods", "throttlepolicies")
LISTS = [f"LIST {resource} (namespace)" for resource in LISTED]
"""The namespace's LISTs counted in the summary: what the watches replaced, and the policies
(a reconcile lists them for the older ones that select the same Deployments)."""


def held_bytes(store: Any) -> dict[str, Any]:
    """Python memory the store's informers hold once synced, per object kept (tracemalloc
    over the first lists: what stays allocated after them)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store.deployments([NS])
    store.pod_owners([NS])
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    out: dict[str, Any] = {}
    for (resource, _), informer in store.informers.items():
        out[f"{resource} kept"] = len(informer.values())
    objects = sum(v for v in out.values())
    out["bytes_held"] = held
    out["bytes_per_object"] = round(held / max(1, objects))
    return out


def limits_of(doc: dict[str, Any]) -> dict[str, Any]:
    """Deployment → its containers' recommended (limit, burst), from a JSON document."""
    return {w["deployment"]: [(c["recommendation"] or {}).get("limit_millicores") for c in
                              w["containers"]] + [(c["recommendation"] or {}).get("burst_us")
                                                  for c in w["containers"]]
            for w in doc.get("workloads", [])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/unthrottle-bench"))
    parser.add_argument("--save", type=Path)
    parser.add_argument("--history-only", action="store_true",
                        help="build the cluster and the cached history only")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="profile the 5th reconcile")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="tracemalloc: what is held after the 12th reconcile, not the 2nd",
    )
    args = parser.parse_args()
    import tempfile

    from unthrottle.cli.collection import fewer_collections

    fewer_collections()  # as every `unthrottle` process does at its start

    scratch = Path(tempfile.mkdtemp(prefix="unthrottle-bench-"))
    plane, replicasets = start_cluster(scratch, args.deployments)
    try:
        if args.history_only:
            build(args.cache, replicasets)
        else:
            run(args, plane, replicasets)
    finally:
        plane.stop()
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def run(args: argparse.Namespace, plane: ControlPlane, replicasets: list[str]) -> None:
    from kubernetes import client, config

    from unthrottle.kube.objects import KubeObjects
    from unthrottle.kube.watched import WatchedWorkloadStore
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.operator.reconcile import Reconciler
    from unthrottle.operator.settings import OperatorSettings
    from unthrottle.scan import ScanRequest, scan
    from unthrottle.scan.readers import IncrementalReader

    folder, end = build(args.cache, replicasets)
    t0 = end - HOUR  # the window's start is the history's; the 12th reconcile is at its end
    out: dict[str, Any] = {"deployments": args.deployments, "window_s": WINDOW}
    api = config.new_client_from_config(str(plane.kubeconfig))
    custom = client.CustomObjectsApi(api)
    policies = ("unthrottle.io", "v1alpha1", NS, "throttlepolicies")
    with PrometheusServer(folder, tsdb=folder / "tsdb") as prom:
        store = KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api))
        source = Recording(PrometheusSource(PrometheusConfig(prom.url, timeout_s=600)))
        # 1. what `recommend` does: one scan of the window
        mark, sent = source.queries, len(source.sent)
        started = time.perf_counter()
        fresh = scan(ScanRequest(window_s=WINDOW, now=t0, namespaces=(NS,)), source, store)  # type: ignore[arg-type]
        out["recommend"] = {"wall_s": round(time.perf_counter() - started, 2),
                            "queries": source.queries - mark,
                            "samples": source.samples(prom.url, sent)}  # fmt: skip
        print("recommend:", out["recommend"], flush=True)
        # 2. the operator: a first reconcile, then twelve, five minutes apart; its workloads,
        # ReplicaSets and pods kept by watches (as `unthrottle operator` keeps them)
        clock = [float(t0)]
        objects_ = KubeObjects(api)
        watched = WatchedWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api),
                                       namespaces=(NS,))  # fmt: skip
        out["bytes_per_object"] = held_bytes(watched)
        print("held by the watches:", out["bytes_per_object"], flush=True)
        reader = IncrementalReader(source, objects_)  # type: ignore[arg-type]
        reconciler = Reconciler(
            OperatorSettings(source.config, jobs=None), metrics=source, workloads=watched,  # type: ignore[arg-type]
            objects=objects_, clock=lambda: clock[0],
            evidence=reader,
        )  # fmt: skip
        custom.create_namespaced_custom_object(*policies, {
            "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": NS, "name": "all"}, "spec": {"window": "24h"}})  # fmt: skip
        runs = []
        for i in range(13):
            clock[0] = t0 + 300 * i
            body = custom.get_namespaced_custom_object(*policies, "all")
            mark, sent = source.queries, len(source.sent)
            api_before = api_requests(plane)
            cpu, started = time.process_time(), time.perf_counter()
            if args.profile and i == 5:
                import cProfile
                import pstats

                profile = cProfile.Profile()
                outcome = profile.runcall(reconciler.reconcile, body)
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            else:
                outcome = reconciler.reconcile(body)  # type: ignore[arg-type]
            run = {"wall_s": round(time.perf_counter() - started, 2),
                   "cpu_s": round(time.process_time() - cpu, 2),
                   "queries": source.queries - mark, "fault": outcome.fault,
                   "reads": [read.kind for read in reader.reads],
                   "rss_mb": round(rss_mb(), 1)}  # fmt: skip
            run["api"] = dict(api_requests(plane) - api_before)
            run["samples"] = source.samples(prom.url, sent)
            source.sent.clear()  # the benchmark's own memory, not the operator's
            runs.append(run)
            if args.trace and i == 1:
                import tracemalloc

                tracemalloc.start(12)
            if args.trace and i in (2, 12):
                import gc
                import tracemalloc

                gc.collect()
                snapshot = tracemalloc.take_snapshot()
                if i == 2:
                    first_snapshot = snapshot
                else:
                    for stat in snapshot.compare_to(first_snapshot, "traceback")[:8]:
                        print(stat)
                        for line in stat.traceback.format()[-8:]:
                            print("   ", line)
            print(f"reconcile {i}:", run, flush=True)
        out["reconciles"] = runs
        report = client.CoreV1Api(api).read_namespaced_config_map("all-report", NS).data[
            "report.json"]  # fmt: skip
        fresh = scan(ScanRequest(window_s=WINDOW, now=clock[0], namespaces=(NS,)), source, store)  # type: ignore[arg-type]
        ours, theirs = limits_of(json.loads(report)), limits_of(fresh.to_json("24h"))
        same = sum(1 for d in ours if ours[d] == theirs.get(d))
        out["same_recommendations"] = f"{same} of {len(ours)}"
        watched.close()  # before the control plane stops
    first, steady = runs[0], runs[1:]
    out["summary"] = {
        "first_vs_recommend_wall": round(first["wall_s"] / out["recommend"]["wall_s"], 2),
        "steady_samples_share_max": round(max(r["samples"] for r in steady) / first["samples"], 4),
        "steady_samples_share_mean": round(sum(r["samples"] for r in steady) / len(steady)
                                           / first["samples"], 4),
        "steady_cpu_s_max": max(r["cpu_s"] for r in steady),
        "steady_cpu_s_max_head_only": max(r["cpu_s"] for r in steady if r["reads"] == ["head"]),
        "steady_lists": {what: sum(r["api"].get(what, 0) for r in steady) for what in LISTS},
        "rss_mb_after_2": runs[1]["rss_mb"], "rss_mb_after_12": runs[-1]["rss_mb"],
    }  # fmt: skip
    print(json.dumps(out["summary"], indent=1))
    if args.save:
        args.save.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
