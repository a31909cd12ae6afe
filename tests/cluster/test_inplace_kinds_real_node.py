"""Apply's InPlace method for a StatefulSet on the real node: a single database (one
replica) is resized in its running pod, without a restart, the canary being the whole
StatefulSet (the verdict says so); the admission webhook's lookup gives its pods of the
same revision the applied limit, and those of another revision nothing. The kubelet,
containerd and runc actuate the resize in the pod's real cgroup; the reconciler runs
in-process on the test's clock (tests/support/inplace_real_node.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deployment, own_pods
from support.apply import T0, running
from support.inplace_real_node import (
    VERIFY_S,
    RealWorld,
    _on_node,
    _record,
    agent,
    idle_stage,
)
from unthrottle.cgroups import Layout
from unthrottle.units import format_cpu, parse_cpu
from unthrottle_lab.kube import ControlPlane, RealNode

pytestmark = [requires_prometheus, pytest.mark.kernel]

DB = Workload("stage", "db", 0.1, 0.10, 1.2, 0.5, 1, {"app.kubernetes.io/part-of": "ip"},
              kind="StatefulSet")  # fmt: skip
"""One replica, throttled 10 % of periods under 500m (APP's demand in
tests/support/inplace_real_node.py, on one pod)."""
STATEFULSETS = "apps/v1/statefulsets"


class StatefulWorld(RealWorld):
    """:class:`RealWorld` over the StatefulSet DB."""

    def pods(self) -> dict[str, dict[str, Any]]:
        names = own_pods(self.kube, replace(DB, namespace=self.stage))
        return {n: self.pod(n) for n in names}

    def reconcile(self) -> tuple[str, str]:
        status = self.world.reconcile("ip")
        w = next(w for w in status["workloads"] if (w["kind"], w["name"]) == (DB.kind, DB.name))
        return w["state"], w["message"] or ""

    def statefulset(self) -> dict[str, Any]:
        found = self.kube.get(STATEFULSETS, self.stage, DB.name)
        assert found is not None
        return found


@contextlib.contextmanager
def stateful_world(folder: Path, plane: ControlPlane, node: RealNode,
                   layout: Layout) -> Iterator[StatefulWorld]:  # fmt: skip
    kube = Kube(plane)
    stage = idle_stage(kube)
    w = replace(DB, namespace=stage)
    kube.create(STATEFULSETS, _on_node(deployment(w), node))
    placed = [replace(w, names=own_pods(kube, w))]
    with running(folder, kube, placed, stage, PrometheusServer) as world, \
            agent(node, plane, folder):  # fmt: skip
        yield StatefulWorld(world, node, layout)


@pytest.fixture
def sw(tmp_path: Path, control_plane: ControlPlane, real_node: RealNode, layout: Layout,
       throttlepolicy_crd: None) -> Iterator[StatefulWorld]:  # fmt: skip
    with stateful_world(tmp_path, control_plane, real_node, layout) as world:
        yield world


def test_a_single_replica_statefulset_is_resized_in_place_its_canary_the_whole_of_it(
    sw: StatefulWorld,
) -> None:
    from unthrottle.operator.admission import KubeOwners, PodAdmission

    ((pod, before),) = sw.pods().items()
    cid = before["status"]["containerStatuses"][0]["containerID"]
    assert sw.kernel(pod) == (50_000, 0)
    sw.world.policy("ip", "ip", kinds=["StatefulSet"], apply={"method": "InPlace"})
    state, message = sw.reconcile()
    assert state == "Verifying" and f"canary: pod {pod}" in message, message
    record = _record(sw.statefulset())
    assert record.in_place and record.canary == pod
    assert record.replicaset == before["metadata"]["labels"]["controller-revision-hash"]
    limit = record.containers[0].after.cpu_limit or 0
    sw.until_kernel(pod, quota=limit * 100)  # the kubelet wrote the new quota
    sw.reconcile_until("the canary reported resized",
                       lambda s, m: "verifying its throttling" in m)  # fmt: skip
    sw.world.clock.now = T0 + 60
    sw.history(pod, T0 + 60, app=DB, limit=limit / 1000 + 0.2)
    sw.world.clock.now = T0 + 60 + VERIFY_S + 60
    state, message = sw.reconcile_until("the verdict", lambda s, m: s == "Applied")
    assert "(the canary was the whole StatefulSet: one pod)" in message, message
    assert "none restarted" in message, message
    status = sw.pod(pod)["status"]["containerStatuses"][0]
    assert status["containerID"] == cid and status["restartCount"] == 0
    assert _limit_of(sw.statefulset()) == 500  # the template is left as it was
    # the webhook's lookup: a pod of this revision (a restart, a new ordinal) gets the
    # applied limit; one of another revision (a rollout since) gets nothing
    admission = PodAdmission(KubeOwners(sw.world.api))
    patch = admission.patch(sw.pod(pod))
    assert patch is not None
    (container,) = patch["spec"]["containers"]
    assert container["resources"]["limits"]["cpu"] == format_cpu(limit)
    other = sw.pod(pod)
    other["metadata"]["labels"]["controller-revision-hash"] = "db-0123456789"
    assert admission.patch(other) is None


def _limit_of(obj: dict[str, Any]) -> int:
    return parse_cpu(obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
