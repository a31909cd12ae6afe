"""Apply mode under faults: how many runs leave a Deployment without a matching record.

    .venv/bin/python bench/apply_faults.py [--runs 40] [--seed 1] [--save F]

Each run: a fresh emulator (tests/kube_emulator.py) holding three throttled
Deployments, a real Prometheus with their history, an Apply policy
(maxConcurrent 3), and a reconciler on a clock the run moves. One fault, drawn
at random, hits the cycle: the API answers 409 or 500 to the next patches, a
patch takes longer than the client waits (the client gives up; the emulator then
writes nothing, as a cancelled request), Prometheus goes away, or the operator
"dies" (its memory is dropped: a new reconciler continues). The run then goes on
without faults through rollout, verification and a verdict. After every step,
each Deployment must be consistent with its record: no record and today's
settings as they were; or a record whose ``after`` settings are the Deployment's
(in verification, or Applied), or whose ``before`` are (RolledBack).
Results: docs/benchmarks.md §9.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from kube_emulator import KubeEmulator  # noqa: E402
from shop import Workload, objects, openmetrics  # noqa: E402
from unthrottle.cfs.settings import parse_cpu  # noqa: E402
from unthrottle.devtools.prometheus import PrometheusServer  # noqa: E402
from unthrottle.kube.patching import RECORD_ANNOTATION, Record  # noqa: E402

NOW = int(time.time()) // 60 * 60
T0 = NOW - 2 * 3600
APPS = [Workload("stage", f"app-{i}", 0.1, 0.10, 1.2, 0.5, 1, {"tier": "web"}) for i in range(3)]
AFTER = [replace(w, template_hash="9f8e7d", limit=1.3) for w in APPS]
"""After the rollout: new pods, no longer throttled."""
FAULTS = ("409", "500", "timeout", "prometheus", "restart", "none")


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


def run(seed: int, folder: Path, history: str) -> dict[str, Any]:
    from kubernetes import client

    from unthrottle.kube.deployments import KubeDeployments
    from unthrottle.kube.objects import KubeObjects
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
    from unthrottle.operator.reconcile import Reconciler
    from unthrottle.operator.settings import OperatorSettings

    rng = random.Random(seed)
    fault = rng.choice(FAULTS)
    problems: list[str] = []
    with KubeEmulator() as kube, PrometheusServer(folder, openmetrics=history) as prom:
        for w in APPS:
            for resource, obj in objects(w):
                kube.put(resource, obj)
            kube.complete_rollout(w.namespace, w.name)
        api = kube.api_client(kube.kubeconfig(folder / "kubeconfig"))
        clock = [float(T0)]
        source = PrometheusSource(PrometheusConfig(prom.url, retries=0, timeout_s=5))

        def reconciler() -> Reconciler:
            return Reconciler(
                OperatorSettings(source.config), metrics=source,
                workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
                objects=KubeObjects(api), deployments=KubeDeployments(api, timeout_s=1.0),
                clock=lambda: clock[0],
            )  # fmt: skip

        current = reconciler()
        kube.create("unthrottle.io/v1alpha1/throttlepolicies", {
            "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": "stage", "name": "web"},
            "spec": {"mode": "Apply", "window": "1h", "apply": {"maxConcurrent": 3,
                     "verifyFor": "5m"}, "selector": {"matchLabels": {"tier": "web"}}},
        })  # fmt: skip
        if fault in ("409", "500"):
            kube.fail_next("PATCH", r"/deployments/", int(fault), count=rng.randint(1, 3))
        elif fault == "timeout":
            kube.fail_next("PATCH", r"/deployments/", None, count=rng.randint(1, 3), delay=2.0)
        steps = [0, 60, 600, 1200, 1800]
        for i, at in enumerate(steps):
            clock[0] = T0 + at
            if fault == "prometheus" and i == 1:
                prom.__exit__(None, None, None)
            if fault == "prometheus" and i == 3:
                prom.port, prom.url = prom.port, f"http://127.0.0.1:{prom.port}"
                prom.__enter__()
            if fault == "restart" and i == rng.randint(1, 3):
                current = reconciler()
            if i == 2:  # the Deployment controller: new pods, rollout done
                for before, after in zip(APPS, AFTER, strict=True):
                    for pod in before.pod_names():
                        kube.delete("v1/pods", "stage", pod, force=True)
                    for resource, obj in objects(after):
                        if resource != "apps/v1/deployments":
                            kube.put(resource, obj)
                    kube.complete_rollout(before.namespace, before.name)
            body = kube.get("unthrottle.io/v1alpha1/throttlepolicies", "stage", "web")
            assert body is not None
            current.reconcile(body)
            for w in APPS:
                deploy = kube.get("apps/v1/deployments", "stage", w.name)
                why = consistent(deploy) if deploy else "gone"
                if why:
                    problems.append(f"step {i} {w.name}: {why}")
        status = (kube.get("unthrottle.io/v1alpha1/throttlepolicies", "stage", "web") or {}).get(
            "status") or {}  # fmt: skip
        states = sorted(w["state"] for w in status.get("workloads", []))
    return {"seed": seed, "fault": fault, "problems": problems, "final_states": states}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    history = openmetrics(APPS, T0, span=2 * 3600) + openmetrics(AFTER, NOW, span=NOW - T0 - 60)
    results = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="unthrottle-faults-") as folder:
            result = run(args.seed + i, Path(folder), history)
        results.append(result)
        print(json.dumps(result), flush=True)
    by_fault: dict[str, int] = {}
    for r in results:
        by_fault[r["fault"]] = by_fault.get(r["fault"], 0) + 1
    bad = [r for r in results if r["problems"]]
    summary = {"runs": len(results), "by_fault": by_fault, "inconsistent_runs": len(bad)}
    print(json.dumps(summary))
    if args.save:
        args.save.write_text(json.dumps({"summary": summary, "runs": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
