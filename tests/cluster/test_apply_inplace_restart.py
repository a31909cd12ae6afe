"""InPlace with the real `unthrottle operator` (Kopf, a subprocess) on the real control
plane and the real node: killed (SIGKILL) between its canary and the rest, a restarted
operator resumes from the Deployment's record; the pods the ReplicaSet creates once the
canary passed get the applied settings from the operator's admission webhook (the chart's
configuration, pointed at the operator on 127.0.0.1). The real kubelet actuates each resize
in the pods' cgroups; Prometheus is real, and the canary's own counters after its resize
are added to it when its verification is due. Slow: ``apply.verifyFor`` is a minute at
least, on the wall clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name
from kube_faults import FaultProxy
from operator_proc import OperatorProcess
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deployment, openmetrics
from support.admission import (
    Tls,
    chart_configuration,
    configured,
    webhook_operator,
)
from support.apply import (
    restarted,
)
from support.apply_restart import (
    _wait,
)
from support.inplace_real_node import (
    IDLE,
    _on_node,
    pod_cgroup,
)
from unthrottle.cgroups import Layout
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane, RealNode

pytestmark = [requires_prometheus, pytest.mark.slow, pytest.mark.kernel]
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
APP = Workload("stage", "api", 0.1, 0.10, 1.2, 0.5, 3, {"tier": "web"})
VERIFY_S = 60


def _record(d: dict[str, Any]) -> Record | None:
    text = (d["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return None if text is None else Record.from_annotation(text)


def _limit(pod: dict[str, Any]) -> int:
    return parse_cpu(pod["spec"]["containers"][0]["resources"]["limits"]["cpu"])


@dataclass
class World:
    kube: Kube
    proxy: FaultProxy
    prom: PrometheusServer
    placed: Workload
    kubeconfig: Path
    """The operator's: through the recording proxy."""

    def deployment(self) -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, self.kube.namespace, APP.name)
        assert found is not None
        return found

    def pods(self) -> dict[str, dict[str, Any]]:
        rs = self.kube.replicaset_of(self.deployment())
        return {p["metadata"]["name"]: p for p in self.kube.pods_of(rs)}

    def resized(self) -> list[str]:
        """The pods the operators resized, one entry per resize sent."""
        return [r.path.split("/")[-2] for r in self.proxy.requests("PATCH", "/resize$")]


@pytest.fixture
def world(tmp_path: Path, control_plane: ControlPlane, real_node: RealNode,
          throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    kube = Kube(control_plane, fresh_name("stage"))
    kube.create_namespace(kube.namespace)
    try:
        kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": "idle", "namespace": kube.namespace},
                                      "data": {"scenario.yaml": IDLE}})  # fmt: skip
        kube.create(DEPLOYMENTS, _on_node(deployment(replace(APP, namespace=kube.namespace)),
                                          real_node))  # fmt: skip
        rs = kube.replicaset_of(kube.rolled_out(kube.namespace, APP.name, timeout_s=120))
        placed = replace(APP, namespace=kube.namespace,
                         template_hash=rs["metadata"]["labels"]["pod-template-hash"])  # fmt: skip
        end = int(time.time()) // 60 * 60
        history = openmetrics([placed], end, span=2 * 3600)
        with (
            FaultProxy(kube) as proxy,
            PrometheusServer(tmp_path, openmetrics=history) as prom,
        ):  # fmt: skip
            w = World(kube, proxy, prom, placed, proxy.kubeconfig(tmp_path / "kubeconfig"))
            try:
                yield w
            finally:
                w.prom.__exit__(None, None, None)
    finally:
        for policy in kube.list(POLICIES, kube.namespace):  # Kopf's finalizer, no operator
            kube.patch(POLICIES, kube.namespace, policy["metadata"]["name"],
                       {"metadata": {"finalizers": None}})  # fmt: skip
        kube.delete("v1/namespaces", None, kube.namespace)


def test_a_sigkill_between_the_canary_and_the_rest_resumes_and_new_pods_get_the_change(
    world: World, tmp_path: Path, tls: Tls, real_node: RealNode, layout: Layout
) -> None:
    kube, log = world.kube, tmp_path / "operator.log"

    def quota(pod: dict[str, Any]) -> int | None:
        """The CFS quota in the pod's container cgroup, as the kubelet wrote it (µs)."""
        return pod_cgroup(layout, real_node, pod).read_bandwidth().quota_us

    before = {n: (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["containerID"])
              for n, p in world.pods().items()}  # fmt: skip
    kube.create(POLICIES, {
        "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
        "metadata": {"namespace": kube.namespace, "name": "web"},
        "spec": {"mode": "Apply", "window": "2h", "selector": {"matchLabels": {"tier": "web"}},
                 "apply": {"method": "InPlace", "verifyFor": "1m", "maxConcurrent": 2}},
    })  # fmt: skip
    # 1. the canary is resized and its kubelet reports it; the operator dies right after
    with OperatorProcess(world.kubeconfig, world.prom.url, log, "--namespace",
                         kube.namespace) as first:  # fmt: skip
        record = _wait(lambda: (r := _record(world.deployment())) and r.canary_done_at and r,
                       "the canary resized", first)  # fmt: skip
        first.kill()
    assert world.resized() == [record.canary]
    limit = record.containers[0].after.cpu_limit
    assert limit is not None and limit > 500
    assert {n: _limit(p) for n, p in world.pods().items()} == {
        n: limit if n == record.canary else 500 for n in before
    }
    kube.until("the canary's new quota in its cgroup", lambda: world.pods()[record.canary or ""],
               lambda p: quota(p) == limit * 100)  # fmt: skip
    assert all(quota(p) == 50_000 for n, p in world.pods().items() if n != record.canary)
    # 2. a minute on: the canary's own counters since its resize, better than before
    time.sleep(max(0.0, record.canary_done_at + VERIFY_S + 5 - time.time()))
    end = int(time.time()) - 1
    canary = replace(world.placed, names=(record.canary,), limit=1.3)
    world.prom = restarted(world.prom, openmetrics(
        [canary], end, span=end - int(record.canary_done_at), step=10))  # fmt: skip
    # 3. a new operator, with its webhook and the chart's configuration, resumes
    with (
        webhook_operator(world.kubeconfig, tls, log, [kube.namespace],
                         prometheus=world.prom.url) as (second, port),
        configured(kube, chart_configuration([kube.namespace], port, tls)),
    ):  # fmt: skip
        done = _wait(lambda: (r := _record(world.deployment())) and r.verdict and r,
                     "a verdict", second, timeout=90)  # fmt: skip
        assert done.verdict == "Applied", (done, second.tail())
        # the same pods, never restarted; the canary resized once in all
        pods = world.pods()
        assert {n: (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["containerID"])
                for n, p in pods.items()} == before  # fmt: skip
        assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in pods.values())
        assert all(_limit(p) == limit for p in pods.values())
        assert all(quota(p) == limit * 100 for p in pods.values())
        assert sorted(world.resized()) == sorted(before)
        # 4. a scale-up: the ReplicaSet's new pod is created with the applied limit
        kube.patch(DEPLOYMENTS, kube.namespace, APP.name, {"spec": {"replicas": 4}})
        grown = kube.until("the fourth pod", world.pods, lambda p: len(p) == 4)
        (new,) = [p for n, p in grown.items() if n not in before]
        assert _limit(new) == limit, second.tail()
        running = kube.until("the fourth pod running", lambda: world.pods()[new["metadata"][
            "name"]], lambda p: bool(p["status"].get("containerStatuses")) and all(
                s.get("containerID") for s in p["status"]["containerStatuses"]))  # fmt: skip
        assert quota(running) == limit * 100  # the kubelet created it at the applied quota
        template = world.deployment()["spec"]["template"]["spec"]["containers"][0]
        assert parse_cpu(template["resources"]["limits"]["cpu"]) == 500  # no rollout
        assert sorted(world.resized()) == sorted(before)  # the new pod needed no resize
