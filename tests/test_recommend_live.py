"""`unthrottle recommend` over live series: the agent samples a real throttled workload, a
real Prometheus scrapes the agent, and the Deployment comes from the API (kmock). Root only.

A busy thread (1 core of demand) runs under a 0.6 CPU quota in a kubelet-style cgroup:
throttled in nearly every period even when the 2-core machine is busy. The Deployment
says 800m, so the policy's step cap (×2 of today's limit: 1600m) is far above what the
demand needs, and the limit asserted is the engine's own decision, not the cap's (at
600m the cap, 1200m, sat right at the bound the test asserted).
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
from test_agent_kernel import CID, UID, UNTHROTTLE, Workload, start_agent, stop, wait_for
from test_recommend_cli import deployment, owned
from unthrottle.cgroups import Layout
from unthrottle.lab.noise import OtherLoad

pytestmark = [pytest.mark.kernel, requires_prometheus]


@pytest.fixture
def workload(layout: Layout) -> Iterator[Workload]:
    w = Workload(layout, quota_us=60_000)
    try:
        yield w
    finally:
        w.cleanup()


def cluster(km: KmockThread) -> None:
    """Deployment web (800m) → ReplicaSet web-5d8f → pod web-5d8f-k2x9p, whose container
    runs CID."""
    resources = {"limits": {"cpu": "800m"}, "requests": {"cpu": "200m"}}
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
        workload.prepare()
        agent = start_agent(
            ["--kubeconfig", str(kubeconfig), "--node-name", "node-test",
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
                with OtherLoad() as noise:
                    workload.start(seconds=12)
                    workload.finish()
                time.sleep(2.5)  # the last scrapes after the workload ended
                out = subprocess.run(
                    [str(UNTHROTTLE), "recommend", "--prometheus", prom.url,
                     "--kubeconfig", str(kubeconfig), "--namespace", "shop",
                     "--window", "60s", "--format", "json"],
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
    assert app["current"]["limit_millicores"] == 800
    rec = app["recommendation"]
    print(rec, noise.describe())  # what the engine decided, for the log of a failure
    # Its demand is one core per window with a core to itself; the histogram knows it to
    # a bucket (0.9, 1, 1.25 cores around it), plus 10 % headroom. On a busy machine it is
    # less (a thread waiting for a CPU is neither running nor throttled), never more. So,
    # whatever the load: within a bucket and the headroom of one core, and not the step
    # cap (1600m, which would say so in the reasons).
    assert not any(r.startswith("step limited") for r in rec["reasons"]), rec["reasons"]
    assert rec["limit_millicores"] <= 1450, rec
    assert rec["expected_throttle_ratio"] <= 0.05
    assert app["throttle_ratio"] is not None and app["throttle_ratio"] > 0
    if noise.quiet:
        # throttled in nearly every period, so well above the 600m quota that throttles it
        assert app["throttle_ratio"] >= 0.8
        assert rec["limit_millicores"] > 600, rec
