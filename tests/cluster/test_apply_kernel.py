"""The whole loop on the real kernel, in Apply mode. Root only.

The real control plane runs a Deployment ``web`` (one pod, a 600m limit) on a kwok node;
a busy thread (1 core of demand) runs in the cgroup the kubelet would have made for that
pod: named after its real UID and the container ID the node reports (kwok's pod-ready
stage writes ``containerd://`` + sha256 of ``<pod uid>/<container>``), under the 0.6 CPU
quota its limit gives. The agent, told the pod's node, names the cgroup after the pod
from the API server, and a real Prometheus scrapes it. The reconciler applies a policy;
the real Deployment controller rolls out a new pod; the test makes that pod's cgroup with
the quota the kubelet and the burst the agent would write from its spec, moves the busy
thread into it (its demand carries on in the new pod), and the kernel's own cpu.stat
shows the throttling gone to the policy's target or under.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import CgroupTree, kubepods_levels
from kube import Kube
from prom import PrometheusServer, free_port, requires_prometheus
from support.agent_kernel import (
    start_agent,
    stop,
    wait_for,
)
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.cgroups.layout import Version
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.burst import burst_specs, spec_for
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.units import Bandwidth, parse_cpu

pytestmark = [pytest.mark.kernel, pytest.mark.slow, requires_prometheus]
TARGET = 0.05
DEPLOYMENTS = "apps/v1/deployments"
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


class Pods(CgroupTree):
    """Pods' cgroups as the cgroupfs driver lays them out (burstable QoS), below a root of
    this test's; one busy process, moved from pod to pod as its Deployment rolls out."""

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.root = f"unthrottle-test-apply-{os.getpid()}"
        self.child: subprocess.Popen[bytes] | None = None

    def container(self, pod: dict[str, Any], name: str, bandwidth: Bandwidth) -> Cgroup:
        """The cgroup of a container of ``pod`` (and its parents), with ``bandwidth``."""
        uid = pod["metadata"]["uid"]
        (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == name]
        cid = status["containerID"].partition("://")[2]
        for path in kubepods_levels(self.root, uid):
            if not Cgroup(self.layout, path).exists():
                made = self.make(path)
                if path == self.root:
                    _first_in_line_for_a_cpu(made)
        cg = self.make(f"{self.root}/kubepods/burstable/pod{uid}/{cid}")
        cg.write_bandwidth(bandwidth)
        return cg

    def run_busy(self, cg: Cgroup, seconds: float) -> None:
        code = (f"import time\nend = time.monotonic() + {seconds}\n"
                "while time.monotonic() < end: pass")  # fmt: skip
        self.child = subprocess.Popen([sys.executable, "-c", code])
        cg.add_process(self.child.pid)

    def move_busy(self, cg: Cgroup) -> None:
        """The busy process goes on in ``cg`` (its pod was replaced)."""
        assert self.child is not None
        cg.add_process(self.child.pid)

    def cleanup(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        super().cleanup()


def _first_in_line_for_a_cpu(cg: Cgroup) -> None:
    """The largest CPU weight for the test's pods. The rest of this machine is other test
    runs, not a node's daemons: a node gives its pods' cgroup the weight of its allocatable
    CPU, and here the busy thread must get the core it demands whatever else runs, or its
    demand reads as what the machine left it (a thread waiting for a CPU is neither running
    nor throttled) and the limit applied for it is too small for the core it then gets.
    Quota, period and burst, what the test is about, are not touched."""
    if cg.layout.version is Version.V2:
        (cg.cpu_dir / "cpu.weight").write_text("10000")
    else:
        (cg.cpu_dir / "cpu.shares").write_text("262144")


@pytest.fixture
def pods(layout: Layout) -> Iterator[Pods]:
    tree = Pods(layout)
    try:
        yield tree
    finally:
        tree.cleanup()


def _web(namespace: str) -> dict[str, Any]:
    resources = {"limits": {"cpu": "600m"}, "requests": {"cpu": "200m"}}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": "web", "labels": {"tier": "web"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": "shop:1",
                                                       "resources": resources}]}}},
    }  # fmt: skip


def _pod(kube: Kube) -> dict[str, Any]:
    """The one pod of ``web``'s current ReplicaSet, once its rollout is complete."""
    rs = kube.replicaset_of(kube.rolled_out(kube.namespace, "web"))
    (pod,) = kube.pods_of(rs)
    return pod


def test_the_applied_limit_stops_the_throttling_on_the_kernel(
    pods: Pods, kube: Kube, throttlepolicy_crd: None, tmp_path: Path
) -> None:
    from kubernetes import client

    kube.create(DEPLOYMENTS, _web(kube.namespace))
    first = _pod(kube)
    # the container ID the node reports is the one its cgroup is named after
    uid, cid = first["metadata"]["uid"], first["status"]["containerStatuses"][0]["containerID"]
    assert cid == "containerd://" + hashlib.sha256(f"{uid}/app".encode()).hexdigest()
    old = pods.container(first, "app", Bandwidth(60_000, 100_000))
    pods.run_busy(old, seconds=90)  # the pod's cgroups exist before the agent looks
    port = free_port()
    agent = start_agent(
        ["--kubeconfig", str(kube.plane.kubeconfig), "--node-name", first["spec"]["nodeName"],
         "--kubepods-parent", pods.root, "--listen", f"127.0.0.1:{port}",
         "--period", "100ms", "--discover-every", "500ms"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", log=tmp_path / "agent.log")
        scrape = ("scrape_configs:\n  - job_name: agent\n"
                  f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")  # fmt: skip
        with PrometheusServer(tmp_path, scrape=scrape) as prom:
            time.sleep(14)  # throttled history for the policy to read
            before = old.read_stat()
            api = kube.api_client()
            source = PrometheusSource(PrometheusConfig(prom.url))
            reconciler = Reconciler(
                OperatorSettings(source.config), metrics=source,
                workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
                objects=KubeObjects(api), deployments=KubeDeployments(api),
            )  # fmt: skip
            kube.create(POLICIES, {
                "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                "metadata": {"namespace": kube.namespace, "name": "web"},
                "spec": {"mode": "Apply", "window": "5m", "targetThrottleRatio": TARGET},
            })  # fmt: skip
            body = kube.get(POLICIES, kube.namespace, "web")
            assert body is not None
            assert reconciler.reconcile(body).fault is None
        # the real controller replaces the pod; the new one carries the new limit and burst
        second = _pod(kube)
        assert second["metadata"]["uid"] != uid
        app = second["spec"]["containers"][0]
        limit = parse_cpu(app["resources"]["limits"]["cpu"])
        deploy = kube.get(DEPLOYMENTS, kube.namespace, "web")
        assert deploy is not None
        assert limit == parse_cpu(
            deploy["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        )
        spec = spec_for(burst_specs(second["metadata"].get("annotations") or {}), "app")
        quota = limit * 100
        burst, _ = spec.resolve(quota) if spec is not None else (0, False)
        if not old.supports_burst():
            burst = 0
        # the kubelet makes the new pod's cgroup with its quota, the agent writes the burst;
        # the demand (the busy thread) goes on there
        new = pods.container(second, "app", Bandwidth(quota, 100_000, burst))
        pods.move_busy(new)
        time.sleep(0.5)
        start = new.read_stat()
        time.sleep(8)
        end = new.read_stat()
    finally:
        stop(agent)
        pods.cleanup()
    throttled_before = before.nr_throttled / max(before.nr_periods, 1)
    print(f"before: {throttled_before:.0%} of periods throttled; applied {limit}m, burst "
          f"{burst} us; after: {end - start}")  # fmt: skip
    assert throttled_before >= 0.8  # a busy thread under 0.6 CPU is throttled nearly always
    assert limit > 600
    periods = end.nr_periods - start.nr_periods
    assert periods >= 40  # the thread kept running under the new limit
    assert (end.nr_throttled - start.nr_throttled) / periods <= TARGET
