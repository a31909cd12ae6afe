"""Apply's InPlace method where the API server answers before any kubelet: a resize it
refuses (its pods' node does not support in-place resize) and a server without the
``resize`` subresource (Kubernetes before 1.33). Neither reaches a node, so the pods are
kwok's and no kubelet plays a part. The 404 of an older server is the one fault a real
v1.36 server cannot be made to give: the recording proxy in front of it
(tests/kube_faults.py) answers it, for that path only.

Everything a kubelet does about a resize (admit it, defer it, find it infeasible, write the
cgroup, report it, restart a container) is tested on the real node, in
tests/cluster/test_inplace_real_node.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deploy
from support.apply import (
    World,
    running,
)
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus
PODS = "v1/pods"
DEPLOYMENTS = "apps/v1/deployments"
APP = Workload("stage", "api", 0.1, 0.10, 1.2, 0.5, 3, {"app.kubernetes.io/part-of": "ip"})
"""Throttled 10 % of periods under 500m: the recommendation raises the limit."""


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


class InPlaceWorld:
    """A :class:`test_apply.World` over one Deployment on kwok's nodes."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.kube: Kube = world.kube
        self.stage = world.stage

    def pods(self) -> dict[str, dict[str, Any]]:
        rs = self.kube.replicaset_of(self.world.deployment(APP.name))
        return {p["metadata"]["name"]: p for p in self.kube.pods_of(rs)}

    def reconcile(self) -> tuple[str, str]:
        return _state(self.world.reconcile("ip"), APP.name)


@contextlib.contextmanager
def inplace_world(folder: Path, plane: ControlPlane,
                  app: Workload = APP) -> Iterator[InPlaceWorld]:  # fmt: skip
    kube = Kube(plane)
    placed = deploy(kube, [app])
    with running(folder, kube, placed, placed[0].namespace, PrometheusServer) as world:
        yield InPlaceWorld(world)


@pytest.fixture
def ip(tmp_path: Path, control_plane: ControlPlane,
       throttlepolicy_crd: None) -> Iterator[InPlaceWorld]:  # fmt: skip
    with inplace_world(tmp_path, control_plane) as world:
        yield world


@pytest.mark.parametrize("method", ["InPlace", "InPlaceOrRollout"])
def test_a_resize_the_server_refuses_gives_up_or_rolls_out(ip: InPlaceWorld, method: str) -> None:
    """kwok's nodes report no resources in a pod's status, as a kubelet without in-place
    resize would: the API server refuses any resize of their pods ("Pod running on node
    without support for resize", its guard for such nodes). InPlace gives up with the
    server's words and is rolled back at once (the pods never moved, and their node will
    never report resources to wait for), the template untouched; InPlaceOrRollout makes the
    change a rollout."""
    template = ip.world.deployment(APP.name)["spec"]["template"]
    ip.world.policy("ip", "ip", apply={"method": method})
    state, message = ip.reconcile()
    assert "without support for resize" in message, message
    deployment = ip.world.deployment(APP.name)
    record = _record(deployment)
    if method == "InPlace":
        assert state == "RolledBack" and "in-place resize given up" in message, message
        assert deployment["spec"]["template"] == template
        assert all(_cpu(p) == 500 for p in ip.pods().values())
        assert record.method == "InPlace" and record.verdict == "RolledBack"
    else:
        assert state == "Verifying" and "(a rollout: " in message, message
        assert record.method == "Rollout"
        limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert parse_cpu(limits["limits"]["cpu"]) == record.containers[0].after.cpu_limit


@pytest.mark.parametrize("method", ["InPlace", "InPlaceOrRollout"])
def test_without_a_resize_subresource_inplace_says_why_and_the_other_rolls_out(
    ip: InPlaceWorld, method: str
) -> None:
    # Kubernetes before 1.33 has no pods/resize: its API server answers 404 (the proxy
    # in front of the real one stands for such a server, for that path only)
    ip.world.proxy.fail_next("PATCH", "/resize$", status=404, count=10)
    ip.world.policy("ip", "ip", apply={"method": method})
    state, message = ip.reconcile()
    for _ in range(3):  # the rollout's patch met the controller's answer to the record's
        if "retried on the next cycle" not in message:  # write (a conflict): next cycle
            break
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
        assert state == "Verifying" and "(a rollout: " in message and "1.33" in message, message
        assert record.method == "Rollout" and record.verdict is None
