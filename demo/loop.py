"""`make demo`: the whole loop on this machine, on a real control plane and a real node.

    .venv/bin/python demo/loop.py            (run by `make demo`; root: the node makes cgroups)

1. A real Kubernetes control plane starts in the demo's temp folder (kube-apiserver, etcd,
   kube-controller-manager, kube-scheduler), and a real node joins it: a kubelet,
   containerd and runc, built from their Go modules by `make controlplane`
   (``unthrottle_lab.kube.RealNode``). The chart's RBAC is applied (rendered by Helm's
   own SDK): the operator and the agent run on their ServiceAccounts' tokens.
2. Two Deployments of the workload image (the request pool and the parallel batch from
   scenarios/, both throttled today) are scheduled onto the node; the kubelet makes their
   cgroups, the pod-level quota included, and each pod runs its scenario over and over
   (``unthrottle-lab workload``).
3. The node agent finds the containers' cgroups below the node's cgroup root, names them
   through the API and writes the burst pod annotations ask for; a real Prometheus scrapes
   it and the kubelet's ``/metrics/cadvisor`` (HTTPS, a token allowed ``nodes/metrics``).
4. ``unthrottle operator`` runs as a process, as users run it: a ThrottlePolicy in
   Recommend mode, then Apply with ``apply.method: InPlace``: each running pod is resized
   through its ``resize`` subresource and the real kubelet writes the new quota; the
   operator verifies its canary for ``apply.verifyFor`` and gives its own verdict. A
   Deployment its Apply run leaves as it is (``UpToDate``: beside a CPU hog the batch waits
   behind other processes, not on its quota, and the node is oversubscribed) is not waited
   for: the demo prints the operator's reasons and measures it as it is.
5. Before and after, from the kernel's counters of the cgroups the kubelet made (the
   container's and the pod's), and the p99 the pods' own logs report; the HTML report.

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
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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
from unthrottle_lab.children import stop
from unthrottle_lab.kube import (
    BuildError,
    ControlPlane,
    KubectlError,
    RealNode,
    StartError,
    ensure_built,
    ensure_node_built,
    scenario_objects,
)
from unthrottle_lab.kube.admin import Admin, until
from unthrottle_lab.prometheus import PrometheusServer, free_port, have_prometheus

ROOT = Path(__file__).resolve().parent.parent
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
RELEASE_NS = "unthrottle"
"""Where the chart's ServiceAccounts live (its release namespace)."""
VERIFY = "1m"
"""``apply.verifyFor``: the least the policy allows; the demo waits for the verdict."""
APPS = (("pool", "tune-open-pool.yaml", "600m", "150m"),
        ("batch", "tune-batch-parallel.yaml", "1", "250m"))  # fmt: skip
"""Name, scenario, CPU limit (as in the scenario) and request of each Deployment."""
SAVE = os.environ.get("UNTHROTTLE_DEMO_JSON")
"""Where to write the before / after figures as JSON too (the demo's test reads them)."""
LOGS = os.environ.get("UNTHROTTLE_DEMO_LOGS")
"""A folder to copy the logs into before the demo removes its own (the kubelet's,
containerd's, the control plane's, the agent's, the operator's) and the policy's last
status: the demo's test keeps them beside a failure."""


# -- the cluster: a control plane, a real node, the chart's RBAC ---------------------------


@contextmanager
def cluster(folder: Path) -> Iterator[tuple[Admin, RealNode]]:
    """The control plane (no fake node) and the real node, the CRD applied with kubectl as
    the README says, the ``shop`` namespace; stopped by PID at the end, node first."""
    say("1. a real control plane and a real node (kubelet, containerd, runc), built from "
        "their Go modules")  # fmt: skip
    plane = ControlPlane(folder / "control-plane", nodes=0, binaries=ensure_built())
    with plane, RealNode(plane, folder / "node") as node:
        print(f"  Kubernetes {plane.version} at {plane.server}: kube-apiserver, etcd, "
              f"kube-controller-manager, kube-scheduler, ready in {plane.started_in_s:.0f} s",
              flush=True)  # fmt: skip
        print(f"  node {node.name}: kubelet {plane.version}, containerd and runc, cgroupfs "
              f"driver, pods below /{node.cgroup_parent}/kubepods, Ready in "
              f"{node.started_in_s:.0f} s", flush=True)  # fmt: skip
        try:
            plane.install_crds(ROOT / "crds" / "throttlepolicy.yaml")
        except KubectlError as error:
            raise SystemExit(str(error)) from None
        admin = Admin(plane)
        for namespace in (NS, RELEASE_NS):
            admin.create_namespace(namespace)
        try:
            yield admin, node
        finally:
            if LOGS:
                keep_logs(admin, folder, Path(LOGS))


def keep_logs(admin: Admin, folder: Path, into: Path) -> None:
    """Copy every log below the demo's folder, and the policy's status, into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for path in folder.rglob("*.log"):
        if path.is_file():
            shutil.copyfile(path, into / "-".join(path.relative_to(folder).parts))
    try:
        (into / "policy.json").write_text(json.dumps(admin.get(POLICIES, NS, "demo"), indent=1))
    except Exception as error:  # the logs matter more than the status here
        (into / "policy.json").write_text(json.dumps({"error": str(error)}))


def chart_rbac(admin: Admin) -> dict[str, str]:
    """The chart's ServiceAccounts and RBAC, rendered by Helm's Go SDK (helm-python-sdk, as
    ``helm template``) with Apply enabled and the operator watching ``shop``, applied with
    kubectl; component → ServiceAccount name. The admission webhook is off: each Deployment
    has one pod, and no new pod is made while the demo runs."""
    import helm_python as helm
    import yaml

    values = {"operator": {"watchNamespaces": [NS],
                           "apply": {"enabled": True,
                                     "inPlace": {"enabled": True, "webhook": False}}},
              # the chart requires an image; only its RBAC is applied here, on a node
              # whose processes run on the host
              "image": {"repository": "unthrottle.invalid/local"}}  # fmt: skip
    with (
        helm.Chart.load(ROOT / "charts" / "unthrottle") as chart,
        helm.Config(kubeconfig_path=admin.plane.kubeconfig, namespace=RELEASE_NS) as config,
    ):
        files = config.render(chart, values, name="unthrottle", namespace=RELEASE_NS,
                              is_install=True)  # fmt: skip
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = [doc for path, text in sorted(files.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc and doc["kind"] in kinds]  # fmt: skip
    rendered = admin.plane.folder / "chart-rbac.yaml"
    rendered.write_text(yaml.safe_dump_all(rbac))
    admin.plane.kubectl("apply", "-f", str(rendered))
    return {doc["metadata"]["labels"]["app.kubernetes.io/component"]: doc["metadata"]["name"]
            for doc in rbac if doc["kind"] == "ServiceAccount"}  # fmt: skip


def prometheus_token(admin: Admin, folder: Path) -> Path:
    """A ServiceAccount for Prometheus, allowed ``get nodes/metrics`` (what the kubelet's
    webhook authorization asks the API server for ``/metrics/cadvisor``); its token's file."""
    rules = [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]
    admin.create("v1/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": "prometheus",
                                                     "namespace": RELEASE_NS}})  # fmt: skip
    admin.create("rbac.authorization.k8s.io/v1/clusterroles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "prometheus-kubelet"}, "rules": rules})  # fmt: skip
    admin.create("rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "prometheus-kubelet"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "prometheus-kubelet"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus",
                      "namespace": RELEASE_NS}]})  # fmt: skip
    path = folder / "prometheus.token"
    path.write_text(admin.token(RELEASE_NS, "prometheus"))
    path.chmod(0o600)
    return path


def scrape_config(agent_port: int, node: RealNode, token: Path) -> str:
    """The agent over HTTP; the kubelet's cAdvisor over HTTPS (the cluster's CA), with the
    token, as a Prometheus in the cluster scrapes it."""
    kubelet = urllib.parse.urlparse(node.endpoint).netloc
    return ("scrape_configs:\n"
            "  - job_name: agent\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n"
            "  - job_name: kubelet-cadvisor\n"
            "    scheme: https\n    metrics_path: /metrics/cadvisor\n"
            f"    authorization: {{credentials_file: '{token}'}}\n"
            f"    tls_config: {{ca_file: '{node.plane.pki.ca}'}}\n"
            f"    static_configs: [{{targets: ['{kubelet}']}}]\n")  # fmt: skip


def deploy(admin: Admin, node: RealNode) -> dict[str, Pod]:
    """The two Deployments of the workload image onto the node; their pods once Ready."""
    say("2. two Deployments of the workload image, scheduled onto the real node: the kubelet "
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


# -- the agent and the operator, as processes ------------------------------------------------


def wait_healthy(url: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the agent did not become healthy at {url}")


@contextmanager
def process(name: str, args: list[str], log: Path, env: dict[str, str] | None = None
            ) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})  # fmt: skip
    try:
        yield proc
    finally:
        stop(proc, timeout_s=20)
        if proc.returncode not in (0, -15, None):
            print(f"  ({name} ended with {proc.returncode}: its log is {log})")


@contextmanager
def agent(admin: Admin, node: RealNode, kubeconfig: Path, folder: Path) -> Iterator[int]:
    """``unthrottle agent`` on the node's cgroup root, on the chart's agent ServiceAccount:
    its port.

    ``--burst-node-threshold 1``: its node safety (no burst while the node's CPU is above
    the threshold, 0.5 by default) never holds a burst back here. On this 2-core machine the
    burstable workloads are the ones measured, and their own bursts make the machine busy:
    at 0.5, the agent would take the burst away during the very window that measures it."""
    port = free_port()
    with process("the agent", [
        str(UNTHROTTLE), "agent", "--kubeconfig", str(kubeconfig), "--node-name", node.name,
        "--kubepods-parent", node.cgroup_parent, "--listen", f"127.0.0.1:{port}",
        "--period", "100ms", "--discover-every", "500ms", "--burst-node-threshold", "1",
        "--burst", "--burst-namespace", NS,  # the demo's namespace writes bursts
    ], folder / "agent.log"):  # fmt: skip
        wait_healthy(f"http://127.0.0.1:{port}/healthz")
        yield port


@contextmanager
def operator(kubeconfig: Path, prometheus_url: str, folder: Path) -> Iterator[None]:
    """``unthrottle operator`` as users run it, on the chart's operator ServiceAccount."""
    with process("the operator", [
        str(UNTHROTTLE), "operator", "--prometheus", prometheus_url, "--namespace", NS,
        "--standalone", "--log-format", "text",
    ], folder / "operator.log", {"KUBECONFIG": str(kubeconfig)}):  # fmt: skip
        yield


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
    say("4. the operator (a process, on the chart's ServiceAccount): Recommend mode")
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
    """The HTML report of the policy's latest result."""
    from unthrottle.report import render
    from unthrottle.report.formats import RenderOptions

    text = render(latest_report(admin), "html",
                  RenderOptions(title="unthrottle demo: policy shop/demo"))  # fmt: skip
    path = Path(tempfile.gettempdir()) / "unthrottle-demo-report.html"
    path.write_text(str(text))
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
    say("5. the operator: Apply mode, apply.method InPlace: each running pod is resized "
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
    say(f"6. the operator verifies each canary for apply.verifyFor ({VERIFY}) on its own "
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
          f"scheduler and a kubelet {plane.version} with containerd and runc; the cgroups, "
          "their quotas and counters are the kubelet's and the kernel's; cAdvisor's series "
          "and a real Prometheus; the agent and `unthrottle operator` as processes on the "
          "chart's RBAC. Not real: one node, on this shared 2-core machine that also runs "
          "the control plane, Prometheus and the demo; the agent and the operator run on the "
          "host, not as the chart's pods; the images are built here from this checkout, not "
          "pulled; the workloads are the lab's scenarios. On a real cluster, install the "
          "chart and apply a policy, see README.md)")  # fmt: skip


# -- the whole loop --------------------------------------------------------------------------


def on_the_node(layout: Any, folder: Path) -> dict[str, Any]:
    with cluster(folder) as (admin, node):
        accounts = chart_rbac(admin)
        kubeconfigs = {c: admin.kubeconfig_for(folder / f"{c}.kubeconfig", RELEASE_NS, sa)
                       for c, sa in accounts.items()}  # fmt: skip
        token = prometheus_token(admin, folder)
        print(f"  the chart's RBAC applied; the operator and the agent run as "
              f"{', '.join(f'{RELEASE_NS}/{sa}' for sa in accounts.values())}")  # fmt: skip
        today = deploy(admin, node)
        for name, pod in today.items():
            print(f"  {name}: pod {NS}/{pod.name}, limit {format_cpu(pod.limit_millicores)}, "
                  f"{pod.qos}; cgroup /{pod.cgroup(node)}/{pod.container_id[:12]}…")  # fmt: skip
        (folder / "prometheus").mkdir()
        with (
            agent(admin, node, kubeconfigs["agent"], folder) as port,
            PrometheusServer(folder / "prometheus",
                             scrape=scrape_config(port, node, token)) as prom,
        ):  # fmt: skip
            say("3. the node agent finds the containers' cgroups below the node's root and "
                "names them through the API; Prometheus scrapes it and the kubelet's "
                "/metrics/cadvisor (HTTPS, a token allowed nodes/metrics)")  # fmt: skip
            until("cAdvisor's series of both containers in Prometheus",
                  lambda: cadvisor_containers(prom.url),
                  lambda found: all(f"{p.name}/{CONTAINER}" in found for p in today.values()),
                  timeout_s=60)  # fmt: skip
            before = measure(layout, node, today, "today")
            waits = [agent_wait(prom.url, today)]
            with operator(kubeconfigs["operator"], prom.url, folder):
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
        results = compare(
            today, now, before, after, (waits[0], waits[1]), expectations(recommended)
        )
        misses = honest(results, recommended)
        for line in misses:
            print(f"  measured: {line}")
        pids = [*admin.plane.pids().values(), *node.pids().values()]
        doc = {"target": TARGET, "workloads": results, "named": named, "cadvisor": cadvisor,
               "recommended": recommended.get("workloads"), "report": str(report),
               "verdicts": {n: {"verdict": r.verdict, "reason": r.verdict_reason,
                                "ratio_after": r.ratio_after} for n, r in records.items()},
               "left": left, "misses": misses, "folder": str(folder), "pids": pids,
               "cgroup_root": str(node.cgroup_root)}  # fmt: skip
        closing(admin.plane, report)
    return doc


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
