"""Apply's InPlace method on the real node: the kubelet, containerd and runc actuate each
resize in the pods' real cgroups, the real node agent writes the burst that pod annotations
ask for, and the kernel refuses what it refuses. The evidence the operator decides from is
a day of history written into a real Prometheus (the canary's verdict on it is made to go
one way or the other); the reconciler runs in-process on the test's clock.

These are the cases the stand-in kubelet could not show: the rollback of a change that
raised the burst (the kernel refuses the old quota under the raised burst), a canary whose
readiness the resize broke, a resize that fails for ever, the restarts a
``RestartContainer`` resize policy makes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deployment, openmetrics
from test_apply import NOW, T0, World, running
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle_lab.children import stop
from unthrottle_lab.kube import REAL_NODE_TAINT, ControlPlane, RealNode
from unthrottle_lab.prometheus import free_port

pytestmark = [requires_prometheus, pytest.mark.kernel]
PODS = "v1/pods"
VERIFY_S = 15 * 60
APP = Workload("stage", "api", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "ip"})
"""Throttled 10 % of periods under 500m: the recommendation raises the limit to 830m and
gives it a 68 ms burst (the agent's backlog series bound the burst at the levels it is kept
at: 690m and 54 ms when the windows were taken to stand apart without them)."""
LIMIT_M, QUOTA_US, BURST_US = 830, 83_000, 68_000
"""APP's recommendation: the limit, its quota at the 100 ms period, the burst."""
HURT = {"share": 0.4, "limit": 0.66}
CALM = Workload("stage", "api", 0.3, 0.0, 0.0, 1.0, 1, {"app.kubernetes.io/part-of": "ip"})
"""A steady 0.3 core under 1 CPU: never throttled, the recommendation lowers the limit."""
IDLE = """name: idle
workload: {kind: serial, task_cpu_ms: 2, workers: 1, tasks: 20, think_ms: 98}
runs: [{}]
"""
"""What the pods run: 2 % of a core, so that the node stays quiet."""
UNIQUE = iter(range(1_000_000))


def _on_node(obj: dict[str, Any], node: RealNode, **container: Any) -> dict[str, Any]:
    """A shop Deployment as a real pod of the workload image on the real node."""
    out = copy.deepcopy(obj)
    spec = out["spec"]["template"]["spec"]
    spec.update(nodeSelector={"kubernetes.io/hostname": node.name},
                tolerations=[{**REAL_NODE_TAINT, "operator": "Equal"}],
                terminationGracePeriodSeconds=1, automountServiceAccountToken=False,
                volumes=[{"name": "scenario", "configMap": {"name": "idle"}}])  # fmt: skip
    (c,) = spec["containers"]
    c.update(image=node.images["workload"].name, imagePullPolicy="Never",
             args=["workload", "/scenario/scenario.yaml"],
             volumeMounts=[{"name": "scenario", "mountPath": "/scenario"}],
             **container)  # fmt: skip
    return out


def _record(deployment: dict[str, Any]) -> Record:
    return Record.from_annotation(deployment["metadata"]["annotations"][RECORD_ANNOTATION])


def _state(status: dict[str, Any], name: str) -> tuple[str, str]:
    w = next(w for w in status["workloads"] if w["deployment"] == name)
    return w["state"], w["message"] or ""


def pod_cgroup(layout: Layout, node: RealNode, pod: dict[str, Any]) -> Cgroup:
    """The cgroup the kubelet made for the pod's (first) container."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    qos = pod["status"]["qosClass"].lower()
    tier = "" if qos == "guaranteed" else f"/{qos}"
    return Cgroup(layout, f"{node.cgroup_parent}/kubepods{tier}/"
                          f"pod{pod['metadata']['uid']}/{cid}")  # fmt: skip


class RealWorld:
    """A :class:`test_apply.World` over one Deployment whose pods run on the real node."""

    def __init__(self, world: World, node: RealNode, layout: Layout) -> None:
        self.world, self.node, self.layout = world, node, layout
        self.kube: Kube = world.kube
        self.stage = world.stage

    def pods(self) -> dict[str, dict[str, Any]]:
        rs = self.kube.replicaset_of(self.world.deployment(APP.name))
        return {p["metadata"]["name"]: p for p in self.kube.pods_of(rs)}

    def pod(self, name: str) -> dict[str, Any]:
        found = self.kube.get(PODS, self.stage, name)
        assert found is not None, f"pod {name} is gone"
        return found

    def cgroup(self, name: str) -> Cgroup:
        return pod_cgroup(self.layout, self.node, self.pod(name))

    def kernel(self, name: str) -> tuple[int | None, int]:
        """(quota, burst) in the container's cgroup, µs."""
        bandwidth = self.cgroup(name).read_bandwidth()
        return bandwidth.quota_us, bandwidth.burst_us

    def until_kernel(self, name: str, quota: int | None = None, burst: int | None = None) -> None:
        self.kube.until(f"pod {name}'s cgroup at quota {quota}, burst {burst}",
                        lambda: self.kernel(name),
                        lambda k: (quota is None or k[0] == quota)
                        and (burst is None or k[1] == burst), timeout_s=60)  # fmt: skip

    def history(self, pod: str, since: float, app: Workload = APP, **changes: Any) -> None:
        w = replace(app, namespace=self.stage, names=(pod,), **changes)
        self.world.add_history(openmetrics([w], NOW, span=NOW - int(since)))

    def reconcile(self) -> tuple[str, str]:
        return _state(self.world.reconcile("ip"), APP.name)

    def resizes(self) -> list[str]:
        """The pods the operator sent a resize, one entry per resize (the recording proxy)."""
        return [r.path.split("/")[-2] for r in self.world.proxy.requests("PATCH", "/resize$")]

    def reconcile_until(self, what: str, done: Any, *, timeout_s: float = 60) -> tuple[str, str]:
        """Reconcile every second until ``done(state, message)`` (the kubelet's part takes
        seconds); the last state and message."""
        return self.kube.until(what, self.reconcile, lambda sm: done(*sm), timeout_s=timeout_s)


@contextlib.contextmanager
def agent(node: RealNode, plane: ControlPlane, folder: Path) -> Iterator[None]:
    """The real node agent as a process: it names the node's pods and writes the burst
    their annotations ask for into their cgroups (never refused for node load here)."""
    log = (folder / "agent.log").open("wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("unthrottle")), "agent",
         "--node-name", node.name, "--kubeconfig", str(plane.kubeconfig),
         "--kubepods-parent", node.cgroup_parent, "--listen", f"127.0.0.1:{free_port()}",
         "--burst", "--burst-namespace", "*", "--burst-node-threshold", "1",
         "--discover-every", "1s"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield
    finally:
        stop(proc, timeout_s=10)
        log.close()


@contextlib.contextmanager
def real_world(folder: Path, plane: ControlPlane, node: RealNode, layout: Layout,
               app: Workload = APP, **container: Any) -> Iterator[RealWorld]:  # fmt: skip
    kube = Kube(plane)
    stage = f"stage-{next(UNIQUE)}-{int(time.time()) % 100000}"
    kube.create_namespace(stage)
    kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "idle", "namespace": stage},
                                  "data": {"scenario.yaml": IDLE}})  # fmt: skip
    w = replace(app, namespace=stage)
    kube.create("apps/v1/deployments", _on_node(deployment(w), node, **container))
    rs = kube.replicaset_of(kube.rolled_out(stage, w.name, timeout_s=120))
    placed = [replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"])]
    with running(folder, kube, placed, stage, PrometheusServer) as world, \
            agent(node, plane, folder):  # fmt: skip
        yield RealWorld(world, node, layout)


@pytest.fixture
def rw(tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
       throttlepolicy_crd: None) -> Iterator[RealWorld]:  # fmt: skip
    with real_world(tmp_path, control_plane, real_node, layout) as world:
        yield world


def test_the_real_kubelet_resizes_the_canary_then_the_rest_in_their_cgroups_no_restart(
    rw: RealWorld,
) -> None:
    before = {n: p["status"]["containerStatuses"][0]["containerID"] for n, p in rw.pods().items()}
    assert all(rw.kernel(n) == (50_000, 0) for n in before)
    rw.world.policy("ip", "ip", apply={"method": "InPlace", "maxConcurrent": 1})
    state, message = rw.reconcile()
    assert state == "Verifying" and "canary: pod" in message, message
    record = _record(rw.world.deployment(APP.name))
    canary = record.canary or ""
    rw.until_kernel(canary, quota=QUOTA_US)  # the kubelet wrote the new quota
    assert all(rw.kernel(n)[0] == 50_000 for n in before if n != canary)  # nobody else yet
    state, message = rw.reconcile_until("the canary reported resized",
                                        lambda s, m: "verifying its throttling" in m)  # fmt: skip
    rw.until_kernel(canary, burst=BURST_US)  # the agent wrote the final burst
    rw.world.clock.now = T0 + 60
    rw.history(canary, T0 + 60, limit=0.69)
    rw.world.clock.now = T0 + 60 + VERIFY_S + 60
    state, message = rw.reconcile_until("every pod resized", lambda s, m: s == "Applied")
    assert "none restarted" in message, message
    for name, cid in before.items():
        rw.until_kernel(name, quota=QUOTA_US, burst=BURST_US)
        status = rw.pod(name)["status"]["containerStatuses"][0]
        assert status["containerID"] == cid and status["restartCount"] == 0


def test_the_rollback_of_a_raised_burst_lowers_it_before_the_quota_falls(
    rw: RealWorld,
) -> None:
    """The change raised the burst (0 → 68 ms) with the limit; the canary got worse. Its
    rollback must lower the burst first: the kernel refuses the old 50 ms quota under a
    68 ms burst, and the kubelet would report Error and retry it for ever."""
    rw.world.policy("ip", "ip", apply={"method": "InPlace"})
    rw.reconcile()
    canary = _record(rw.world.deployment(APP.name)).canary or ""
    rw.reconcile_until("the canary resized", lambda s, m: "verifying its throttling" in m)
    rw.until_kernel(canary, quota=QUOTA_US, burst=BURST_US)
    rw.world.clock.now = T0 + 60
    rw.history(canary, T0 + 60, **HURT)
    rw.world.clock.now = T0 + 60 + VERIFY_S + 60
    errors: list[str] = []

    def back(state: str, message: str) -> bool:
        conditions = rw.pod(canary)["status"].get("conditions") or []
        errors.extend(c.get("message", "") for c in conditions
                      if c["type"] == "PodResizeInProgress"
                      and c.get("reason") == "Error")  # fmt: skip
        return state == "RolledBack"

    state, message = rw.reconcile_until("rolled back", back, timeout_s=90)
    assert "got worse" in message, message
    assert not errors, f"the kubelet failed a write: {errors[:1]}"
    assert rw.kernel(canary) == (50_000, 0)
    assert all(rw.kernel(n) == (50_000, 0) for n in rw.pods())
    # An HPA's scale raises the Deployment's generation: the rejected change is not tried
    # again for that (only a change of the template or the policy lifts the hold).
    rw.kube.patch("apps/v1/deployments", rw.stage, APP.name, {"spec": {"replicas": 3}})
    rw.kube.rolled_out(rw.stage, APP.name, timeout_s=120)
    state, message = rw.reconcile()
    assert state == "RolledBack" and "not tried again" in message, message


def test_a_canary_made_unready_by_its_resize_is_rolled_back_not_replaced(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """Its readiness probe passes while its quota is at most 50 ms (its cgroup, as the
    container sees it): the resize to 830m makes it unready, as throttling or a slow
    start would. The next pod must not be resized in its place."""
    python = str(Path(sys.executable))
    probe = {"exec": {"command": [python, "-c", "import sys; sys.exit(int(open("
                                  "'/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read()) > 50000)"]},
             "periodSeconds": 1, "failureThreshold": 1, "timeoutSeconds": 5}  # fmt: skip
    with real_world(tmp_path, control_plane, real_node, layout, readinessProbe=probe) as rw:
        names = sorted(rw.pods())
        rw.world.policy("ip", "ip", apply={"method": "InPlace"})
        rw.reconcile()
        canary = _record(rw.world.deployment(APP.name)).canary or ""
        rw.until_kernel(canary, quota=QUOTA_US)
        rw.kube.until("the canary unready", lambda: rw.pod(canary),
                      lambda p: any(c["type"] == "Ready" and c["status"] == "False"
                                    for c in p["status"]["conditions"]))  # fmt: skip
        _, message = rw.reconcile_until("rolled back", lambda s, m: s == "RolledBack",
                                        timeout_s=90)  # fmt: skip
        assert f"pod {canary} is not Ready since its resize" in message, message
        assert sorted(rw.pods()) == names  # the same pods: nobody replaced, nobody restarted
        assert all(rw.kernel(n)[0] == 50_000 for n in names)
        assert _record(rw.world.deployment(APP.name)).resized == (canary,)


def test_a_resize_the_kubelet_cannot_write_is_given_up_after_its_deadline(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """A burst somebody else wrote (a stale agent, another tool) under the old quota: the
    lower limit's quota falls under it, the runtime's write fails (EINVAL) and the kubelet
    retries it for ever. InPlace gives it up at its deadline instead of holding a slot."""
    with real_world(tmp_path, control_plane, real_node, layout, CALM) as rw:
        (pod,) = rw.pods()
        (rw.cgroup(pod).cpu_dir / "cpu.cfs_burst_us").write_text("90000\n")  # under 100 ms
        rw.world.policy("ip", "ip", apply={"method": "InPlace"})
        state, message = rw.reconcile_until(
            "the kubelet's Error", lambda s, m: "failed to resize" in m)  # fmt: skip
        assert state == "Verifying", message
        rw.world.clock.now += 301  # VerifySettings.resize_timeout_s, 300 s
        state, message = rw.reconcile_until(
            "given up and rolled back", lambda s, m: s == "RolledBack", timeout_s=90)  # fmt: skip
        assert "has not finished the resize in" in message, message
        assert rw.kernel(pod)[0] == 100_000  # the old quota stayed
        assert json.loads(json.dumps(rw.pod(pod)["spec"]["containers"][0]["resources"]))[
            "limits"]["cpu"] == "1"  # fmt: skip


def test_a_restart_container_policy_is_reported_as_restarts(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    policy = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    app = replace(APP, pods=1)
    with real_world(tmp_path, control_plane, real_node, layout, app, resizePolicy=policy) as rw:
        (pod,) = rw.pods()
        rw.world.policy("ip", "ip", apply={"method": "InPlace"})
        rw.reconcile()
        rw.reconcile_until("the canary resized", lambda s, m: "verifying its throttling" in m)
        assert rw.pod(pod)["status"]["containerStatuses"][0]["restartCount"] == 1
        rw.world.clock.now = T0 + 60
        rw.history(pod, T0 + 60, app, limit=0.69)
        rw.world.clock.now = T0 + 60 + VERIFY_S + 60
        _, message = rw.reconcile_until("applied", lambda s, m: s == "Applied")
        assert "restarted by the kubelet" in message and "none restarted" not in message


def test_a_burstable_pod_keeps_its_class_when_the_new_limit_meets_its_request(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """Memory request = limit, CPU request 900m: a limit lowered to the request would make
    the pod Guaranteed, which the API server refuses in place. The limit stops 1m above."""
    resources = {"requests": {"cpu": "900m", "memory": "128Mi"},
                 "limits": {"cpu": "1", "memory": "128Mi"}}  # fmt: skip
    with real_world(tmp_path, control_plane, real_node, layout, CALM, resources=resources) as rw:
        (pod,) = rw.pods()
        rw.world.policy("ip", "ip", apply={"method": "InPlace"})
        state, message = rw.reconcile_until(
            "the canary resized", lambda s, m: "verifying its throttling" in m)  # fmt: skip
        assert state == "Verifying", message
        found = rw.pod(pod)
        assert found["status"]["qosClass"] == "Burstable"
        assert found["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "901m"
        rw.until_kernel(pod, quota=90_100)


def test_a_deleted_policy_closes_its_records_and_new_pods_keep_the_template(
    rw: RealWorld,
) -> None:
    from unthrottle.operator.admission import KubeOwners, PodAdmission

    rw.world.policy("ip", "ip", apply={"method": "InPlace", "maxConcurrent": 2})
    rw.reconcile()
    canary = _record(rw.world.deployment(APP.name)).canary or ""
    rw.reconcile_until("the canary resized", lambda s, m: "verifying its throttling" in m)
    rw.world.clock.now = T0 + 60
    rw.history(canary, T0 + 60, limit=0.69)
    rw.world.clock.now = T0 + 60 + VERIFY_S + 60
    rw.reconcile_until("every pod resized", lambda s, m: s == "Applied")
    admission = PodAdmission(KubeOwners(rw.world.api))
    some_pod = rw.pod(canary)
    assert admission.patch(some_pod) is not None  # a new pod of this ReplicaSet gets 830m
    body = rw.kube.get("unthrottle.io/v1alpha1/throttlepolicies", rw.stage, "ip")
    assert body is not None
    rw.world.reconciler.forget(body)  # what the operator's delete handler does
    record = _record(rw.world.deployment(APP.name))
    assert record.verdict == "PolicyDeleted", record
    assert "keep theirs until the next rollout" in (record.verdict_reason or "")
    assert admission.patch(some_pod) is None  # new pods keep the template's 500m


def test_a_kubelet_with_the_static_cpu_manager_finds_the_resize_infeasible(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """A kubelet whose CPU manager is static refuses any CPU resize of a Guaranteed pod
    (PodResizePending, Infeasible): InPlace gives it up and says the kubelet's words. The
    node's kubelet is restarted with that policy for this test, and back after it.

    The pod goes unready after the kubelet's answer (a restarted kubelet reports its pods
    unready until their probes run again; here its probe fails once a burst is written):
    a resize never actuated did not do that, so the reason stays the kubelet's. Once on CI
    it read "not Ready since its resize".

    The restart waits until the node holds this test's pod alone: beside a hog, the pods of
    the tests before, still terminating, had the restarted kubelet reject it (OutOfcpu)."""
    resources = {"requests": {"cpu": "500m", "memory": "128Mi"},
                 "limits": {"cpu": "500m", "memory": "128Mi"}}  # fmt: skip
    python = str(Path(sys.executable))
    probe = {"exec": {"command": [python, "-c", "import sys; sys.exit(int(open("
                                  "'/sys/fs/cgroup/cpu/cpu.cfs_burst_us').read()) > 0)"]},
             "periodSeconds": 1, "failureThreshold": 1, "timeoutSeconds": 5}  # fmt: skip
    app = replace(APP, pods=1)
    with real_world(tmp_path, control_plane, real_node, layout, app, resources=resources,
                    readinessProbe=probe) as rw:  # fmt: skip
        (pod,) = rw.pods()

        def ready(want: str) -> None:
            rw.kube.until(f"the pod Ready={want}", lambda: rw.pod(pod),
                          lambda p: any(c["type"] == "Ready" and c["status"] == want
                                        for c in p["status"].get("conditions") or []))  # fmt: skip

        # a restarted kubelet admits its pods again against its allocatable (1.5 CPUs with
        # the static policy's reserved CPU): the tests before's pods, still going with their
        # namespaces, once had it reject this one (OutOfcpu: used 1400 of 1500) beside a hog
        _only_ours_on(rw, real_node)
        real_node.restart_kubelet(static_cpu_manager=True)
        try:
            ready("True")
            rw.world.policy("ip", "ip", apply={"method": "InPlace"})
            state, message = rw.reconcile_until("the resize sent", lambda s, m: "sent" in m)
            assert state == "Verifying", message
            rw.kube.until("the kubelet's Infeasible", lambda: rw.pod(pod),
                          lambda p: any(c["type"] == "PodResizePending"
                                        and c.get("reason") == "Infeasible"
                                        for c in p["status"].get("conditions") or []))  # fmt: skip
            (rw.cgroup(pod).cpu_dir / "cpu.cfs_burst_us").write_text("1000\n")
            ready("False")
            _, message = rw.reconcile_until("rolled back", lambda s, m: s == "RolledBack",
                                            timeout_s=90)  # fmt: skip
            assert "Infeasible" in message and "CPU Manager" in message, message
            assert rw.kernel(pod)[0] == 50_000
        finally:
            real_node.restart_kubelet()


# -- the node's room ------------------------------------------------------------------------


def _requested(pod: dict[str, Any]) -> int:
    """Millicores of CPU the pod requests, as the kubelet counts them (its containers')."""
    from unthrottle.units import parse_cpu

    return sum(parse_cpu(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
               for c in pod["spec"]["containers"])  # fmt: skip


def _only_ours_on(rw: RealWorld, node: RealNode) -> list[dict[str, Any]]:
    """The pods bound to the node, once every one of them is this test's (those of the
    tests before go with their namespaces, seconds after those tests end)."""

    def on_node() -> list[dict[str, Any]]:
        return [p for p in rw.kube.call("GET", "/api/v1/pods", query={
                    "fieldSelector": f"spec.nodeName={node.name}"})["items"]
                if p["status"].get("phase") not in ("Succeeded", "Failed")]  # fmt: skip

    return rw.kube.until("only this test's pods on the node", on_node,
                         lambda ps: all(p["metadata"]["namespace"] == rw.stage for p in ps),
                         timeout_s=120)  # fmt: skip


def _fill_the_node(rw: RealWorld, node: RealNode, *, leave_m: int) -> None:
    """A pause pod of somebody else's that takes all the node's CPU room but ``leave_m``.

    Deterministic: it waits until every pod bound to the node is this test's (the pods of
    the tests before are deleted with their namespaces, a few seconds later: sized while
    one of them still counted, the filler would leave its room free once it went, and the
    kubelet would take the resize), then sizes the filler from the node's allocatable
    minus what this test's pods request. A filler the kubelet still refuses (OutOfcpu: a
    pod it had not yet forgotten) is made again."""
    from unthrottle.units import format_cpu, parse_cpu

    found = rw.kube.get("v1/nodes", None, node.name)
    assert found is not None
    ours = _only_ours_on(rw, node)
    free = parse_cpu(found["status"]["allocatable"]["cpu"]) - sum(map(_requested, ours))
    assert free > leave_m, f"the node has {free}m free"
    for attempt in range(3):
        name = f"filler-{attempt}"
        rw.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": rw.stage},
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 0,
                     "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
                     "containers": [{"name": "c", "image": node.images["pause"].name,
                                     "imagePullPolicy": "Never", "resources": {"requests": {
                                         "cpu": format_cpu(free - leave_m)}}}]}})  # fmt: skip
        pod = rw.kube.until(
            f"{name} admitted by the kubelet",
            lambda n=name: rw.pod(n),
            lambda p: p["status"].get("phase") in ("Running", "Failed"),
        )
        if pod["status"]["phase"] == "Running":
            return
        rw.kube.delete(PODS, rw.stage, name)
        time.sleep(2)
    raise AssertionError(f"the kubelet refused the filler: {pod['status']}")


GUARANTEED = {"requests": {"cpu": "500m", "memory": "128Mi"},
              "limits": {"cpu": "500m", "memory": "128Mi"}}  # fmt: skip


@pytest.mark.parametrize("method", ["InPlace", "InPlaceOrRollout"])
def test_a_resize_the_node_has_no_room_for_is_deferred_then_given_up_or_rolled_out(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None, method: str,
) -> None:  # fmt: skip
    """A Guaranteed pod's request moves with its limit (500m → 830m, 330m more); a filler
    leaves the node 100m. The real kubelet answers PodResizePending, Deferred. InPlace
    resizes the pod back (so that its kubelet stops waiting) and says the kubelet's words;
    once there is room and the policy changes, the resize goes through and the pod stays
    Guaranteed. InPlaceOrRollout makes the change a rollout instead."""
    app = replace(APP, pods=1)
    with real_world(tmp_path, control_plane, real_node, layout, app, resources=GUARANTEED) as rw:
        (pod,) = rw.pods()
        assert rw.pod(pod)["status"]["qosClass"] == "Guaranteed"
        _fill_the_node(rw, real_node, leave_m=100)
        rw.world.policy("ip", "ip", apply={"method": method})
        if method == "InPlaceOrRollout":
            state, message = rw.reconcile_until("a rollout instead",
                                                lambda s, m: "(a rollout: " in m)  # fmt: skip
            assert state == "Verifying" and "Deferred" in message, message
            deployment = rw.world.deployment(APP.name)
            record = _record(deployment)
            assert record.method == "Rollout"
            (c,) = deployment["spec"]["template"]["spec"]["containers"]
            assert c["resources"]["limits"]["cpu"] == f"{LIMIT_M}m", c["resources"]
            return
        _, message = rw.reconcile_until("rolled back", lambda s, m: s == "RolledBack",
                                        timeout_s=90)  # fmt: skip
        assert "Deferred" in message and "in-place resize given up" in message, message
        assert rw.kernel(pod)[0] == 50_000  # the quota never moved
        back = rw.pod(pod)
        assert back["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"
        assert not [c for c in back["status"].get("conditions") or []
                    if c["type"].startswith("PodResize")]  # fmt: skip
        # room again, and a new policy generation lifts the hold: the resize goes through
        for filler in [p["metadata"]["name"] for p in rw.kube.list(PODS, rw.stage)
                       if p["metadata"]["name"].startswith("filler")]:  # fmt: skip
            rw.kube.delete(PODS, rw.stage, filler)
        rw.kube.patch("unthrottle.io/v1alpha1/throttlepolicies", rw.stage, "ip",
                      {"spec": {"apply": {"cooldown": "31m"}}})  # fmt: skip
        rw.reconcile_until("the canary resized", lambda s, m: "verifying its throttling" in m)
        resized = rw.pod(pod)
        (spec,) = resized["spec"]["containers"]
        (status,) = resized["status"]["containerStatuses"]
        resources = spec["resources"]
        assert resources["requests"]["cpu"] == f"{LIMIT_M}m" == resources["limits"]["cpu"]
        assert status["resources"]["requests"]["cpu"] == f"{LIMIT_M}m"
        assert resized["status"]["qosClass"] == "Guaranteed" and status["restartCount"] == 0
        rw.until_kernel(pod, quota=QUOTA_US)


def test_a_pod_created_while_the_webhook_was_down_is_resized_after_the_verdict(
    rw: RealWorld,
) -> None:
    """The change passed its canary and every pod was resized: Applied. A pod the
    ReplicaSet then creates without the webhook (the operator down: here none serves it)
    runs at the template's 500m; the next reconcile resizes it in place and says so, and
    the status says Applied without a word of it once it is done."""
    rw.world.policy("ip", "ip", apply={"method": "InPlace", "maxConcurrent": 2})
    rw.reconcile()
    canary = _record(rw.world.deployment(APP.name)).canary or ""
    rw.reconcile_until("the canary resized", lambda s, m: "verifying its throttling" in m)
    rw.world.clock.now = T0 + 60
    rw.history(canary, T0 + 60, limit=0.69)
    rw.world.clock.now = T0 + 60 + VERIFY_S + 60
    rw.reconcile_until("every pod resized", lambda s, m: s == "Applied")
    before = set(rw.pods())
    rw.kube.patch("apps/v1/deployments", rw.stage, APP.name, {"spec": {"replicas": 3}})
    rw.kube.rolled_out(rw.stage, APP.name, timeout_s=120)
    (new,) = set(rw.pods()) - before
    assert rw.kernel(new)[0] == 50_000  # the template's limit: no webhook gave it 830m
    state, message = rw.reconcile()
    assert state == "Applied" and "created without the applied settings" in message, message
    assert f"pod {new}" in message, message
    state, message = rw.reconcile_until(
        "the status without the stray", lambda s, m: "created without" not in m)  # fmt: skip
    assert state == "Applied", message
    rw.until_kernel(new, quota=QUOTA_US, burst=BURST_US)  # the kubelet's quota, the agent's burst
    assert rw.resizes().count(new) == 1
    assert rw.pod(new)["status"]["containerStatuses"][0]["restartCount"] == 0
    assert _record(rw.world.deployment(APP.name)).verdict == "Applied"
    assert any(e["reason"] == "StrayResized" for e in rw.world.events(APP.name))


def _burst_gauge(rw: RealWorld, pod: str, seconds: float, start: int, end: int) -> None:
    """The node agent's reading of the pod's burst from ``start`` to ``end`` (wall clock),
    into Prometheus as a scrape of it would have put it (the agent runs; this Prometheus
    serves written history and scrapes nothing)."""
    labels = f'namespace="{rw.stage}",pod="{pod}",container="app"'
    rw.world.add_history("".join(f"unthrottle_cpu_cfs_burst_seconds{{{labels}}} {seconds} {t}\n"
                                 for t in range(start, end + 1, 5)))  # fmt: skip


def test_a_limit_lowered_under_the_burst_waits_for_the_lower_burst_in_the_cgroup(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """The pod runs under 1 CPU with a 90 ms burst (written by the real agent from the
    template's annotation); the change lowers the limit's quota under 90 ms. The interim
    burst goes on the pod first, the resize waits until the agent reports it, and the
    kubelet's quota write then succeeds (no Error): the kernel never saw quota < burst."""
    app = replace(CALM, annotations={})
    with real_world(tmp_path, control_plane, real_node, layout, app) as rw:
        rw.kube.patch("apps/v1/deployments", rw.stage, APP.name, {"spec": {"template": {
            "metadata": {"annotations": {"unthrottle.io/cpu-burst": "app=90ms"}}}}})  # fmt: skip
        rw.kube.rolled_out(rw.stage, APP.name, timeout_s=120)
        (pod,) = rw.pods()
        rw.until_kernel(pod, quota=100_000, burst=90_000)  # the agent wrote it
        now = int(time.time())
        _burst_gauge(rw, pod, 0.09, now - 300, now)
        rw.world.policy("ip", "ip", apply={"method": "InPlace"})
        _, message = rw.reconcile()
        (change,) = _record(rw.world.deployment(APP.name)).containers
        new_quota = (change.after.cpu_limit or 0) * 100
        assert new_quota < 90_000 <= change.before.burst_us, change
        assert "burst lowered first" in message, message
        rw.until_kernel(pod, burst=change.after.burst_us)  # the agent wrote the interim burst
        _, message = rw.reconcile()
        assert "waiting for the node agent" in message, message  # Prometheus still says 90 ms
        assert rw.kernel(pod)[0] == 100_000 and rw.resizes() == []
        later = int(time.time()) + 1
        time.sleep(1.1)
        _burst_gauge(rw, pod, change.after.burst_us / 1e6, later, later)
        errors: list[str] = []

        def done(state: str, message: str) -> bool:
            conditions = rw.pod(pod)["status"].get("conditions") or []
            errors.extend(c.get("message", "") for c in conditions
                          if c["type"] == "PodResizeInProgress"
                          and c.get("reason") == "Error")  # fmt: skip
            return "verifying its throttling" in message

        rw.reconcile_until("the canary resized", done)
        assert not errors, f"the kubelet failed a write: {errors[:1]}"
        rw.until_kernel(pod, quota=new_quota, burst=change.after.burst_us)


def test_a_resize_past_the_nodes_allocatable_is_refused_by_the_server_and_given_up(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """The node's kubelet restarted with 1400m reserved: 600m allocatable. A Guaranteed pod
    of 500m asked to 830m is past it, and the API server refuses the resize (403) before
    the kubelet sees it; InPlace gives up with the server's words, the quota never moved.
    The kubelet is restarted without the reservation after."""
    app = replace(APP, pods=1)
    with real_world(tmp_path, control_plane, real_node, layout, app, resources=GUARANTEED) as rw:
        (pod,) = rw.pods()
        _only_ours_on(rw, real_node)  # a restarted kubelet admits its pods again, in 600m
        real_node.restart_kubelet(reserved_cpu="1400m")
        try:
            rw.kube.until("600m allocatable", lambda: rw.kube.get("v1/nodes", None, real_node.name),
                          lambda n: n["status"]["allocatable"]["cpu"] == "600m")  # fmt: skip
            rw.kube.until("the pod Ready again", lambda: rw.pod(pod),
                          lambda p: any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in p["status"].get("conditions") or []))  # fmt: skip
            rw.world.policy("ip", "ip", apply={"method": "InPlace"})
            _, message = rw.reconcile_until("rolled back", lambda s, m: s == "RolledBack")
            assert "allocatable" in message and "in-place resize given up" in message, message
            assert rw.kernel(pod)[0] == 50_000
            assert rw.pod(pod)["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"
        finally:
            real_node.restart_kubelet()
