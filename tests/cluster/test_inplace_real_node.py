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

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from prom import requires_prometheus
from support.apply import (
    T0,
)
from support.inplace_real_node import (
    APP,
    BURST_US,
    CALM,
    GUARANTEED,
    HURT,
    LIMIT_M,
    PODS,
    QUOTA_US,
    VERIFY_S,
    RealWorld,
    _burst_gauge,
    _fill_the_node,
    _only_ours_on,
    _record,
    real_world,
)
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.model.podlevel import POD_ROW
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane, RealNode

pytestmark = [requires_prometheus, pytest.mark.kernel]


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
    # This Prometheus scrapes nothing: the agent's gauge goes in as its scrape would put it,
    # 68 ms until the kernel shows the lower burst (without it, "no series" reads as "no
    # agent" and the resize races the agent's write).
    now = int(time.time())
    _burst_gauge(rw, canary, BURST_US / 1e6, now - 300, now)
    rw.world.clock.now = T0 + 60
    rw.history(canary, T0 + 60, **HURT)
    rw.world.clock.now = T0 + 60 + VERIFY_S + 60
    errors: list[str] = []
    messages: list[str] = []
    scraped_zero = False

    def back(state: str, message: str) -> bool:
        nonlocal scraped_zero
        messages.append(message)
        conditions = rw.pod(canary)["status"].get("conditions") or []
        errors.extend(c.get("message", "") for c in conditions
                      if c["type"] == "PodResizeInProgress"
                      and c.get("reason") == "Error")  # fmt: skip
        if not scraped_zero and rw.kernel(canary) == (QUOTA_US, 0):  # the agent wrote it
            later = int(time.time()) + 1
            time.sleep(1.1)
            _burst_gauge(rw, canary, 0.0, later, later)
            scraped_zero = True
        return state == "RolledBack"

    state, message = rw.reconcile_until("rolled back", back, timeout_s=90)
    assert "got worse" in message, message
    assert any("waiting for the node agent" in m for m in messages), messages
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


POD_LEVEL = replace(APP, pod_level=True)
"""APP with its 500m as the pod's own limit (``spec.resources``), its container unlimited."""


def _pod_quota(rw: RealWorld, name: str) -> int | None:
    """The quota in the pod's own cgroup, µs (the container's cgroup is below it)."""
    container = rw.cgroup(name)
    return Cgroup(rw.layout, container.path.rsplit("/", 1)[0]).read_bandwidth().quota_us


def test_a_pod_level_limit_is_resized_in_place_in_the_pod_cgroup_and_its_container(
    tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
    throttlepolicy_crd: None,
) -> None:  # fmt: skip
    """A pod whose 500m limit is its own (``spec.resources``; its container has none), the
    pod cgroup throttled: InPlace resizes the pod's row through the ``resize`` subresource
    (``InPlacePodLevelResourcesVerticalScaling``, beta and on in v1.36), the canary first.
    The kubelet writes the new quota into the pod cgroup and into its container's (which
    has its pod's), reports it in ``status.resources``, and restarts nothing. A pod the
    ReplicaSet makes later, without the webhook, starts at the template's 500m and is
    resized as the others were."""
    with real_world(tmp_path, control_plane, real_node, layout, POD_LEVEL) as rw:
        before = {n: p["status"]["containerStatuses"][0]["containerID"]
                  for n, p in rw.pods().items()}  # fmt: skip
        assert all(_pod_quota(rw, n) == rw.kernel(n)[0] == 50_000 for n in before)
        rw.world.policy("ip", "ip", apply={"method": "InPlace", "maxConcurrent": 1})
        state, message = rw.reconcile()
        assert state == "Verifying" and "canary: pod" in message, message
        record = _record(rw.world.deployment(APP.name))
        assert [c.name for c in record.containers] == [POD_ROW]
        (row,) = record.containers
        after = row.after.cpu_limit
        assert after is not None and after > 500
        quota = after * 100  # µs per 100 ms period
        canary = record.canary or ""
        rw.kube.until("the canary's pod cgroup at the new quota",
                      lambda: _pod_quota(rw, canary), lambda q: q == quota)  # fmt: skip
        rw.until_kernel(canary, quota=quota)  # its container, which has its pod's
        assert all(_pod_quota(rw, n) == 50_000 for n in before if n != canary)
        rw.reconcile_until("the canary reported resized",
                           lambda s, m: "verifying its throttling" in m)  # fmt: skip
        status = rw.pod(canary)["status"]
        assert parse_cpu(status["resources"]["limits"]["cpu"]) == after
        rw.world.clock.now = T0 + 60
        rw.history(canary, T0 + 60, POD_LEVEL, limit=after / 1000)
        rw.world.clock.now = T0 + 60 + VERIFY_S + 60
        state, message = rw.reconcile_until("every pod resized", lambda s, m: s == "Applied")
        assert "none restarted" in message, message
        for name, cid in before.items():
            rw.kube.until(f"pod {name}'s cgroup at the new quota",
                          lambda n=name: _pod_quota(rw, n), lambda q: q == quota)  # fmt: skip
            rw.until_kernel(name, quota=quota)
            pod = rw.pod(name)
            assert parse_cpu(pod["spec"]["resources"]["limits"]["cpu"]) == after
            assert not pod["spec"]["containers"][0].get("resources", {}).get("limits")
            (c,) = pod["status"]["containerStatuses"]
            assert c["containerID"] == cid and c["restartCount"] == 0, c
        scaled = set(rw.pods())
        rw.kube.patch("apps/v1/deployments", rw.stage, APP.name, {"spec": {"replicas": 3}})
        rw.kube.rolled_out(rw.stage, APP.name, timeout_s=120)
        (new,) = set(rw.pods()) - scaled
        assert _pod_quota(rw, new) == 50_000  # the template's: no webhook here
        rw.reconcile_until("the new pod resized", lambda s, m: "created without" not in m
                           and _pod_quota(rw, new) == quota)  # fmt: skip
        rw.until_kernel(new, quota=quota)
        print(f"pod-level limit 500m -> {after}m in place: {len(before) + 1} pods, the pod "
              f"cgroup and its container's at {quota} us, none restarted")  # fmt: skip
