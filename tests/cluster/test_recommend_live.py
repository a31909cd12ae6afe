"""`unthrottle recommend` over live series: the agent samples a real throttled workload, a
real Prometheus scrapes the agent, and the Deployment comes from the API: the real
kube-apiserver, its Deployment controller rolling the pod out onto a kwok fake node. Root only.

A busy thread (1 core of demand) runs under a 0.6 CPU quota in the cgroup the kubelet would
give the pod's container (``kubepods/burstable/pod<uid>/<container id>``, both read from
the pod's object): throttled in nearly every period even when the 2-core machine is busy.
The Deployment says 800m, so the policy's step cap (×2 of today's limit: 1600m) is far
above what the demand needs, and the limit asserted is the engine's own decision, not the
cap's (at 600m the cap, 1200m, sat right at the bound the test asserted).
Nothing else is scraped: the counters are the agent's (no cAdvisor here), the owners
are the API's (no kube-state-metrics).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import PrometheusServer, free_port, requires_prometheus
from support.agent_kernel import (
    UNTHROTTLE,
    Workload,
    start_agent,
    stop,
    wait_for,
)
from support.agent_naming import (
    container_ids,
)
from unthrottle.cgroups import Layout
from unthrottle_lab.isolation import Isolation

pytestmark = [pytest.mark.kernel, requires_prometheus]


def web(kube: Kube) -> dict[str, Any]:
    """Deployment web (800m) rolled out by the real controller: its one pod, running."""
    resources = {"limits": {"cpu": "800m"}, "requests": {"cpu": "200m"}}
    kube.create("apps/v1/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": kube.namespace, "name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                     {"name": "app", "image": "registry.example/web:1",
                      "resources": resources}]}}},
    })  # fmt: skip
    (pod,) = kube.pods_of(kube.replicaset_of(kube.rolled_out(kube.namespace, "web")))
    return pod


@dataclass
class Pod:
    """The pod of Deployment web, and its container's cgroup as its kubelet names it."""

    obj: dict[str, Any]
    workload: Workload


@pytest.fixture
def pod(layout: Layout, kube: Kube) -> Iterator[Pod]:
    obj = web(kube)
    assert obj["status"]["qosClass"] == "Burstable"  # kubepods/burstable/pod<uid>
    w = Workload(layout, quota_us=60_000, uid=obj["metadata"]["uid"],
                 cid=container_ids(obj)["app"])  # fmt: skip
    try:
        yield Pod(obj, w)
    finally:
        w.cleanup()


def test_recommend_reads_what_the_agent_sampled_and_sizes_the_demand(
    pod: Pod, kube: Kube, tmp_path: Path
) -> None:
    workload, node = pod.workload, pod.obj["spec"]["nodeName"]
    kubeconfig = kube.kubeconfig(tmp_path / "kc")
    port = free_port()
    workload.prepare()
    agent = start_agent(
        ["--kubeconfig", str(kubeconfig), "--node-name", node,
         "--kubepods-parent", workload.root, "--listen", f"127.0.0.1:{port}",
         "--period", "100ms", "--discover-every", "500ms"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", log=tmp_path / "agent.log")
        scrape = (
            "scrape_configs:\n  - job_name: agent\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        )
        with PrometheusServer(tmp_path, scrape=scrape) as prom:
            prom.until_scraped("agent")  # its first scrape comes 5-6 s after it is ready
            # The machine's other processes at idle priority (the agent and Prometheus,
            # this test's, keep theirs): the thread gets a core whatever else runs.
            with Isolation(workload.layout) as isolation:
                workload.start(seconds=12)
                workload.finish()
            time.sleep(2.5)  # the last scrapes after the workload ended
            out = subprocess.run(
                [str(UNTHROTTLE), "recommend", "--prometheus", prom.url,
                 "--kubeconfig", str(kubeconfig), "--namespace", kube.namespace,
                 "--window", "60s", "--format", "json"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
    finally:
        stop(agent)
    assert out.returncode == 0, out.stderr
    assert "no unthrottle agent series" not in out.stderr
    (workload_doc,) = json.loads(out.stdout)["workloads"]
    assert (workload_doc["namespace"], workload_doc["deployment"]) == (kube.namespace, "web")
    (app,) = workload_doc["containers"]
    assert app["name"] == "app" and app["evidence"] == "period"
    assert app["current"]["limit_millicores"] == 800
    rec = app["recommendation"]
    print(rec, isolation.describe())  # what the engine decided, for the log of a failure
    # Its demand is one core per window with a core to itself; the histogram knows it to
    # a bucket (0.9, 1, 1.25 cores around it), plus 10 % headroom: within a bucket and the
    # headroom of one core, and not the step cap (1600m, which would say so in the reasons).
    assert not any(r.startswith("step limited") for r in rec["reasons"]), rec["reasons"]
    assert rec["limit_millicores"] <= 1450, rec
    assert rec["expected_throttle_ratio"] <= 0.05
    # throttled in nearly every period, so well above the 600m quota that throttles it
    assert app["throttle_ratio"] is not None and app["throttle_ratio"] >= 0.8
    assert rec["limit_millicores"] > 600, rec
