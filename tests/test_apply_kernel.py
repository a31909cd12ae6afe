"""The whole loop on the real kernel, in Apply mode. Root only.

A busy thread (1 core of demand) runs in a kubelet-style cgroup under a 0.6 CPU quota;
the agent samples it and a real Prometheus scrapes the agent; the operator (the
reconciler, against the emulator holding a Deployment that stands for the workload)
applies a policy; the test then writes the patched limit and burst into the cgroup, as
the kubelet and the agent would, and the kernel's own cpu.stat shows the throttling
gone to the policy's target or under.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kmock_thread import KmockThread
from prom import PrometheusServer, free_port, requires_prometheus
from test_agent_kernel import UNTHROTTLE, Workload, stop, wait_for
from test_recommend_live import cluster
from unthrottle.cfs import Bandwidth
from unthrottle.cfs.settings import parse_cpu
from unthrottle.cgroups import Layout
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.burst import burst_specs, spec_for
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings

pytestmark = [pytest.mark.kernel, pytest.mark.slow, requires_prometheus]
TARGET = 0.05


@pytest.fixture
def workload(layout: Layout) -> Iterator[Workload]:
    w = Workload(layout, quota_us=60_000)
    try:
        yield w
    finally:
        w.cleanup()


def test_the_applied_limit_stops_the_throttling_on_the_kernel(
    workload: Workload, tmp_path: Path
) -> None:
    from kubernetes import client

    with KmockThread() as km:
        cluster(km)
        kubeconfig = km.kubeconfig(tmp_path / "kc")
        port = free_port()
        workload.start(seconds=45)  # the pod's cgroups exist before the agent looks
        agent = subprocess.Popen(
            [str(UNTHROTTLE), "agent", "--kubeconfig", str(kubeconfig), "--node-name", "node-test",
             "--kubepods-parent", workload.root, "--listen", f"127.0.0.1:{port}",
             "--period", "100ms", "--discover-every", "500ms"],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz")
            scrape = ("scrape_configs:\n  - job_name: agent\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")  # fmt: skip
            with PrometheusServer(tmp_path, scrape=scrape) as prom:
                time.sleep(14)  # throttled history for the policy to read
                before = workload.container.read_stat()
                api = km.api_client(kubeconfig)
                source = PrometheusSource(PrometheusConfig(prom.url))
                reconciler = Reconciler(
                    OperatorSettings(source.config), metrics=source,
                    workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
                    objects=KubeObjects(api), deployments=KubeDeployments(api),
                )  # fmt: skip
                km.create("unthrottle.io/v1alpha1/throttlepolicies", {
                    "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                    "metadata": {"namespace": "shop", "name": "web"},
                    "spec": {"mode": "Apply", "window": "5m", "targetThrottleRatio": TARGET},
                })  # fmt: skip
                body = km.get("unthrottle.io/v1alpha1/throttlepolicies", "shop", "web")
                assert body is not None
                assert reconciler.reconcile(body).fault is None
                deploy = km.get("apps/v1/deployments", "shop", "web")
                assert deploy is not None
                template = deploy["spec"]["template"]
                limit = parse_cpu(template["spec"]["containers"][0]["resources"]["limits"]["cpu"])
                annotations = (template.get("metadata") or {}).get("annotations") or {}
                spec = spec_for(burst_specs(annotations), "app")
                quota = limit * 100
                burst, _ = spec.resolve(quota) if spec is not None else (0, False)
                # the kubelet writes the new quota, the agent the burst
                if not workload.container.supports_burst():
                    burst = 0
                workload.container.write_bandwidth(Bandwidth(quota, 100_000, burst))
                time.sleep(0.5)
                start = workload.container.read_stat()
                time.sleep(8)
                end = workload.container.read_stat()
                workload.finish()
        finally:
            stop(agent)
    throttled_before = before.nr_throttled / max(before.nr_periods, 1)
    assert throttled_before >= 0.8  # a busy thread under 0.6 CPU is throttled nearly always
    assert limit > 600
    periods = end.nr_periods - start.nr_periods
    assert periods >= 40  # the thread kept running under the new limit
    assert (end.nr_throttled - start.nr_throttled) / periods <= TARGET
