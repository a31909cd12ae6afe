"""The chart installed the way users install it, its pods running on the real node.

``helm install`` (Helm's Go SDK: the action the CLI runs, CRDs and hooks included) of
charts/unthrottle onto the real control plane, the image built from the Dockerfile
(``make image``) imported into the node's containerd: the operator's Deployment and the
agent's DaemonSet run from it on the real node (kubelet, containerd, runc), reach the API
server through the ``kubernetes`` Service (kube-proxy), and a real Prometheus on the host
finds them by ``kubernetes_sd_configs`` as a user's Prometheus does. Then the user's
journey: a policy over a throttled Deployment, its status and report from the operator
pod, Apply InPlace done by the operator pod and actuated by the kubelet, a new pod given
the applied limit by the webhook through its Service, ``helm upgrade``, ``helm uninstall``.

The tests run in order, on one release (module scope): each step builds on the one before,
as a user's do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from kube import Kube, fresh_name
from missing import MISSING
from prom import PrometheusServer, requires_prometheus
from support.chart_pods import (
    COMPONENT,
    INSTANCE,
    LISTED,
    component_pods,
    container_process,
    drop_prometheus_rbac,
    pod_log,
    query,
    ready,
)
from support.machine import KERNEL_LAYOUT
from support.real_node import _container_cgroup, _running
from unthrottle.cgroups import Layout
from unthrottle.kube.patching import record_of
from unthrottle.scan.readers import CHECKPOINT_LABEL
from unthrottle_lab.kube import BuildError, ControlPlane, RealNode
from unthrottle_lab.kube.admin import Admin
from unthrottle_lab.kube.chart import (
    Installed,
    install,
    merged,
    node_values,
    prometheus_token,
    prometheus_url,
    scrape_config,
    uninstall,
    upgrade,
)
from unthrottle_lab.kube.images import Image
from unthrottle_lab.kube.prometheus_build import ensure_prometheus_built

pytestmark = [requires_prometheus, pytest.mark.kernel]

POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
RELEASE_NS = "unthrottle"
APP = "batch"
STEADY_S = 20
"""How long the pods' steady cost is measured."""
"""Two workers, 60 ms tasks at once, under 500m: throttled in every busy period."""


@dataclass
class Journey:
    kube: Kube
    """The admin, in the workloads' namespace."""
    node: RealNode
    layout: Layout
    prom: PrometheusServer
    image: Image
    installed: Installed
    pod: dict[str, Any]
    """The throttled Deployment's pod, as it started."""
    applied_quota: int | None = None
    """The quota the kubelet wrote for the applied limit (the Apply step's)."""

    def pods(self, component: str) -> list[dict[str, Any]]:
        return component_pods(self.kube, RELEASE_NS, component)

    def status(self) -> dict[str, Any]:
        return dict((self.kube.get(POLICIES, self.kube.namespace, "batch") or {})
                    .get("status") or {})  # fmt: skip

    def app_pods(self) -> list[dict[str, Any]]:
        return list(self.kube.list("v1/pods", self.kube.namespace, selector=f"app={APP}"))


@pytest.fixture(scope="module")
def journey(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
            real_node: RealNode, product_image: Image) -> Iterator[Journey]:  # fmt: skip
    layout = KERNEL_LAYOUT
    assert layout is not None  # the real node would have been skipped
    try:  # Debian's has no kubernetes_sd_configs (unthrottle_lab.kube.prometheus_build)
        prometheus = ensure_prometheus_built()
    except BuildError as error:
        pytest.skip(f"{MISSING} a Prometheus with Kubernetes discovery: {error}")
    folder = tmp_path_factory.mktemp("chart-pods")
    namespace = fresh_name("chart-journey")
    kube = Kube(control_plane, namespace)
    kube.create_namespace(namespace)
    token = prometheus_token(Admin(control_plane), namespace, folder)
    pod = _running(kube, real_node, APP, cpu_limit="500m", cpu_request="250m")
    with PrometheusServer(folder, scrape=scrape_config(control_plane, real_node, token),
                          listen="0.0.0.0", binary=str(prometheus)) as prom:  # fmt: skip
        values = merged(node_values(real_node, product_image, prometheus_url(prom.port)), {
            "operator": {"watchNamespaces": [namespace],
                         "apply": {"enabled": True, "inPlace": {"enabled": True}}},
            # node safety off, as in the demo (demo/loop.py demo_values): on this 2-core
            # machine the throttled app, the control plane and Prometheus keep the node
            # above the default 0.5 half the time, and the agent would take back the very
            # burst the journey checks (tests/kernel/test_burst_writer.py holds node safety)
            "agent": {"burst": {"enabled": True, "namespaces": [namespace],
                                "nodeThreshold": 1}},
        })  # fmt: skip
        started = time.monotonic()
        done = install(control_plane, values, namespace=RELEASE_NS)
        print(f"helm install --wait: both pods Ready {time.monotonic() - started:.1f} s after")
        try:
            yield Journey(kube, real_node, layout, prom, product_image, done, pod)
        finally:
            uninstall(control_plane, done)
            kube.delete("v1/namespaces", None, namespace)
            drop_prometheus_rbac(kube, namespace)


def test_both_pods_run_from_the_image_ready_through_their_own_probes(journey: Journey) -> None:
    (operator,) = journey.pods("operator")
    (agent,) = journey.pods("agent")
    for pod in (operator, agent):
        assert ready(pod), pod["status"]
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == journey.image.name and status["restartCount"] == 0, status
        assert pod["spec"]["nodeName"] == journey.node.name
    # as the node sees them: the operator as uid 10001 with no capability on a read-only
    # root; the agent as root with no capability either, in the node's PID namespace
    op = container_process(journey.node, journey.layout, operator)
    assert (op.uid, op.cap_eff, op.root_read_only, op.pid_namespace_is_hosts) == (
        10001, 0, True, False)  # fmt: skip
    ag = container_process(journey.node, journey.layout, agent)
    assert (ag.uid, ag.cap_eff, ag.root_read_only, ag.pid_namespace_is_hosts) == (
        0, 0, True, True)  # fmt: skip


def test_prometheus_finds_both_pods_and_the_agent_exports_the_demand_and_the_wait(
    journey: Journey,
) -> None:
    ns, url = journey.kube.namespace, journey.prom.url
    for job in ("unthrottle-agent", "unthrottle-operator", "kubelet-cadvisor"):
        journey.prom.until_scraped(job, timeout_s=60)
    app = f'namespace="{ns}",pod="{journey.pod["metadata"]["name"]}",container="app"'

    def series(promql: str) -> float:
        found = query(url, promql)
        return float(found[0]["value"][1]) if found else -1.0

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        throttled = series(f"increase(unthrottle_cpu_cfs_throttled_periods_total{{{app}}}[30s])")
        waited = series(f"increase(unthrottle_cpu_wait_seconds_total{{{app}}}[30s])")
        if throttled > 0 and waited > 0:
            break
        time.sleep(2)
    # named through the API from inside its pod, and the wait read through the node's PID
    # namespace: a throttled thread waits in its run queue
    assert throttled > 0 and waited > 0, (throttled, waited)
    assert series(f"unthrottle_cpu_demand_peak_cores{{{app}}}") > 0
    # the operator's own metrics, from its pod
    assert query(url, 'up{job="unthrottle-operator"} == 1')


def test_the_operator_pod_recommends_and_writes_the_status_and_the_report(
    journey: Journey,
) -> None:
    kube, ns = journey.kube, journey.kube.namespace
    kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                           "metadata": {"namespace": ns, "name": "batch"},
                           "spec": {"window": "10m", "targetThrottleRatio": 0.05,
                                    "selector": {"matchLabels": {"app": APP}}}})  # fmt: skip

    def recommended(status: dict[str, Any]) -> bool:
        return any(c.get("recommended") for w in status.get("workloads", [])
                   for c in w["containers"])  # fmt: skip

    status = kube.until("a recommendation in the policy's status", journey.status, recommended,
                        timeout_s=180)  # fmt: skip
    (workload,) = status["workloads"]
    (container,) = workload["containers"]
    assert container["current"]["cpuLimit"] == "500m"
    assert container["throttleRatio"] > 0.05, container  # throttled today, as measured
    recommended_m = _millicores(container["recommended"]["cpuLimit"])
    assert recommended_m > 500, container
    # kubectl get throttlepolicies: the CRD's columns, filled by the operator pod
    table = kube.plane.kubectl("get", "throttlepolicies", "-n", ns)
    header, row = table.splitlines()[:2]
    assert "MODE" in header and row.split()[0] == "batch", table
    # the report ConfigMap the operator pod wrote, and `unthrottle report` on it
    report = kube.until("the report ConfigMap", lambda: kube.get("v1/configmaps", ns,
                                                                 "batch-report"), bool)  # fmt: skip
    assert report is not None and "report.json" in report["data"]
    (operator,) = journey.pods("operator")
    assert "batch" in pod_log(kube, RELEASE_NS, operator["metadata"]["name"])


def test_apply_in_place_by_the_operator_pod_is_actuated_by_the_kubelet_without_restart(
    journey: Journey,
) -> None:
    kube, ns = journey.kube, journey.kube.namespace
    (before,) = journey.app_pods()
    cid = before["status"]["containerStatuses"][0]["containerID"]
    kube.patch(POLICIES, ns, "batch", {"spec": {
        "mode": "Apply", "apply": {"method": "InPlace", "verifyFor": "1m"}}},
        content_type="application/merge-patch+json")  # fmt: skip

    def resized() -> int | None:
        return _container_cgroup(journey.node, journey.layout, before).read_bandwidth().quota_us

    quota = kube.until("the kubelet writes the new quota", resized,
                       lambda q: q is not None and q > 50_000, timeout_s=180)  # fmt: skip
    (after,) = journey.app_pods()
    status = after["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0  # resized, not restarted
    record = kube.until("the operator's verdict", lambda: record_of(
        kube.get(DEPLOYMENTS, ns, APP) or {}), lambda r: r is not None and r.verdict is not None,
        timeout_s=240)  # fmt: skip
    assert record is not None
    if record.verdict != "Applied":  # what the operator pod saw, for the one who reads this
        (operator,) = journey.pods("operator")
        said = pod_log(kube, RELEASE_NS, operator["metadata"]["name"])
        pytest.fail(
            f"{record.verdict}: {record.verdict_reason} (record {record}); the "
            f"operator pod's log ends:\n{said[-4000:]}"
        )
    assert quota is not None and quota == (record.containers[0].after.cpu_limit or 0) * 100
    journey.applied_quota = quota


def test_a_new_pod_gets_the_applied_limit_from_the_webhook_through_its_service(
    journey: Journey,
) -> None:
    kube, ns = journey.kube, journey.kube.namespace
    (old,) = journey.app_pods()
    kube.delete("v1/pods", ns, old["metadata"]["name"])

    def fresh() -> list[dict[str, Any]]:
        return [p for p in journey.app_pods() if p["metadata"]["uid"] != old["metadata"]["uid"]
                and ready(p)]  # fmt: skip

    (new,) = kube.until("the ReplicaSet's new pod Ready", fresh, bool, timeout_s=120)
    # the template still says 500m: the limit came from the operator pod's webhook, which the
    # API server called through the Service's ClusterIP (kube-proxy)
    template = kube.get(DEPLOYMENTS, ns, APP) or {}
    assert template["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "cpu"] == "500m"  # fmt: skip
    quota = _container_cgroup(journey.node, journey.layout, new).read_bandwidth().quota_us
    assert quota is not None and quota == journey.applied_quota


def test_the_pods_footprint_and_the_agent_is_not_throttled_by_its_own_limit(
    journey: Journey,
) -> None:
    """What each pod costs on the node, from the kubelet's cAdvisor (through Prometheus)
    and the kernel: a throttling tool throttled by its own limit would be a poor first
    impression. The figures go to docs/benchmarks.md ("The chart's pods")."""
    url = journey.prom.url
    pods = {component: journey.pods(component)[0] for component in ("operator", "agent")}
    cgroups = {c: _container_cgroup(journey.node, journey.layout, p) for c, p in pods.items()}
    since_start = {c: cgroup.read_stat() for c, cgroup in cgroups.items()}
    time.sleep(STEADY_S)  # sampling every 100 ms, scraped every second, discovering
    for component, pod in pods.items():
        name = pod["metadata"]["name"]
        stat = cgroups[component].read_stat() - since_start[component]
        labels = f'namespace="{RELEASE_NS}",pod="{name}",container="{component}"'
        memory = query(url, f"container_memory_working_set_bytes{{{labels}}}")
        cpu = query(url, f"rate(container_cpu_usage_seconds_total{{{labels}}}[1m])")
        assert memory and cpu, (component, memory, cpu)
        mib = float(memory[0]["value"][1]) / 2**20
        millicores = float(cpu[0]["value"][1]) * 1000
        start = since_start[component]
        print(
            f"{component}: {mib:.0f} MiB working set, {millicores:.0f}m CPU over the last "
            f"minute; throttled in {stat.nr_throttled} of {stat.nr_periods} periods over "
            f"{STEADY_S} s, {start.nr_throttled} of {start.nr_periods} since its start "
            f"({start.throttled_us / 1e3:.0f} ms, its imports and first discovery)"
        )
        if component == "agent":
            # Its start (Python's imports, the first pod list) runs into its quota: 19 of
            # 542 periods, 311 ms, in the first measurement; that only delays its Ready.
            # Working, it must not be throttled: its windows would stretch.
            assert stat.nr_periods > STEADY_S * 5, stat  # it ran, under its CFS quota
            assert stat.nr_throttled <= 0.01 * stat.nr_periods, stat


def test_pod_security_restricted_admits_the_operator_and_only_privileged_the_agent(
    journey: Journey,
) -> None:
    """As docs/install.md says: the operator's pod spec passes Pod Security ``restricted``;
    the agent's (root, hostPID, the host's cgroupfs) needs ``privileged``. The real API
    server's PodSecurity admission decides, on the pod templates Helm installed."""
    kube = journey.kube
    docs = [d for d in yaml.safe_load_all(journey.installed.manifest) if d]
    templates = {d["kind"]: d["spec"]["template"] for d in docs
                 if d["kind"] in ("Deployment", "DaemonSet")}  # fmt: skip
    label = "pod-security.kubernetes.io/enforce"

    def admitted(kind: str) -> tuple[bool, str]:
        template = templates[kind]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": template["spec"],
            "metadata": {"generateName": "psa-", "labels": template["metadata"]["labels"]},
        }
        status, reply = kube.try_call("POST", f"/api/v1/namespaces/{RELEASE_NS}/pods"
                                      "?dryRun=All", pod)  # fmt: skip
        return status == 201, str(reply.get("message", "")) if isinstance(reply, dict) else ""

    try:
        found = {}
        for level in ("restricted", "baseline", "privileged"):
            kube.patch("v1/namespaces", None, RELEASE_NS, {"metadata": {"labels": {label: level}}})
            found[level] = {kind: admitted(kind) for kind in templates}
    finally:
        kube.patch("v1/namespaces", None, RELEASE_NS, {"metadata": {"labels": {label: None}}})
    assert found["restricted"]["Deployment"][0], found["restricted"]["Deployment"]
    for level in ("restricted", "baseline"):
        ok, message = found[level]["DaemonSet"]
        assert not ok and "hostPID" in message and "hostPath" in message, (level, message)
    assert found["privileged"]["DaemonSet"][0], found["privileged"]["DaemonSet"]


def test_helm_upgrade_rolls_the_operator_and_it_goes_on_from_its_checkpoints(
    journey: Journey,
) -> None:
    kube, ns = journey.kube, journey.kube.namespace
    (operator,) = journey.pods("operator")

    def checkpoints() -> dict[str, str]:
        return {c["metadata"]["name"]: c["metadata"]["resourceVersion"]
                for c in kube.list("v1/configmaps", ns, selector=CHECKPOINT_LABEL)}  # fmt: skip

    before = checkpoints()
    assert before, "the operator pod wrote no checkpoint of its evidence"
    reconciled = journey.status()["lastGoodRun"]
    values = merged(journey.installed.values, {"operator": {"logFormat": "text"}})
    journey.installed = upgrade(kube.plane, journey.installed, values)
    (rolled,) = kube.until("one operator pod after the rollout", lambda: journey.pods("operator"),
                           lambda pods: len(pods) == 1 and ready(pods[0]))  # fmt: skip
    assert rolled["metadata"]["name"] != operator["metadata"]["name"]
    # the new pod reconciles the policy again with the checkpoints the old one left (the
    # same objects: neither the rollout nor the new pod lost or remade them), and the
    # verdict of the change stays
    kube.patch(POLICIES, ns, "batch", {"spec": {"headroom": 0.15}})  # reconcile now
    kube.until("a run of the new operator pod", journey.status,
               lambda s: s.get("lastGoodRun", "") > reconciled, timeout_s=120)  # fmt: skip
    after = checkpoints()
    assert after == before, (before, after)
    record = record_of(kube.get(DEPLOYMENTS, ns, APP) or {})
    assert record is not None and record.verdict == "Applied", record


def test_helm_uninstall_leaves_no_object_and_the_cgroups_as_the_kubelet_left_them(
    journey: Journey,
) -> None:
    kube = journey.kube
    (pod,) = journey.app_pods()
    cgroup = _container_cgroup(journey.node, journey.layout, pod)
    record = record_of(kube.get(DEPLOYMENTS, kube.namespace, APP) or {})
    assert record is not None
    asked = record.containers[0].after.burst_us
    (agent,) = journey.pods("agent")
    written = cgroup.read_bandwidth().burst_us
    said = pod_log(kube, RELEASE_NS, agent["metadata"]["name"])
    uninstall(kube.plane, journey.installed)  # before any assertion: the next test installs
    assert written == asked, said[-3000:]  # the agent pod wrote what was applied
    left = kube.plane.kubectl("get", LISTED, "-A", "-o", "name", "-l",
                              f"{INSTANCE}={journey.installed.release}")  # fmt: skip
    assert left.split() == [], left
    assert kube.list("v1/pods", RELEASE_NS, selector=f"{COMPONENT}=agent") == []
    assert cgroup.read_bandwidth().burst_us == 0  # the stopping agent set its burst back


def test_with_burst_writing_off_the_agent_pod_cannot_write_a_cgroup_file(
    journey: Journey,
) -> None:
    kube = journey.kube
    values = node_values(journey.node, journey.image, prometheus_url(journey.prom.port))
    done = install(kube.plane, values, namespace=RELEASE_NS)  # the chart's defaults: off
    try:
        (agent,) = [p for p in journey.pods("agent") if ready(p)]
        target = _container_cgroup(journey.node, journey.layout, journey.app_pods()[0]).cpu_dir
        script = (
            f"import sys\ntry:\n open('{target}/cpu.cfs_burst_us', 'w').write('1000')\n"
            "except OSError as e:\n print(e.strerror)\n sys.exit(0)\nprint('written')"
        )
        out = kube.plane.kubectl("exec", "-n", RELEASE_NS, agent["metadata"]["name"], "--",
                                 "python", "-c", script)  # fmt: skip
        assert out.strip() == "Read-only file system", out
    finally:
        uninstall(kube.plane, done)


def _millicores(text: str) -> int:
    from unthrottle.units import parse_cpu

    return parse_cpu(text)
