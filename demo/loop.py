"""`make demo`: the whole loop on this machine, on a real control plane and a real node, with
unthrottle installed by its Helm chart as a user installs it.

    .venv/bin/python demo/loop.py            (run by `make demo`; root: the node makes cgroups)

1. A real Kubernetes control plane starts in the demo's temp folder (kube-apiserver, etcd,
   kube-controller-manager, kube-scheduler), and a real node joins it: a kubelet,
   containerd, runc and kube-proxy, built from their Go modules by `make controlplane`
   (``unthrottle_lab.kube.RealNode``).
2. The product's image is built from the Dockerfile (cached by what the build reads:
   ``unthrottle_lab.kube.image``) and imported into the node's containerd, as a registry
   would serve it. A real Prometheus starts on the host where pods reach it, finding the
   agent's and the operator's pods and the kubelet's ``/metrics/cadvisor`` through
   ``kubernetes_sd_configs`` against the API server (HTTPS, a token allowed
   ``nodes/metrics``). The chart is installed by Helm's own Go SDK (what ``helm install
   --wait`` runs): the agent's DaemonSet and the operator's Deployment run as pods on the
   node, on the chart's ServiceAccounts and RBAC, and reach the API server through the
   ``kubernetes`` Service (kube-proxy). The demo prints the user's equivalent commands and
   the pods' status.
3. Two Deployments of the workload image (the request pool and the parallel batch from
   scenarios/, both throttled today) are scheduled onto the node; the kubelet makes their
   cgroups, the pod-level quota included, and each pod runs its scenario over and over
   (``unthrottle-lab workload``). The agent pod finds their cgroups and names them through
   the API.
4. A ThrottlePolicy in Recommend mode, applied as a user applies it; the operator pod writes
   its status and report ConfigMap, which ``unthrottle report`` renders from the host.
5. Apply with ``apply.method: InPlace``: the operator pod resizes each running pod through
   its ``resize`` subresource and the real kubelet writes the new quota; the agent pod
   writes the burst the operator's annotation asks for; the operator verifies its canary
   for ``apply.verifyFor`` and gives its own verdict. A Deployment its Apply run leaves as
   it is (``UpToDate``: beside a CPU hog the batch waits behind other processes, not on its
   quota, and the node is oversubscribed) is not waited for: the demo prints the operator's
   reasons and measures it as it is.
6. Before and after, from the kernel's counters of the cgroups the kubelet made (the
   container's and the pod's), and the p99 the pods' own logs report; the HTML report.
7. The policy is deleted and the chart uninstalled (``helm uninstall --wait``); the demo
   lists what is left of the release: nothing.

Without root there is no node to start (the kubelet, containerd and runc need it): the demo
says so and exits; `make demo-lab` shows the model and `recommend` without root.
Everything started here is stopped by its PID, and the node's cgroups, mounts and bridge
removed, also on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from measuring import (
    CONTAINER,
    NS,
    TARGET,
    Pod,
    agent_wait,
    cadvisor_containers,
    compare,
    expectations,
    honest,
    measure,
    named_by_agent,
    say,
)

from unthrottle.units import format_cpu
from unthrottle_lab.kube import (
    BuildError,
    ControlPlane,
    RealNode,
    StartError,
    ensure_built,
    ensure_node_built,
    scenario_objects,
)
from unthrottle_lab.kube import chart as helm_chart
from unthrottle_lab.kube.admin import Admin, until
from unthrottle_lab.kube.image import build_product_image, import_image
from unthrottle_lab.kube.images import Image
from unthrottle_lab.kube.prometheus_build import ensure_prometheus_built
from unthrottle_lab.prometheus import PrometheusServer, have_prometheus

ROOT = Path(__file__).resolve().parent.parent
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
RELEASE_NS = helm_chart.NAMESPACE
"""The chart's release namespace (``helm install -n unthrottle``)."""
MONITORING_NS = "monitoring"
"""Where Prometheus's ServiceAccount lives (a user's Prometheus is not the release's)."""
VERIFY = "1m"
"""``apply.verifyFor``: the least the policy allows; the demo waits for the verdict."""
APPS = (("pool", "tune-open-pool.yaml", "600m", "150m"),
        ("batch", "tune-batch-parallel.yaml", "1", "250m"))  # fmt: skip
"""Name, scenario, CPU limit (as in the scenario) and request of each Deployment."""
SAVE = os.environ.get("UNTHROTTLE_DEMO_JSON")
"""Where to write the before / after figures as JSON too (the demo's test reads them)."""
LOGS = os.environ.get("UNTHROTTLE_DEMO_LOGS")
"""A folder to copy the logs into before the demo removes its own (the kubelet's,
containerd's, the control plane's, the agent pod's, the operator pod's) and the policy's
last status: the demo's test keeps them beside a failure."""


# -- the cluster: a control plane, a real node ---------------------------------------------


@contextmanager
def cluster(folder: Path) -> Iterator[tuple[Admin, RealNode]]:
    """The control plane (no fake node) and the real node, the ``shop`` namespace (the
    operator's watched namespace must exist before the install); stopped by PID at the
    end, node first."""
    say("1. a real control plane and a real node (kubelet, containerd, runc, kube-proxy), "
        "built from their Go modules")  # fmt: skip
    plane = ControlPlane(folder / "control-plane", nodes=0, binaries=ensure_built())
    with plane, RealNode(plane, folder / "node") as node:
        print(f"  Kubernetes {plane.version} at {plane.server}: kube-apiserver, etcd, "
              f"kube-controller-manager, kube-scheduler, ready in {plane.started_in_s:.0f} s",
              flush=True)  # fmt: skip
        print(f"  node {node.name}: kubelet {plane.version}, containerd and runc, cgroupfs "
              f"driver, pods below /{node.cgroup_parent}/kubepods, Ready in "
              f"{node.started_in_s:.0f} s", flush=True)  # fmt: skip
        admin = Admin(plane)
        admin.create_namespace(NS)
        try:
            yield admin, node
        finally:
            if LOGS:
                keep_logs(admin, folder, Path(LOGS))


def keep_logs(admin: Admin, folder: Path, into: Path) -> None:
    """Copy every log below the demo's folder (the pods' logs included, saved there before
    the uninstall), and the policy's status, into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for path in folder.rglob("*.log"):
        if path.is_file():
            shutil.copyfile(path, into / "-".join(path.relative_to(folder).parts))
    try:
        kept = folder / "policy.json"  # saved before the policy's deletion
        found = json.loads(kept.read_text()) if kept.exists() else admin.get(POLICIES, NS, "demo")
        (into / "policy.json").write_text(json.dumps(found, indent=1))
    except Exception as error:  # the logs matter more than the status here
        (into / "policy.json").write_text(json.dumps({"error": str(error)}))


# -- Prometheus on the host -----------------------------------------------------------------


def prometheus() -> Path:
    """A Prometheus with Kubernetes discovery, as a user's has (Debian's is built without
    it: ``unthrottle_lab.kube.prometheus_build``), built by ``make controlplane``."""
    return ensure_prometheus_built()


# -- the chart, installed as a user installs it ----------------------------------------------


def product_image() -> Image:
    """The product's image from the Dockerfile (the cache's, when it has it)."""
    started = time.monotonic()
    image = build_product_image()
    print(f"  image {image.name} from the Dockerfile ({time.monotonic() - started:.0f} s; "
          "cached by what the build reads)", flush=True)  # fmt: skip
    return image


def demo_values(node: RealNode, image: Image, prometheus_port: int) -> dict[str, Any]:
    """The chart's values: what the real node needs (``node_values``), the operator watching
    ``shop`` with Apply and InPlace on (and its webhook, the chart's default), and the
    agent writing bursts in ``shop``.

    ``agent.burst.nodeThreshold: 1``: its node safety (no burst while the node's CPU is
    above the threshold, 0.5 by default) never holds a burst back here. On this 2-core
    machine the burstable workloads are the ones measured, and their own bursts make the
    machine busy: at 0.5, the agent would take the burst away during the very window that
    measures it. ``discoverEvery: 1s`` finds the demo's new pods sooner than the default."""
    base = helm_chart.node_values(node, image, helm_chart.prometheus_url(prometheus_port))
    return helm_chart.merged(base, {
        "operator": {"watchNamespaces": [NS], "logFormat": "text",
                     "apply": {"enabled": True, "inPlace": {"enabled": True}}},
        "agent": {"discoverEvery": "1s",
                  "burst": {"enabled": True, "namespaces": [NS], "nodeThreshold": 1}},
    })  # fmt: skip


def set_flags(values: Any, prefix: str = "") -> list[str]:
    """``--set`` flags that give ``values`` on Helm's command line."""
    if isinstance(values, dict):
        return [f for k, v in values.items() for f in set_flags(v, f"{prefix}{k}.")]
    key = prefix.rstrip(".")
    if isinstance(values, list) and all(isinstance(v, dict) for v in values):
        return [f for i, v in enumerate(values) for f in set_flags(v, f"{key}[{i}].")]
    if isinstance(values, list):
        return [f"{key}={{{','.join(str(v) for v in values)}}}"]
    shown = str(values).lower() if isinstance(values, bool) else str(values)
    return [f"{key}={shown}"]


def show_commands(image: Image, values: dict[str, Any]) -> None:
    """What a user types for the same install (the demo's own steps, in Helm's words)."""
    flags = " \\\n    ".join(f"--set {f}" for f in set_flags(values))
    print(f"  a user's equivalent:\n"
          f"  docker buildx build -t {image.name} --push .   # here: built with buildah, "
          "imported into the node's containerd\n"
          f"  helm install unthrottle charts/unthrottle -n {RELEASE_NS} --create-namespace "
          f"--wait \\\n    {flags}\n"
          f"  kubectl get pods -n {RELEASE_NS}", flush=True)  # fmt: skip


def pods_table(admin: Admin) -> list[dict[str, Any]]:
    """The release's pods as ``kubectl get pods -n unthrottle`` shows them (from the API)."""
    rows = []
    for pod in admin.list("v1/pods", RELEASE_NS, selector="app.kubernetes.io/instance="
                          + helm_chart.RELEASE):  # fmt: skip
        statuses = pod["status"].get("containerStatuses") or []
        rows.append({"name": pod["metadata"]["name"],
                     "component": pod["metadata"]["labels"].get("app.kubernetes.io/component"),
                     "ready": f"{sum(bool(s.get('ready')) for s in statuses)}/{len(statuses)}",
                     "phase": str(pod["status"].get("phase")),
                     "restarts": sum(int(s.get("restartCount") or 0) for s in statuses),
                     "node": pod["spec"].get("nodeName")})  # fmt: skip
    print(f"  $ kubectl get pods -n {RELEASE_NS} -o wide")
    print(f"  {'NAME':<40} {'READY':<6} {'STATUS':<8} {'RESTARTS':<9} NODE")
    for r in rows:
        print(f"  {r['name']:<40} {r['ready']:<6} {r['phase']:<8} {r['restarts']:<9} {r['node']}")
    return rows


@contextmanager
def release(admin: Admin, node: RealNode, image: Image, prometheus_port: int,
            folder: Path) -> Iterator[dict[str, Any]]:  # fmt: skip
    """``helm install --wait`` of the chart for the block; at its end the pods' logs kept
    (pods/log), the policy deleted while the operator still runs (its Kopf finalizer), the
    release uninstalled and what is left of it listed. Yields a record the end completes."""
    say("2. the product's image, imported into the node's containerd; the chart installed "
        "by Helm's Go SDK (helm install --wait): the agent and the operator as pods")  # fmt: skip
    started = time.monotonic()
    import_image(node, image)
    print(f"  imported into the node's containerd in {time.monotonic() - started:.0f} s")
    values = demo_values(node, image, prometheus_port)
    show_commands(image, values)
    started = time.monotonic()
    try:
        done = helm_chart.install(admin.plane, values)
    except Exception as error:
        keep_pod_logs(admin, folder)
        raise SystemExit(f"helm install failed: {error}") from None
    took = time.monotonic() - started
    print(f"  helm install --wait: deployed in {took:.0f} s", flush=True)
    rec: dict[str, Any] = {"install_s": round(took, 1), "values": values,
                           "pods": pods_table(admin)}  # fmt: skip
    try:
        yield rec
    except BaseException:
        rec["pod_logs"] = keep_pod_logs(admin, folder)
        with suppress(Exception):  # the first error matters; the node goes anyway
            helm_chart.uninstall(admin.plane, done)
        raise
    else:
        rec["pod_logs"] = keep_pod_logs(admin, folder)
        (folder / "policy.json").write_text(json.dumps(admin.get(POLICIES, NS, "demo")))
        say("9. the policy deleted, the chart uninstalled (helm uninstall --wait)")
        delete_policy(admin)
        started = time.monotonic()
        helm_chart.uninstall(admin.plane, done)
        rec["uninstall_s"] = round(time.monotonic() - started, 1)
        rec["left_at_once"] = left_of(admin, done, folder)
        with suppress(TimeoutError):  # Helm's --wait: its own objects gone, not their pods
            admin.until("the release's pods gone", lambda: left_of(admin, done, folder),
                        lambda left: not left, timeout_s=90, every_s=1)  # fmt: skip
        rec["gone_s"] = round(time.monotonic() - started, 1)
        rec["left"] = left_of(admin, done, folder)
        print(f"  helm uninstall --wait returned in {rec['uninstall_s']:.0f} s, leaving "
              f"{', '.join(rec['left_at_once']) or 'nothing'} (terminating)")  # fmt: skip
        print(f"  after {rec['gone_s']:.0f} s, the release's objects left (its manifest's and "
              f"every object labelled app.kubernetes.io/instance={helm_chart.RELEASE}): "
              f"{', '.join(rec['left']) or 'none'}; the CRDs stay (Helm leaves crds/)")  # fmt: skip


def keep_pod_logs(admin: Admin, folder: Path) -> dict[str, str]:
    """Each of the release's pods' logs (the API's pods/log) into ``folder/pods``:
    component → file."""
    out = {}
    (folder / "pods").mkdir(exist_ok=True)
    for pod in admin.list("v1/pods", RELEASE_NS, selector="app.kubernetes.io/instance="
                          + helm_chart.RELEASE):  # fmt: skip
        name = pod["metadata"]["name"]
        status, text = admin.plane.request("GET", f"/api/v1/namespaces/{RELEASE_NS}/pods/"
                                           f"{name}/log")  # fmt: skip
        text = text if isinstance(text, str) else json.dumps(text)
        path = folder / "pods" / f"{name}.log"
        path.write_text(text if status == 200 else f"HTTP {status}: {text}")
        out[pod["metadata"]["labels"].get("app.kubernetes.io/component", name)] = path.name
    return out


def delete_policy(admin: Admin) -> None:
    """Delete the policy and wait until it is gone: the operator pod removes its finalizer."""
    path = f"/apis/unthrottle.io/v1alpha1/namespaces/{NS}/throttlepolicies/demo"
    admin.call("DELETE", path, ok=(200, 202, 404))
    admin.until(
        "the policy deleted (the operator pod removes its finalizer)",
        lambda: admin.get(POLICIES, NS, "demo"),
        lambda p: p is None,
        timeout_s=60,
    )


def left_of(admin: Admin, done: Any, folder: Path) -> list[str]:
    """What is left of the release: each object of its manifest, and every object labelled
    with its instance (pods, ReplicaSets, the webhook's Secret…), as kubectl lists them."""
    manifest = folder / "release-manifest.yaml"
    manifest.write_text(done.manifest)
    named = admin.plane.kubectl("get", "-f", str(manifest), "--ignore-not-found", "-o", "name")
    kinds = ("all,serviceaccounts,secrets,configmaps,roles,rolebindings,clusterroles,"
             "clusterrolebindings,priorityclasses,mutatingwebhookconfigurations,"
             "poddisruptionbudgets,controllerrevisions")  # fmt: skip
    labelled = admin.plane.kubectl("get", kinds, "-A", "-o", "name", "-l",
                                   f"app.kubernetes.io/instance={helm_chart.RELEASE}")  # fmt: skip
    return sorted(set(named.split()) | set(labelled.split()))


def deploy(admin: Admin, node: RealNode) -> dict[str, Pod]:
    """The two Deployments of the workload image onto the node; their pods once Ready."""
    say("3. two Deployments of the workload image, scheduled onto the real node: the kubelet "
        "makes their cgroups, each pod runs its scenario over and over")  # fmt: skip
    for name, file, limit, request in APPS:
        for obj in scenario_objects(name, NS, (ROOT / "scenarios" / file).read_text(),
                                    image=node.images["workload"].name, node=node.name,
                                    cpu_limit=limit, cpu_request=request,
                                    labels={"demo": "unthrottle"}):  # fmt: skip
            admin.create("v1/configmaps" if obj["kind"] == "ConfigMap" else DEPLOYMENTS, obj)
    return {name: ready_pod(admin, name) for name, *_ in APPS}


def ready_pod(admin: Admin, name: str) -> Pod:
    def ready(pods: list[dict[str, Any]]) -> bool:
        conditions = pods[0]["status"].get("conditions") or []
        return len(pods) == 1 and any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in conditions)  # fmt: skip

    pods = admin.until(f"{name}'s pod Ready", lambda: admin.list("v1/pods", NS,
                                                                 selector=f"app={name}"),
                       ready, timeout_s=120)  # fmt: skip
    return Pod.of(pods[0])


def current(admin: Admin, pods: dict[str, Pod]) -> dict[str, Pod]:
    return {name: Pod.of(admin.get("v1/pods", NS, pod.name) or {}) for name, pod in pods.items()}


# -- the operator's steps ------------------------------------------------------------------


def policy(admin: Admin, spec: dict[str, Any]) -> None:
    """Create the policy, or merge ``spec`` into it."""
    if admin.get(POLICIES, NS, "demo") is None:
        admin.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                                "metadata": {"namespace": NS, "name": "demo"},
                                "spec": spec})  # fmt: skip
    else:
        admin.patch(POLICIES, NS, "demo", {"spec": spec})


def status(admin: Admin) -> dict[str, Any]:
    return dict((admin.get(POLICIES, NS, "demo") or {}).get("status") or {})


def show_status(found: dict[str, Any]) -> None:
    for w in found.get("workloads", []):
        for c in w["containers"]:
            rec = c["recommended"] or {}
            span = c.get("expectedThrottleRatioRange") or [c["expectedThrottleRatio"] or 0] * 2
            shown = (
                f"{span[1] * 100:.1f} %"
                if span[0] == span[1]
                else f"{span[1] * 100:.1f} % ({span[0] * 100:.1f} % beside the same neighbours)"
            )
            print(f"  {w['deployment']:<6} {w['state']:<11} limit {c['current']['cpuLimit']} → "
                  f"{rec.get('cpuLimit')}, burst {rec.get('burst')}, throttled "
                  f"{(c['throttleRatio'] or 0) * 100:.0f} % of periods → expected "
                  f"{shown}  "
                  f"({w['message'] or c['reason']})")  # fmt: skip


def recommend(admin: Admin) -> dict[str, Any]:
    """The policy in Recommend mode, once the operator has a recommendation for both."""
    say("5. a ThrottlePolicy in Recommend mode; the operator pod writes its status and report")
    policy(admin, {"window": "10m", "targetThrottleRatio": TARGET,
                   "selector": {"matchLabels": {"demo": "unthrottle"}}})  # fmt: skip

    def both(found: dict[str, Any]) -> bool:
        recommended = [c for w in found.get("workloads", []) for c in w["containers"]
                       if c.get("recommended")]  # fmt: skip
        return len(recommended) == len(APPS)

    found = admin.until("a recommendation for both Deployments in the policy's status",
                        lambda: status(admin), both, timeout_s=120)  # fmt: skip
    show_status(found)
    return found


def latest_report(admin: Admin) -> Any:
    """The report of the policy's latest result (its report ConfigMap)."""
    from unthrottle.report import Report

    cm = admin.until("the policy's report ConfigMap",
                     lambda: admin.get("v1/configmaps", NS, "demo-report"), bool)  # fmt: skip
    assert cm is not None
    return Report.from_json(json.loads(cm["data"]["report.json"]))


def write_report(admin: Admin) -> Path:
    """The HTML report of the policy's latest result, by ``unthrottle report`` from the host
    (it reads the report ConfigMap the operator pod wrote)."""
    latest_report(admin)  # written by now
    path = Path(tempfile.gettempdir()) / "unthrottle-demo-report.html"
    args = [str(UNTHROTTLE), "report", "demo", "-n", NS, "--format", "html", "--output",
            str(path), "--kubeconfig", str(admin.plane.kubeconfig)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise SystemExit(f"unthrottle report failed: {done.stderr.strip()}")
    print(f"  $ unthrottle report demo -n {NS} --format html --output {path}")
    return path


def record(admin: Admin, deployment: str) -> Any:
    """The Deployment's record (``unthrottle.io/last-applied``), or None."""
    from unthrottle.kube.patching import record_of

    return record_of(admin.get(DEPLOYMENTS, NS, deployment) or {})


LEFT = frozenset({"UpToDate"})
"""States in which Apply mode changes nothing: the recommendation is today's settings."""


def applied(admin: Admin, names: Sequence[str], generation: int
            ) -> tuple[dict[str, Any], dict[str, str]]:  # fmt: skip
    """Each Deployment's record once its canary is resized and reported done, or its state
    once the operator's run for the Apply spec (``generation``) left it as it is."""

    def read() -> tuple[dict[str, Any], dict[str, Any]]:
        return {n: record(admin, n) for n in names}, status(admin)

    def settled(found: tuple[dict[str, Any], dict[str, Any]]) -> bool:
        records, now = found
        seen = (now.get("observedGeneration") or 0) >= generation
        states = {w["deployment"]: w["state"] for w in now.get("workloads", [])}
        return all((records[n] is not None and records[n].canary_done_at)
                   or (records[n] is None and seen and states.get(n) in LEFT)
                   for n in names)  # fmt: skip

    records, now = admin.until("each canary resized and reported done by the kubelet, or "
                               "left as it is by the operator's Apply run", read, settled,
                               timeout_s=180)  # fmt: skip
    left = {w["deployment"]: w["state"] for w in now.get("workloads", [])
            if records.get(w["deployment"]) is None}  # fmt: skip
    return {n: r for n, r in records.items() if r is not None}, left


def resize_in_place(admin: Admin, today: dict[str, Pod]
                    ) -> tuple[dict[str, Pod], dict[str, dict[str, Any]]]:  # fmt: skip
    """Apply mode, InPlace: wait until each canary's resize is reported done, or the operator
    left the Deployment as it is (its recommendation is today's settings: on a node busy
    with other work, the batch may wait mostly behind other processes and not be throttled
    by its quota: docs/recommend.md, "Busy nodes"); the pods now, and the reasons of each
    Deployment left as it is."""
    say("6. the operator pod: Apply mode, apply.method InPlace: each running pod is resized "
        "through its resize subresource (the canary first: here the one pod); the real "
        "kubelet writes the new quota")  # fmt: skip
    policy(admin, {"mode": "Apply", "apply": {"method": "InPlace", "maxConcurrent": 2,
                                              "verifyFor": VERIFY}})  # fmt: skip
    generation = int((admin.get(POLICIES, NS, "demo") or {})["metadata"]["generation"])
    done, states = applied(admin, list(today), generation)
    for name, found in done.items():
        changes = "; ".join(f"limit {format_cpu(c.before.cpu_limit or 0)} → "
                            f"{format_cpu(c.after.cpu_limit or 0)}, burst "
                            f"{c.before.burst_us / 1000:g} → {c.after.burst_us / 1000:g} ms"
                            for c in found.containers)  # fmt: skip
        print(f"  {name:<6} {found.method}: {changes}; canary {found.canary}, resized "
              f"{found.canary_done_at - found.at:.1f} s after the patch")  # fmt: skip
    report = latest_report(admin) if states else None
    left = {name: advice(report, name) | {"state": state} for name, state in states.items()}
    for name, why in left.items():
        print(f"  {name:<6} {why['state']}: left as it is (throttled in "
              f"{(why['throttle_ratio'] or 0) * 100:.0f} % of periods over the operator's "
              "window); its reasons:")  # fmt: skip
        for line in why["reasons"]:
            print(f"           - {line}")
    return current(admin, today), left


def advice(report: Any, deployment: str) -> dict[str, Any]:
    """The Deployment's container in the report: its throttle ratio over the window and the
    recommendation's reasons, step by step."""
    (c,) = [c for w in report.workloads if w.deployment == deployment
            for c in w.containers if c.name == CONTAINER]  # fmt: skip
    return {"throttle_ratio": c.throttle_ratio, "reasons": list(c.notes())}


def burst_written(layout: Any, node: RealNode, pods: dict[str, Pod], timeout_s: float = 30) -> None:
    """Wait until the agent wrote each pod's burst (from the annotation the operator set)
    into its container's cgroup."""
    from unthrottle.cgroups import Cgroup

    for name, pod in pods.items():
        cg = Cgroup(layout, pod.container_cgroup(node))
        try:
            until(f"{name}: the burst of {pod.burst_us} µs in its cgroup",
                  lambda cg=cg: cg.read_bandwidth().burst_us,
                  lambda b, want=pod.burst_us: b == want, timeout_s=timeout_s)  # fmt: skip
        except TimeoutError as error:
            raise SystemExit(str(error)) from None


def verdicts(admin: Admin, names: Sequence[str]) -> dict[str, Any]:
    """Each Deployment's record once the operator has given its verdict on the canary."""
    say(f"7. the operator pod verifies each canary for apply.verifyFor ({VERIFY}) on its own "
        "counters since the resize, then gives its verdict")  # fmt: skip
    found = admin.until("the operator's verdicts",
                        lambda: {n: record(admin, n) for n in names},
                        lambda r: all(x is not None and x.verdict for x in r.values()),
                        timeout_s=240, every_s=2)  # fmt: skip
    for name, rec in found.items():
        after = ", ".join(f"{k} {v * 100:.1f} %" for k, v in rec.ratio_after.items()
                          if v is not None)  # fmt: skip
        print(f"  {name:<6} {rec.verdict}: {rec.verdict_reason or ''}"
              f"{f' (throttled after: {after})' if after else ''}")  # fmt: skip
    return found


def closing(plane: ControlPlane, report: Path) -> None:
    print(f"\nThe HTML report: {report}\n(real: kube-apiserver, etcd, controller-manager, "
          f"scheduler and a kubelet {plane.version} with containerd, runc and kube-proxy; "
          "the chart installed by Helm's Go SDK, the agent and the operator as its pods "
          "from the image the Dockerfile builds; the cgroups, their quotas and counters are "
          "the kubelet's and the kernel's; cAdvisor's series and a real Prometheus. Not "
          "real: one node, on this shared 2-core machine that also runs the control plane, "
          "Prometheus and the demo; the images are built here from this checkout and "
          "imported, not pulled; Prometheus runs on the host, not in the cluster; the "
          "workloads are the lab's scenarios. On a real cluster, install the chart and "
          "apply a policy, see README.md)")  # fmt: skip


# -- the whole loop --------------------------------------------------------------------------


def on_the_node(layout: Any, folder: Path) -> dict[str, Any]:
    image = product_image()
    with cluster(folder) as (admin, node):
        admin.create_namespace(MONITORING_NS)
        token = helm_chart.prometheus_token(admin, MONITORING_NS, folder)
        (folder / "prometheus").mkdir()
        scrape = helm_chart.scrape_config(admin.plane, node, token)
        with (
            PrometheusServer(folder / "prometheus", scrape=scrape, listen="0.0.0.0",
                             binary=str(prometheus())) as prom,
            release(admin, node, image, prom.port, folder) as chart,
        ):  # fmt: skip
            doc = the_loop(layout, admin, node, prom) | {"chart": chart}
        doc["pids"] = [*admin.plane.pids().values(), *node.pids().values()]
        doc["cgroup_root"] = str(node.cgroup_root)
        doc["folder"] = str(folder)
        closing(admin.plane, Path(doc["report"]))
    return doc


def the_loop(layout: Any, admin: Admin, node: RealNode, prom: PrometheusServer
             ) -> dict[str, Any]:  # fmt: skip
    """Workloads, Recommend, the report, Apply InPlace, the verdicts and the table, with the
    chart's pods running; the figures for the JSON."""
    today = deploy(admin, node)
    for name, pod in today.items():
        print(f"  {name}: pod {NS}/{pod.name}, limit {format_cpu(pod.limit_millicores)}, "
              f"{pod.qos}; cgroup /{pod.cgroup(node)}/{pod.container_id[:12]}…")  # fmt: skip
    say("4. the agent pod finds the containers' cgroups below the node's root and names them "
        "through the API; Prometheus finds its pod (kubernetes_sd_configs) and scrapes it and the "
        "kubelet's /metrics/cadvisor (HTTPS, a token allowed nodes/metrics)")  # fmt: skip
    until("the agent's and cAdvisor's series of both containers in Prometheus",
          lambda: (named_by_agent(prom.url), cadvisor_containers(prom.url)),
          lambda found: all(f"{NS}/{p.name}/{CONTAINER}" in found[0]
                            and f"{p.name}/{CONTAINER}" in found[1] for p in today.values()),
          timeout_s=90)  # fmt: skip
    before = measure(layout, node, today, "today")
    waits = [agent_wait(prom.url, today)]
    recommended = recommend(admin)
    report = write_report(admin)
    now, left = resize_in_place(admin, today)
    burst_written(layout, node, now)
    after = measure(layout, node, now, "resized")
    waits.append(agent_wait(prom.url, now))
    records = verdicts(admin, [n for n in today if n not in left])
    now = current(admin, today)
    named, cadvisor = named_by_agent(prom.url), cadvisor_containers(prom.url)
    print(f"  the agent named: {', '.join(named)}\n  cAdvisor's series in {NS}: "
          f"{', '.join(cadvisor)} (container \"\": the pod's own cgroup and its pause "
          "container, told apart only by id)")  # fmt: skip
    results = compare(today, now, before, after, (waits[0], waits[1]),
                      expectations(recommended))  # fmt: skip
    misses = honest(results, recommended)
    for line in misses:
        print(f"  measured: {line}")
    return {"target": TARGET, "workloads": results, "named": named, "cadvisor": cadvisor,
            "recommended": recommended.get("workloads"), "report": str(report),
            "verdicts": {n: {"verdict": r.verdict, "reason": r.verdict_reason,
                             "ratio_after": r.ratio_after} for n, r in records.items()},
            "left": left, "misses": misses,
            "status_managers": status_managers(admin)}  # fmt: skip


def status_managers(admin: Admin) -> list[str]:
    """Who wrote the policy's status, as the API server's managedFields record it."""
    found = admin.get(POLICIES, NS, "demo") or {}
    return sorted({f.get("manager", "") for f in found["metadata"].get("managedFields", [])
                   if f.get("subresource") == "status"})  # fmt: skip


def kernel_layout() -> Any:
    """The cgroup layout, when this is root and a CPU controller is there; else None."""
    if os.geteuid() != 0:
        print("make demo needs root: it starts a real node (a kubelet, containerd and runc), "
              "which makes cgroups, mounts and a network bridge. Run it as root; without "
              "root, `make demo-lab` shows the CFS model and `unthrottle recommend` on a day "
              "of history in a real Prometheus.")  # fmt: skip
        return None
    from unthrottle.cgroups import CgroupError, detect_layout

    try:
        return detect_layout()
    except CgroupError as error:
        print(f"make demo needs a cgroup CPU controller for its node: {error}")
        return None


def main() -> int:
    if not have_prometheus():
        print("the demo needs Debian's prometheus: make demo installs it as root")
        return 1
    layout = kernel_layout()
    if layout is None:
        return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="unthrottle-demo-") as folder:
        try:
            ensure_node_built()
            doc = on_the_node(layout, Path(folder))
        except (BuildError, StartError) as error:
            print(f"the control plane or the node could not start: {error}")
            return 1
        except KeyboardInterrupt:
            print("\ninterrupted: everything started was stopped, and the node's cgroups "
                  "removed")  # fmt: skip
            return 130
    doc["elapsed_s"] = round(time.monotonic() - started)
    print(f"({doc['elapsed_s']} s in all, with the control plane's and the node's start)")
    if SAVE:
        Path(SAVE).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
