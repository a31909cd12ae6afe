"""`make demo`: the whole loop on this machine, with a real kernel and no cluster.

    .venv/bin/python demo/loop.py            (run by `make demo`; root for the kernel part)

1. Two workloads from scenarios/ (the request pool and the parallel batch, both
   throttled today) run in real cgroups laid out as the kubelet lays out pods
   (``kubepods/burstable/pod<uid>/<container id>``), under their limits.
2. The node agent samples them every 100 ms; a real Prometheus scrapes the agent.
3. The operator reconciles a ThrottlePolicy against the Kubernetes emulator, which
   holds Deployments and pods standing for the workloads: Recommend mode, then Apply.
   The emulator is a test double (tests/kube_emulator.py), not an API server.
4. The limit and burst it patched are written into the cgroups (what the kubelet and
   the agent would do), and the workloads run again.
5. A before / after table, and the HTML report's path.

Without root (no cgroups to write), the same operator loop runs over a day of
synthesized history and the CFS model gives the throttling before and after.
Everything started here is stopped, and every cgroup removed, also on Ctrl-C.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from kube_emulator import KubeEmulator  # noqa: E402  (the test double for the API server)
from unthrottle.cfs.settings import format_cpu, parse_cpu  # noqa: E402
from unthrottle.devtools.processes import stop  # noqa: E402
from unthrottle.devtools.prometheus import PrometheusServer, free_port, have_prometheus  # noqa: E402
from unthrottle.model.burst import burst_specs, spec_for  # noqa: E402
from unthrottle.model.scenario import RunSpec, Scenario, load_scenario  # noqa: E402

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
NODE, NS = "demo-node", "shop"
TARGET = 0.05
SAVE = os.environ.get("UNTHROTTLE_DEMO_JSON")
"""Where to write the before / after figures as JSON too (the demo's test reads them)."""


def save(doc: dict[str, Any]) -> None:
    if SAVE:
        import json

        Path(SAVE).write_text(json.dumps(doc, indent=1))


@dataclass
class App:
    """A scenario standing for a Deployment with one pod and one container."""

    name: str
    scenario: Scenario

    @property
    def uid(self) -> str:
        h = hashlib.sha256(self.name.encode()).hexdigest()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    @property
    def container_id(self) -> str:
        return hashlib.sha256(f"container {self.name}".encode()).hexdigest()

    @property
    def limit_millicores(self) -> int:
        cpus = self.scenario.runs[0].cpus
        assert cpus is not None
        return round(cpus * 1000)

    def objects(self) -> list[tuple[str, dict[str, Any]]]:
        rs, pod = f"{self.name}-6b7c8d", f"{self.name}-6b7c8d-x2k4q"
        limit = self.limit_millicores
        resources = {"limits": {"cpu": format_cpu(limit)},
                     "requests": {"cpu": format_cpu(max(limit // 4, 10))}}  # fmt: skip
        return [
            ("apps/v1/deployments", {"metadata": {"namespace": NS, "name": self.name,
                                                  "labels": {"demo": "unthrottle"}},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": self.name}},
                      "template": {"metadata": {"labels": {"app": self.name}},
                                   "spec": {"containers": [{"name": "app", "image": "demo",
                                                            "resources": resources}]}}}}),
            ("apps/v1/replicasets", {"metadata": {"namespace": NS, "name": rs, "ownerReferences": [
                {"kind": "Deployment", "name": self.name, "controller": True}]}}),
            ("v1/pods", {"metadata": {"namespace": NS, "name": pod, "uid": self.uid,
                                      "ownerReferences": [{"kind": "ReplicaSet", "name": rs,
                                                           "controller": True}]},
                         "spec": {"nodeName": NODE, "containers": [{"name": "app"}]},
                         "status": {"containerStatuses": [{
                             "name": "app", "containerID": f"containerd://{self.container_id}"}]}}),
        ]  # fmt: skip


def wait_healthy(url: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    time.sleep(1)  # its first discovery, through the API
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the agent did not become healthy at {url}")


def say(step: str) -> None:
    print(f"\n==> {step}", flush=True)


def apps() -> list[App]:
    """The request pool and the parallel batch, run longer than in `lab tune` (about 10 s
    each), so that the agent sees a hundred windows of each."""
    out = []
    for name, file, tasks in (("pool", "tune-open-pool.yaml", 600),
                              ("batch", "tune-batch-parallel.yaml", 80)):  # fmt: skip
        scenario = load_scenario(ROOT / "scenarios" / file)
        workload = scenario.workload.model_copy(update={"tasks": tasks})
        out.append(App(name, scenario.model_copy(update={"workload": workload})))
    return out


def reconciler(kube: KubeEmulator, folder: Path, prometheus_url: str) -> Any:
    """The operator's reconciler, in this process, against the emulator."""
    from kubernetes import client

    from unthrottle.kube.deployments import KubeDeployments
    from unthrottle.kube.objects import KubeObjects
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
    from unthrottle.operator.reconcile import Reconciler
    from unthrottle.operator.settings import OperatorSettings

    api = kube.api_client(kube.kubeconfig(folder / "kubeconfig"))
    source = PrometheusSource(PrometheusConfig(prometheus_url))
    return Reconciler(
        OperatorSettings(source.config), metrics=source,
        workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
        objects=KubeObjects(api), deployments=KubeDeployments(api),
    )  # fmt: skip


def reconcile(kube: KubeEmulator, operator: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Create or update the policy, reconcile it once, return its status."""
    if kube.get(POLICIES, NS, "demo") is None:
        kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                               "kind": "ThrottlePolicy", "spec": spec,
                               "metadata": {"namespace": NS, "name": "demo"}})  # fmt: skip
    else:
        kube.patch(POLICIES, NS, "demo", {"spec": spec})
    body = kube.get(POLICIES, NS, "demo")
    outcome = operator.reconcile(body)
    if outcome.fault:
        raise SystemExit(f"the reconcile failed: {outcome.fault}")
    return (kube.get(POLICIES, NS, "demo") or {}).get("status") or {}


def show_status(status: dict[str, Any]) -> None:
    for w in status.get("workloads", []):
        for c in w["containers"]:
            rec = c["recommended"] or {}
            print(
                f"  {w['deployment']:<6} {w['state']:<11} limit {c['current']['cpuLimit']} → "
                f"{rec.get('cpuLimit')}, burst {rec.get('burst')}, throttled "
                f"{(c['throttleRatio'] or 0) * 100:.0f} % of periods → expected "
                f"{(c['expectedThrottleRatio'] or 0) * 100:.1f} %  ({w['message'] or c['reason']})"
            )


def patched(kube: KubeEmulator, name: str) -> tuple[int, int]:
    """The limit (millicores) and burst (µs) the Deployment now asks for."""
    deploy = kube.get("apps/v1/deployments", NS, name)
    assert deploy is not None
    template = deploy["spec"]["template"]
    limit = parse_cpu(template["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    spec = spec_for(burst_specs((template.get("metadata") or {}).get("annotations") or {}), "app")
    burst, _ = spec.resolve(limit * 100) if spec else (0, False)
    return limit, burst


def write_report(kube: KubeEmulator, folder: Path, operator: Any) -> Path:
    """The HTML report of the policy's latest result (from its report ConfigMap)."""
    import json

    from unthrottle.report import Report, render
    from unthrottle.report.formats import RenderOptions

    cm = kube.get("v1/configmaps", NS, "demo-report")
    assert cm is not None
    report = Report.from_json(json.loads(cm["data"]["report.json"]))
    text = render(report, "html", RenderOptions(title="unthrottle demo: policy shop/demo"))
    path = Path(tempfile.gettempdir()) / "unthrottle-demo-report.html"
    path.write_text(str(text))
    return path


def table(rows: list[tuple[str, str, str, str, str]]) -> None:
    header = ("workload", "settings", "limit / burst", "throttled periods", "p99 latency")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


# -- on the kernel -----------------------------------------------------------------------


@contextmanager
def kubelet_tree(layout: Any, root: str, pods: list[App]) -> Iterator[dict[str, str]]:
    """The kubepods tree for the pods; their container cgroups are the lab's runs."""
    from unthrottle.cgroups import Cgroup

    made = []
    try:
        for path in (root, f"{root}/kubepods", f"{root}/kubepods/burstable"):
            made.append(Cgroup(layout, path))
            made[-1].create()
        paths = {}
        for app in pods:
            pod = f"{root}/kubepods/burstable/pod{app.uid}"
            made.append(Cgroup(layout, pod))
            made[-1].create()
            paths[app.name] = f"{pod}/{app.container_id}"
        yield paths
    finally:
        for cg in reversed(made):
            if cg.exists():
                cg.remove()


def run(app: App, spec: RunSpec, layout: Any, cgroup: str) -> Any:
    from unthrottle.lab.runner import LabOptions, run_run

    return run_run(
        app.scenario.workload.to_workload(), spec, layout, LabOptions(cgroup_name=cgroup)
    )


def on_the_kernel(layout: Any, folder: Path) -> None:
    pods = apps()
    root = f"unthrottle-demo-{os.getpid()}"
    with KubeEmulator() as kube, kubelet_tree(layout, root, pods) as cgroups:
        for app in pods:
            for resource, obj in app.objects():
                kube.put(resource, obj)
        port = free_port()
        say("1-2. the node agent samples the pods' cgroups; a real Prometheus scrapes it")
        agent = subprocess.Popen(
            [str(UNTHROTTLE), "agent", "--kubeconfig", str(kube.kubeconfig(folder / "agent-kc")),
             "--node-name", NODE, "--kubepods-parent", root, "--listen", f"127.0.0.1:{port}",
             "--period", "100ms", "--discover-every", "500ms", "--no-burst"],
            stdout=subprocess.DEVNULL, stderr=(folder / "agent.log").open("w"),
        )  # fmt: skip
        try:
            scrape = ("scrape_configs:\n  - job_name: agent\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")  # fmt: skip
            with PrometheusServer(folder, scrape=scrape) as prom:
                wait_healthy(f"http://127.0.0.1:{port}/healthz")
                before = {}
                for app in pods:
                    print(
                        f"  {app.name}: {app.scenario.runs[0].label()} (today's limit) …",
                        flush=True,
                    )
                    before[app.name] = run(app, app.scenario.runs[0], layout, cgroups[app.name])
                time.sleep(3)  # the last windows scraped
                operator = reconciler(kube, folder, prom.url)
                say("3. the operator: Recommend mode (nothing is patched)")
                policy = {"window": "10m", "targetThrottleRatio": TARGET,
                          "selector": {"matchLabels": {"demo": "unthrottle"}}}  # fmt: skip
                show_status(reconcile(kube, operator, policy))
                report = write_report(kube, folder, operator)
                say("3. the operator: Apply mode (JSON Patches with their records)")
                show_status(reconcile(kube, operator, {"mode": "Apply",
                                                       "apply": {"maxConcurrent": 2}}))  # fmt: skip
                say(
                    "4. the kubelet and the agent write the new limit and burst; "
                    "the workloads run again"
                )
                rows, results = [], {}
                for app in pods:
                    limit, burst = patched(kube, app.name)
                    spec = RunSpec(cpus=limit / 1000, burst_ms=burst / 1000)
                    print(f"  {app.name}: {spec.label()} …", flush=True)
                    after = run(app, spec, layout, cgroups[app.name])
                    results[app.name] = {
                        "before": {"limit_millicores": app.limit_millicores,
                                   "throttle_ratio": before[app.name].stat.throttle_ratio,
                                   "p99_ms": before[app.name].latency.p99},
                        "after": {"limit_millicores": limit, "burst_us": burst,
                                  "throttle_ratio": after.stat.throttle_ratio,
                                  "p99_ms": after.latency.p99},
                    }  # fmt: skip
                    for name, settings, fig in (("today", app.scenario.runs[0], before[app.name]),
                                                ("unthrottle", spec, after)):  # fmt: skip
                        bw = settings.bandwidth()
                        cpu = format_cpu(round((bw.quota_us or 0) / 100))
                        rows.append((app.name if name == "today" else "", name,
                                     f"{cpu} / {bw.burst_us / 1000:g} ms",
                                     f"{fig.stat.throttle_ratio * 100:.0f} %",
                                     f"{fig.latency.p99:.1f} ms"))  # fmt: skip
        finally:
            stop(agent, timeout_s=15)
    say("5. before and after, measured on this kernel")
    table(rows)
    save({"target": TARGET, "workloads": results, "report": str(report)})
    print(f"\nThe HTML report: {report}\n(the emulator stood in for the Kubernetes API: on a real "
          "cluster, install the chart and apply a policy, see README.md)")  # fmt: skip


# -- without root: the model ---------------------------------------------------------------


def on_the_model(folder: Path) -> None:
    from shop import HEALTHY, THROTTLED, objects, openmetrics
    from unthrottle.cfs.series import simulate_series
    from unthrottle.cfs.settings import Bandwidth
    from unthrottle.metrics.evidence import fetch

    print("no root here: the cgroups cannot be written, so the loop runs over a day of "
          "synthesized history and the CFS model measures before and after")  # fmt: skip
    shop = [THROTTLED, HEALTHY]
    end = int(time.time()) // 60 * 60
    with (
        KubeEmulator() as kube,
        PrometheusServer(folder, openmetrics=openmetrics(shop, end)) as prom,
    ):
        for w in shop:
            for resource, obj in objects(w):
                kube.put(resource, obj)
        operator = reconciler(kube, folder, prom.url)
        say("the operator: Recommend mode")
        show_status(reconcile(kube, operator, {"window": "12h"}))
        report = write_report(kube, folder, operator)
        say("the operator: Apply mode")
        show_status(reconcile(kube, operator, {"mode": "Apply", "apply": {"maxConcurrent": 2}}))
        owners = operator.workloads.pod_owners([NS])
        found = fetch(operator.metrics, [NS], 12 * 3600, at=end, owners=owners)
        rows = []
        for w in shop:
            item = next(v for k, v in found.items() if k.deployment == w.name)
            demand = item.period_evidence().demand_us
            limit, burst = patched(kube, w.name)
            ours = Bandwidth(limit * 100, burst_us=burst)
            for name, bandwidth in (("today", Bandwidth(round(w.limit * 100_000))),
                                    ("unthrottle", ours)):  # fmt: skip
                ratio = simulate_series(demand, bandwidth).throttle_ratio
                rows.append((w.name if name == "today" else "", name,
                             f"{format_cpu((bandwidth.quota_us or 0) // 100)} / "
                             f"{bandwidth.burst_us / 1000:g} ms",
                             f"{ratio * 100:.0f} %", "–"))  # fmt: skip
    say("before and after, by the model")
    table(rows)
    print(f"\nThe HTML report: {report}")


def main() -> int:
    if not have_prometheus():
        print("the demo needs Debian's prometheus: make demo installs it as root")
        return 1
    with tempfile.TemporaryDirectory(prefix="unthrottle-demo-") as folder:
        layout = None
        if os.geteuid() == 0:
            from unthrottle.cgroups import CgroupError, detect_layout

            try:
                layout = detect_layout()
            except CgroupError as error:
                print(f"no usable cgroup CPU controller ({error})")
        try:
            if layout is not None:
                on_the_kernel(layout, Path(folder))
            else:
                on_the_model(Path(folder))
        except KeyboardInterrupt:
            print("\ninterrupted: everything started was stopped, and the cgroups removed")
            return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
