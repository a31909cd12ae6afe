"""Apply's InPlace method on the real control plane: the running pods are resized through
their ``resize`` subresource, a canary first, verified on its own counters, then the rest;
no pod restarts, no new ReplicaSet, the template stays as it was.

The kubelet's part (admit the resize, write the cgroup, report it in the pod's status) is
played for kwok's fake nodes by :class:`~unthrottle.devtools.kube.kubelet.ResizingKubelet`;
everything else is real: kube-apiserver validates each resize (QoS class, the subresource),
the ReplicaSet controller keeps the pods, Prometheus serves each pod's history."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deploy, openmetrics
from test_apply import NOW, T0, World, running
from unthrottle.cfs.settings import parse_cpu
from unthrottle.devtools.kube import ControlPlane, fake_node
from unthrottle.devtools.kube.kubelet import ResizingKubelet
from unthrottle.kube.patching import RECORD_ANNOTATION, Record, burst_text

pytestmark = requires_prometheus
PODS = "v1/pods"
DEPLOYMENTS = "apps/v1/deployments"
APP = Workload("stage", "api", 0.1, 0.10, 1.2, 0.5, 3, {"app.kubernetes.io/part-of": "ip"})
"""Throttled 10 % of periods under 500m: the recommendation raises the limit."""
HELPED = {"limit": 1.3}
HURT = {"share": 0.4, "limit": 0.66}
VERIFY_S = 15 * 60


def _record(deployment: dict[str, Any]) -> Record:
    return Record.from_annotation(deployment["metadata"]["annotations"][RECORD_ANNOTATION])


def _state(status: dict[str, Any], deployment: str) -> tuple[str, str]:
    w = next(w for w in status["workloads"] if w["deployment"] == deployment)
    return w["state"], w["message"] or ""


def _cpu(pod: dict[str, Any], kind: str = "limits", where: str = "spec") -> int | None:
    if where == "spec":
        res = pod["spec"]["containers"][0].get("resources") or {}
    else:
        res = (pod["status"].get("containerStatuses") or [{}])[0].get("resources") or {}
    value = (res.get(kind) or {}).get("cpu")
    return None if value is None else parse_cpu(value)


def _identity(pod: dict[str, Any]) -> tuple[str, str, str, int]:
    (cs,) = pod["status"]["containerStatuses"]
    return pod["metadata"]["name"], pod["metadata"]["uid"], cs["containerID"], cs["restartCount"]


class InPlaceWorld:
    """A :class:`test_apply.World` over one Deployment, with the stand-in kubelet."""

    def __init__(self, world: World, kubelet: ResizingKubelet) -> None:
        self.world, self.kubelet = world, kubelet
        self.kube: Kube = world.kube
        self.stage = world.stage

    def pods(self) -> dict[str, dict[str, Any]]:
        rs = self.kube.replicaset_of(self.world.deployment(APP.name))
        return {p["metadata"]["name"]: p for p in self.kube.pods_of(rs)}

    def settled(self, name: str, limit: int) -> dict[str, Any]:
        """The pod once its kubelet reports ``limit`` in its status."""
        return self.kube.until(f"pod {name} reported at {limit}m",
                               lambda: self.kube.get(PODS, self.stage, name),
                               lambda p: _cpu(p, where="status") == limit)  # fmt: skip

    def history(self, pod: str, since: float, **changes: Any) -> None:
        """The pod's own counters from ``since`` on, each workload field changed by
        ``changes`` (its canary verdict reads them)."""
        w = replace(APP, namespace=self.stage, names=(pod,), **changes)
        self.world.add_history(openmetrics([w], NOW, span=NOW - int(since)))

    def reconcile(self) -> tuple[str, str]:
        return _state(self.world.reconcile("ip"), APP.name)

    def resizes(self) -> list[str]:
        return [r.path.split("/")[-2] for r in self.world.proxy.requests("PATCH", "/resize$")]


@contextlib.contextmanager
def inplace_world(folder: Path, plane: ControlPlane, app: Workload = APP, *,
                  cpu_manager_policy: str = "none") -> Iterator[InPlaceWorld]:  # fmt: skip
    kube = Kube(plane)
    placed = deploy(kube, [app])
    with (running(folder, kube, placed, placed[0].namespace, PrometheusServer) as world,
          ResizingKubelet(plane, cpu_manager_policy=cpu_manager_policy) as kubelet):  # fmt: skip
        yield InPlaceWorld(world, kubelet)


@pytest.fixture
def ip(tmp_path: Path, control_plane: ControlPlane,
       throttlepolicy_crd: None) -> Iterator[InPlaceWorld]:  # fmt: skip
    with inplace_world(tmp_path, control_plane) as world:
        yield world


def test_the_canary_is_resized_first_verified_alone_then_the_rest_without_a_restart(
    ip: InPlaceWorld,
) -> None:
    template = ip.world.deployment(APP.name)["spec"]["template"]
    replicaset = ip.kube.replicaset_of(ip.world.deployment(APP.name))["metadata"]["name"]
    before = {name: _identity(p) for name, p in ip.pods().items()}
    ip.world.policy("ip", "ip", apply={"method": "InPlace", "maxConcurrent": 1})
    state, message = ip.reconcile()
    assert state == "Verifying" and "canary: pod" in message, message
    (cond,) = [c for c in ip.world.status("ip")["conditions"] if c["type"] == "InPlaceResize"]
    assert (cond["status"], cond["reason"]) == ("True", "Available")
    record = _record(ip.world.deployment(APP.name))
    (change,) = record.containers
    limit = change.after.cpu_limit
    assert record.method == "InPlace" and record.replicaset == replicaset and limit
    assert limit > 500
    assert ip.resizes() == [record.canary]  # only the canary, through its resize subresource
    canary = ip.settled(record.canary or "", limit)
    assert not [c for c in canary["status"].get("conditions") or []
                if c["type"].startswith("PodResize")]  # fmt: skip
    others = [n for n in before if n != record.canary]
    assert all(_cpu(ip.pods()[n]) == 500 for n in others)  # untouched while it is verified

    ip.world.clock.now = T0 + 60
    assert "verifying its throttling until" in ip.reconcile()[1]
    assert _record(ip.world.deployment(APP.name)).canary_done_at == T0 + 60
    ip.history(record.canary or "", T0 + 60, **HELPED)
    ip.world.clock.now = T0 + 60 + VERIFY_S + 60
    state, message = ip.reconcile()
    assert state == "Verifying" and "canary passed; resizing the rest" in message, message
    assert len(ip.resizes()) == 2  # maxConcurrent 1: one more pod at a time
    for _ in range(6):
        for name in ip.pods():
            if _cpu(ip.pods()[name]) == limit:
                ip.settled(name, limit)
        state, message = ip.reconcile()
        if state != "Verifying":
            break
    assert state == "Applied" and "3 pods resized in place, none restarted" in message, message
    # the same pods, the same containers, never restarted; the same ReplicaSet and template
    after = ip.pods()
    assert {name: _identity(p) for name, p in after.items()} == before
    assert all(_cpu(p) == limit and _cpu(p, where="status") == limit for p in after.values())
    assert all(_cpu(p, "requests") == 250 for p in after.values())  # Burstable: request kept
    deployment = ip.world.deployment(APP.name)
    assert deployment["spec"]["template"] == template
    assert ip.kube.replicaset_of(deployment)["metadata"]["name"] == replicaset
    assert sorted(ip.resizes()) == sorted(before)
    reasons = [e["reason"] for e in ip.world.events(APP.name)]
    assert {"Applied", "CanaryResized", "CanaryPassed", "Verified"} <= set(reasons)
    assert _record(deployment).verdict == "Applied"


def test_a_canary_made_worse_is_resized_back_and_nobody_else_is_touched(
    ip: InPlaceWorld,
) -> None:
    ip.world.policy("ip", "ip", apply={"method": "InPlace"})
    ip.reconcile()
    record = _record(ip.world.deployment(APP.name))
    limit = record.containers[0].after.cpu_limit or 0
    ip.settled(record.canary or "", limit)
    ip.world.clock.now = T0 + 60
    ip.reconcile()
    ip.history(record.canary or "", T0 + 60, **HURT)
    ip.world.clock.now = T0 + 60 + VERIFY_S + 60
    state, message = ip.reconcile()
    assert state == "Verifying" and "rolling back in place" in message, message
    # The change raised the burst (0 → 54 ms): its rollback lowers it first, or the kernel
    # would refuse the old quota under it; the resize back follows on the next step.
    assert "burst lowered first" in message, message
    state, message = ip.reconcile()
    assert state == "Verifying" and "resize sent" in message, message
    ip.settled(record.canary or "", 500)
    state, message = ip.reconcile()
    assert state == "RolledBack" and "got worse" in message, message
    assert all(_cpu(p) == 500 for p in ip.pods().values())
    assert ip.resizes() == [record.canary, record.canary]  # there and back, nobody else
    assert _record(ip.world.deployment(APP.name)).verdict == "RolledBack"
    assert any(e["reason"] == "RolledBack" and e["type"] == "Warning"
               for e in ip.world.events(APP.name))  # fmt: skip


def _guaranteed(ip: InPlaceWorld, node: str | None = None) -> None:
    """Make the Deployment's pods Guaranteed (request = limit for CPU and memory), on
    ``node`` if given; wait for the rollout."""
    resources = {"limits": {"cpu": "500m", "memory": "128Mi"},
                 "requests": {"cpu": "500m", "memory": "128Mi"}}  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"name": "app", "resources": resources}]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    ip.kube.patch(
        DEPLOYMENTS,
        ip.stage,
        APP.name,
        {"spec": {"template": {"spec": spec}}},
        content_type="application/strategic-merge-patch+json",
    )
    ip.kube.rolled_out(ip.stage, APP.name)


def test_a_guaranteed_pod_keeps_its_qos_class_its_request_moves_with_its_limit(
    ip: InPlaceWorld,
) -> None:
    _guaranteed(ip)
    ip.world.policy("ip", "ip", apply={"method": "InPlace"})
    ip.reconcile()
    record = _record(ip.world.deployment(APP.name))
    limit = record.containers[0].after.cpu_limit or 0
    canary = ip.settled(record.canary or "", limit)
    assert _cpu(canary, "requests") == limit == _cpu(canary, "requests", where="status")
    assert canary["status"]["qosClass"] == "Guaranteed"


@contextlib.contextmanager
def small_node(plane: ControlPlane, cpu: str) -> Iterator[str]:
    """A fake node of ``cpu`` CPUs of this test's own (kwok runs it), removed after."""
    kube = Kube(plane)
    name = fresh_name("small")
    kube.create("v1/nodes", fake_node(name, cpu=cpu))
    kube.until(f"node {name} Ready", lambda: kube.get("v1/nodes", None, name),
               lambda n: any(c["type"] == "Ready" and c["status"] == "True"
                             for c in n["status"]["conditions"]))  # fmt: skip
    try:
        yield name
    finally:
        kube.delete("v1/nodes", None, name)


def _filler(ip: InPlaceWorld, node: str, cpu: str) -> None:
    """A pod of somebody else's taking ``cpu`` of the node's room."""
    ip.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ip.stage, "name": "filler"},
        "spec": {"nodeName": node, "containers": [{
            "name": "c", "image": "registry.example/filler:1",
            "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("method", "node_cpu", "filler", "words"),
    [("InPlace", "1", "400m", "Deferred"), ("InPlaceOrRollout", "1", "400m", "Deferred"),
     ("InPlace", "500m", None, "allocatable"),
     ("InPlaceOrRollout", "500m", None, "allocatable"),
     ("InPlace", "16", "static", "Infeasible"),
     ("InPlaceOrRollout", "16", "static", "Infeasible")],
    ids=["deferred-gives-up", "deferred-rolls-out", "over-capacity-gives-up",
         "over-capacity-rolls-out", "infeasible-gives-up", "infeasible-rolls-out"],
)  # fmt: skip
def test_a_resize_the_node_cannot_fit_gives_up_or_rolls_out(
    tmp_path: Path, control_plane: ControlPlane, throttlepolicy_crd: None, method: str,
    node_cpu: str, filler: str | None, words: str,
) -> None:  # fmt: skip
    # One Guaranteed pod of 500m on a small node: its request rises with its limit. Past the
    # node's room now, the kubelet defers it (PodResizePending, Deferred); past the node's
    # allocatable, the API server refuses it (403, NodeCapacity) before any kubelet sees it;
    # a kubelet whose CPU manager pins Guaranteed pods' CPUs (policy static) finds any CPU
    # resize of one Infeasible.
    app = replace(APP, pods=1)
    static = filler == "static"
    with small_node(control_plane, node_cpu) as node, \
            inplace_world(tmp_path, control_plane, app,
                          cpu_manager_policy="static" if static else "none") as ip:  # fmt: skip
        _guaranteed(ip, node)
        if filler is not None and not static:
            _filler(ip, node, filler)
        template = ip.world.deployment(APP.name)["spec"]["template"]
        (pod,) = ip.pods().values()
        ip.world.policy("ip", "ip", apply={"method": method})
        state, message = ip.reconcile()
        if filler is not None:  # the kubelet's answer comes later
            assert state == "Verifying", message
            ip.kube.until("the kubelet's answer",
                          lambda: ip.kube.get(PODS, ip.stage, pod["metadata"]["name"]),
                          lambda p: any(c["type"] == "PodResizePending"
                                        for c in p["status"].get("conditions") or []))  # fmt: skip
            state, message = ip.reconcile()
        assert words in message, message
        deployment = ip.world.deployment(APP.name)
        record = _record(deployment)
        if method == "InPlace":
            if state == "Verifying":  # the deferred resize is taken back first
                if "burst lowered first" in message:  # the change raised it: lowered first
                    state, message = ip.reconcile()
                ip.kube.until("the resize taken back",
                              lambda: ip.kube.get(PODS, ip.stage, pod["metadata"]["name"]),
                              lambda p: _cpu(p) == 500 and not any(
                                  c["type"].startswith("PodResize")
                                  for c in p["status"].get("conditions") or []))  # fmt: skip
                state, message = ip.reconcile()
            assert state == "RolledBack" and "in-place resize given up" in message, message
            assert deployment["spec"]["template"] == template
            assert _cpu(ip.kube.get(PODS, ip.stage, pod["metadata"]["name"]) or {}) == 500
            assert record.method == "InPlace"
        else:
            assert state == "Verifying" and "(a rollout: " in message, message
            assert record.method == "Rollout"
            limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
            assert parse_cpu(limits["limits"]["cpu"]) == record.containers[0].after.cpu_limit


CALM = Workload("stage", "api", 0.3, 0.0, 0.0, 1.0, 1, {"app.kubernetes.io/part-of": "ip"})
"""A steady 0.3 core (up to 0.6) under 1 CPU with a burst of 90 ms: never throttled, so
the recommendation lowers the limit, under the burst in force."""


def _burst_gauge(ip: InPlaceWorld, pod: str, seconds: float, start: int, end: int) -> None:
    """The node agent's reading of the pod's burst, from ``start`` to ``end``, into
    Prometheus (as it would have scraped it)."""
    labels = f'namespace="{ip.stage}",pod="{pod}",container="app"'
    ip.world.add_history("".join(f"unthrottle_cpu_cfs_burst_seconds{{{labels}}} {seconds} {t}\n"
                                 for t in range(start, end + 1, 5)))  # fmt: skip


def test_a_limit_lowered_under_the_burst_lowers_the_burst_first_and_waits_for_the_agent(
    tmp_path: Path, control_plane: ControlPlane, throttlepolicy_crd: None
) -> None:
    with inplace_world(tmp_path, control_plane, CALM) as ip:
        ip.kube.patch(DEPLOYMENTS, ip.stage, APP.name, {"spec": {"template": {"metadata": {
            "annotations": {"unthrottle.io/cpu-burst": "app=90ms"}}}}})  # fmt: skip
        ip.kube.rolled_out(ip.stage, APP.name)
        (pod,) = ip.pods()
        now = int(time.time())
        _burst_gauge(ip, pod, 0.09, now - 300, now)  # the agent wrote 90 ms into its cgroup
        ip.world.policy("ip", "ip", apply={"method": "InPlace"})
        _, message = ip.reconcile()
        record = _record(ip.world.deployment(APP.name))
        (change,) = record.containers
        assert (change.after.cpu_limit or 0) * 100 < 90_000 <= change.before.burst_us, change
        assert "burst lowered first" in message, message
        annotated = ip.kube.get(PODS, ip.stage, pod) or {}
        interim = annotated["metadata"]["annotations"]["unthrottle.io/cpu-burst"]
        assert interim == f"app={burst_text(change.after.burst_us)}"
        assert ip.resizes() == []  # the quota waits for the burst
        # while the agent still reports 90 ms in the cgroup, no resize
        _, message = ip.reconcile()
        assert "waiting for the node agent" in message and ip.resizes() == [], message
        time.sleep(1.1)
        later = int(time.time())
        _burst_gauge(ip, pod, change.after.burst_us / 1e6, later, later)  # the agent wrote it
        _, message = ip.reconcile()
        assert ip.resizes() == [pod], message
        annotate, resize = (
            ip.world.proxy.requests("PATCH", f"/pods/{pod}$"),
            ip.world.proxy.requests("PATCH", f"/pods/{pod}/resize$"),
        )
        assert annotate and resize
        assert ip.world.proxy.requests("PATCH", f"/pods/{pod}").index(resize[0]) > (
            ip.world.proxy.requests("PATCH", f"/pods/{pod}").index(annotate[0])
        )
        ip.settled(pod, change.after.cpu_limit or 0)


@pytest.mark.parametrize("method", ["InPlace", "InPlaceOrRollout"])
def test_without_a_resize_subresource_inplace_says_why_and_the_other_rolls_out(
    ip: InPlaceWorld, method: str
) -> None:
    # Kubernetes before 1.33 has no pods/resize: its API server answers 404 (the proxy
    # in front of the real one stands for such a server, for that path only)
    ip.world.proxy.fail_next("PATCH", "/resize$", status=404, count=10)
    ip.world.policy("ip", "ip", apply={"method": method})
    state, message = ip.reconcile()
    deployment = ip.world.deployment(APP.name)
    record = _record(deployment)
    (cond,) = [c for c in ip.world.status("ip")["conditions"] if c["type"] == "InPlaceResize"]
    assert (cond["status"], cond["reason"]) == ("False", "NoResizeSubresource")
    assert "needs Kubernetes 1.33 or later" in cond["message"]
    if method == "InPlace":
        assert state == "RolledBack" and "needs Kubernetes 1.33 or later" in message, message
        assert record.method == "InPlace" and record.verdict == "RolledBack"
        assert all(_cpu(p) == 500 for p in ip.pods().values())
    else:
        assert state == "Verifying" and "(a rollout: " in message and "1.33" in message
        assert record.method == "Rollout" and record.verdict is None
