"""`unthrottle recommend` over live series: the agent samples a real throttled workload, a
real Prometheus scrapes the agent, and the Deployment comes from the API (kmock). Root only.

A busy thread (1 core of demand) runs under a 0.6 CPU quota in a kubelet-style cgroup.
Nothing else is scraped: the counters are the agent's (no cAdvisor here), the owners
are the API's (no kube-state-metrics).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kmock_thread import KmockThread, pod
from prom import PrometheusServer, free_port, requires_prometheus
from test_agent_kernel import CID, UID, UNTHROTTLE, Workload, stop, wait_for
from test_recommend_cli import deployment, owned
from unthrottle.cgroups import Layout

pytestmark = [pytest.mark.kernel, requires_prometheus]


@pytest.fixture
def workload(layout: Layout) -> Iterator[Workload]:
    w = Workload(layout, quota_us=60_000)
    try:
        yield w
    finally:
        w.cleanup()


def cluster(km: KmockThread) -> None:
    """Deployment web → ReplicaSet web-5d8f → pod web-5d8f-k2x9p, whose container runs CID."""
    resources = {"limits": {"cpu": "600m"}, "requests": {"cpu": "200m"}}
    app = {"name": "app", "resources": resources}
    km.put("apps/v1/deployments", deployment("shop", "web", [app]))
    km.put("apps/v1/replicasets", owned("ReplicaSet", "shop", "web-5d8f", "Deployment", "web"))
    item: dict[str, Any] = pod("shop", "web-5d8f-k2x9p", UID, "node-test", {"app": CID})
    item["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "name": "web-5d8f", "controller": True}
    ]
    km.put_pod(item)


def test_recommend_reads_what_the_agent_sampled_and_sizes_the_demand(
    workload: Workload, tmp_path: Path
) -> None:
    with KmockThread() as km:
        cluster(km)
        kubeconfig = km.kubeconfig(tmp_path / "kc")
        port = free_port()
        agent = subprocess.Popen(
            [str(UNTHROTTLE), "agent", "--kubeconfig", str(kubeconfig), "--node-name", "node-test",
             "--kubepods-parent", workload.root, "--listen", f"127.0.0.1:{port}",
             "--period", "100ms", "--discover-every", "500ms"],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz")
            scrape = (
                "scrape_configs:\n  - job_name: agent\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
            )
            with PrometheusServer(tmp_path, scrape=scrape) as prom:
                workload.start(seconds=12)
                workload.finish()
                time.sleep(2.5)  # the last scrapes after the workload ended
                out = subprocess.run(
                    [str(UNTHROTTLE), "recommend", "--prometheus", prom.url,
                     "--kubeconfig", str(kubeconfig), "--namespace", "shop",
                     "--window", "30s", "--format", "json"],
                    capture_output=True, text=True, timeout=120, check=False,
                )  # fmt: skip
        finally:
            stop(agent)
    assert out.returncode == 0, out.stderr
    assert "no unthrottle agent series" not in out.stderr
    (workload_doc,) = json.loads(out.stdout)["workloads"]
    assert (workload_doc["namespace"], workload_doc["deployment"]) == ("shop", "web")
    (app,) = workload_doc["containers"]
    assert app["name"] == "app" and app["evidence"] == "period"
    assert app["current"]["limit_millicores"] == 600
    # a busy thread under 0.6 CPU is throttled in nearly every period
    assert app["throttle_ratio"] is not None and app["throttle_ratio"] >= 0.8
    rec = app["recommendation"]
    # Its demand is one core per window (a little less when the 2-core machine is busy).
    # The histogram knows it to a bucket (0.75, 0.9, 1, 1.25 cores around it), so: well
    # above today's 600m, at most the 2× step (1200m).
    assert 800 <= rec["limit_millicores"] <= 1200, rec
    assert rec["expected_throttle_ratio"] <= 0.05
