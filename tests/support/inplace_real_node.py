"""What test_inplace_real_node.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from kube import Kube
from prom import PrometheusServer
from shop import Workload, deployment, openmetrics
from support.apply import (
    NOW,
    World,
    running,
)
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle_lab.children import stop
from unthrottle_lab.kube import REAL_NODE_TAINT, ControlPlane, RealNode
from unthrottle_lab.prometheus import free_port

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


def idle_stage(kube: Kube) -> str:
    """A fresh namespace with the ConfigMap of what the pods run (:data:`IDLE`)."""
    stage = f"stage-{next(UNIQUE)}-{int(time.time()) % 100000}"
    kube.create_namespace(stage)
    kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "idle", "namespace": stage},
                                  "data": {"scenario.yaml": IDLE}})  # fmt: skip
    return stage


@contextlib.contextmanager
def real_world(folder: Path, plane: ControlPlane, node: RealNode, layout: Layout,
               app: Workload = APP, **container: Any) -> Iterator[RealWorld]:  # fmt: skip
    kube = Kube(plane)
    stage = idle_stage(kube)
    w = replace(app, namespace=stage)
    kube.create("apps/v1/deployments", _on_node(deployment(w), node, **container))
    rs = kube.replicaset_of(kube.rolled_out(stage, w.name, timeout_s=120))
    placed = [replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"])]
    with running(folder, kube, placed, stage, PrometheusServer) as world, \
            agent(node, plane, folder):  # fmt: skip
        yield RealWorld(world, node, layout)


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


def _burst_gauge(rw: RealWorld, pod: str, seconds: float, start: int, end: int) -> None:
    """The node agent's reading of the pod's burst from ``start`` to ``end`` (wall clock),
    into Prometheus as a scrape of it would have put it (the agent runs; this Prometheus
    serves written history and scrapes nothing)."""
    labels = f'namespace="{rw.stage}",pod="{pod}",container="app"'
    rw.world.add_history("".join(f"unthrottle_cpu_cfs_burst_seconds{{{labels}}} {seconds} {t}\n"
                                 for t in range(start, end + 1, 5)))  # fmt: skip
