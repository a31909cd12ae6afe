"""Apply mode under faults: how many runs leave a Deployment without a matching record.

    .venv/bin/python bench/apply_faults.py [--runs 40] [--seed 1] [--save F] [--quick]

A real Kubernetes control plane (``unthrottle_lab.kube``: etcd, kube-apiserver, the
controller manager, the scheduler and kwok's fake nodes), started once for all runs.
Each run: three throttled Deployments in a fresh namespace, rolled out by the real
Deployment controller; a real Prometheus with their history; an Apply policy
(maxConcurrent 3); and a reconciler on a clock the run moves, talking to the API server
through a fault proxy (tests/kube_faults.py). One fault, drawn at random, hits the
cycle: the proxy answers 409 or 500 to the next patches, or holds them longer than the
client waits (the client gives up after 1 s; the proxy then forwards the patch and the
real server applies it, late), Prometheus goes away, or the operator "dies" (its memory
is dropped: a new reconciler continues). The run then goes on without faults through
the real rollout (the new ReplicaSet's pods' history is added once the controller has
named it), verification and a verdict. After every step, each Deployment must be
consistent with its record: no record and today's settings as they were; or a record
whose ``after`` settings are the Deployment's (in verification, or Applied), or whose
``before`` are (RolledBack). ``--quick``: one run of each fault.
Results: docs/benchmarks.md §10.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from kube import Kube  # noqa: E402
from kube_faults import FaultProxy  # noqa: E402
from shop import Workload, deploy, openmetrics, rehash  # noqa: E402
from unthrottle.kube.patching import RECORD_ANNOTATION, Record  # noqa: E402
from unthrottle.units import parse_cpu  # noqa: E402
from unthrottle_lab.kube import ControlPlane, ensure_built  # noqa: E402
from unthrottle_lab.prometheus import PrometheusServer  # noqa: E402

NOW = int(time.time()) // 60 * 60
T0 = NOW - 2 * 3600
APPS = [Workload("stage", f"app-{i}", 0.1, 0.10, 1.2, 0.5, 1, {"tier": "web"}) for i in range(3)]
AFTER = {"limit": 1.3}
"""After the rollout: new pods, no longer throttled."""
FAULTS = ("409", "500", "timeout", "prometheus", "restart", "none")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


def consistent(deploy: dict[str, Any]) -> str | None:
    """Why this Deployment does not match its record, or None when it does."""
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    limit = parse_cpu(container["resources"]["limits"]["cpu"])
    text = (deploy["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    if text is None:
        return None if limit == 500 else f"changed to {limit}m without a record"
    record = Record.from_annotation(text)
    (change,) = record.containers
    wanted = change.before if record.verdict == "RolledBack" else change.after
    return None if limit == wanted.cpu_limit else f"{limit}m, record says {wanted.cpu_limit}m"


class History:
    """A Prometheus serving backfilled history on one port: stopped and started again
    (the fault), and given more history (it reads new blocks when it starts: stopped,
    backfilled, started again if it was up)."""

    def __init__(self, folder: Path, history: str) -> None:
        self.server = PrometheusServer(folder, openmetrics=history)
        self.port, self.url = self.server.port, self.server.url
        self.up = False

    def start(self) -> None:
        self.server.port, self.server.url = self.port, self.url
        self.server.__enter__()
        self.up = True

    def stop(self) -> None:
        self.server.__exit__(None, None, None)
        self.up = False

    def add(self, history: str) -> None:
        was_up = self.up
        self.stop()
        self.server = PrometheusServer(self.server.folder, openmetrics=history,
                                       tsdb=self.server.tsdb)  # fmt: skip
        if was_up:
            self.start()


def reconciler_factory(api: Any, url: str, clock: list[float]) -> Callable[[], Any]:
    from kubernetes import client

    from unthrottle.kube.deployments import KubeDeployments
    from unthrottle.kube.objects import KubeObjects
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
    from unthrottle.operator.reconcile import Reconciler
    from unthrottle.operator.settings import OperatorSettings

    source = PrometheusSource(PrometheusConfig(url, retries=0, timeout_s=5))

    def make() -> Reconciler:
        return Reconciler(
            OperatorSettings(source.config), metrics=source,
            workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
            objects=KubeObjects(api), deployments=KubeDeployments(api, timeout_s=1.0),
            clock=lambda: clock[0],
        )  # fmt: skip

    return make


def run(seed: int, folder: Path, kube: Kube, fault: str | None = None) -> dict[str, Any]:
    """One run; its fault is drawn from ``seed`` unless given."""
    rng = random.Random(seed)
    drawn = rng.choice(FAULTS)
    fault = fault or drawn
    problems: list[str] = []
    placed = deploy(kube, APPS)
    namespace = placed[0].namespace
    prom = History(folder, openmetrics(placed, T0, span=2 * 3600))
    try:
        with FaultProxy(kube) as proxy:
            prom.start()
            api = kube.api_client(proxy.kubeconfig(folder / "kubeconfig"))
            clock = [float(T0)]
            reconciler = reconciler_factory(api, prom.url, clock)
            current = reconciler()
            kube.create(POLICIES, {
                "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                "metadata": {"namespace": namespace, "name": "web"},
                "spec": {"mode": "Apply", "window": "1h", "apply": {"maxConcurrent": 3,
                         "verifyFor": "5m"}, "selector": {"matchLabels": {"tier": "web"}}},
            })  # fmt: skip
            if fault in ("409", "500"):
                proxy.fail_next("PATCH", r"/deployments/", int(fault), count=rng.randint(1, 3))
            elif fault == "timeout":
                proxy.fail_next("PATCH", r"/deployments/", None, count=rng.randint(1, 3),
                                delay=2.0)  # fmt: skip
            restart_at = rng.randint(1, 3)
            for i, at in enumerate([0, 60, 600, 1200, 1800]):
                clock[0] = T0 + at
                if fault == "prometheus" and i == 1:
                    prom.stop()
                if fault == "prometheus" and i == 3:
                    prom.start()
                if fault == "restart" and i == restart_at:
                    current = reconciler()
                if i == 2:  # the real controller's rollouts are done: the new pods' history
                    news = [rehash(kube, w, **AFTER) for w in placed]
                    prom.add(openmetrics(news, NOW, span=NOW - T0 - 60))
                body = kube.get(POLICIES, namespace, "web")
                assert body is not None
                current.reconcile(body)
                for w in placed:
                    found = kube.get("apps/v1/deployments", namespace, w.name)
                    why = consistent(found) if found else "gone"
                    if why:
                        problems.append(f"step {i} {w.name}: {why}")
            time.sleep(2.5)  # a patch held by the proxy lands: check once more after it
            for w in placed:
                found = kube.get("apps/v1/deployments", namespace, w.name)
                why = consistent(found) if found else "gone"
                if why:
                    problems.append(f"after {w.name}: {why}")
            status = (kube.get(POLICIES, namespace, "web") or {}).get("status") or {}
            states = sorted(w["state"] for w in status.get("workloads", []))
    finally:
        prom.stop()
        kube.delete("v1/namespaces", None, namespace)
    return {"seed": seed, "fault": fault, "problems": problems, "final_states": states}


def install_crd(plane: ControlPlane) -> None:
    plane.install_crds(ROOT / "crds" / "throttlepolicy.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--quick", action="store_true", help="one run of each fault")
    args = parser.parse_args()
    # a held patch whose client gave up is answered into a closed connection: the proxy's
    # server logs that with a traceback, which is the fault working, not news
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    draws: list[tuple[int, str | None]] = (
        [(args.seed + i, f) for i, f in enumerate(FAULTS)] if args.quick
        else [(args.seed + i, None) for i in range(args.runs)])  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory(prefix="unthrottle-faults-") as top:
        plane_folder = Path(top) / "control-plane"
        with ControlPlane(plane_folder, binaries=ensure_built()) as plane:
            install_crd(plane)
            kube = Kube(plane)
            for seed, fault in draws:
                with tempfile.TemporaryDirectory(dir=top) as folder:
                    result = run(seed, Path(folder), kube, fault)
                results.append(result)
                print(json.dumps(result), flush=True)
    by_fault: dict[str, int] = {}
    for r in results:
        by_fault[r["fault"]] = by_fault.get(r["fault"], 0) + 1
    bad = [r for r in results if r["problems"]]
    summary = {"runs": len(results), "by_fault": by_fault, "inconsistent_runs": len(bad),
               "control_plane": plane.version}  # fmt: skip
    print(json.dumps(summary))
    if args.save:
        args.save.write_text(json.dumps({"summary": summary, "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
