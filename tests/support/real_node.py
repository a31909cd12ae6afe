"""What test_real_node.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kube import Kube
from unthrottle.cgroups import Cgroup, Layout
from unthrottle_lab.kube import RealNode, scenario_objects

ROOT = Path(__file__).resolve().parents[2]
BATCH = (ROOT / "scenarios" / "seed-000-batch-parallel.yaml").read_text()
"""Two workers, 60 ms tasks at once: under 500m the quota runs out in every busy period."""
STRATEGIC = "application/strategic-merge-patch+json"  # containers merge by name


def _running(kube: Kube, node: RealNode, name: str, *, cpu_limit: str | None = "500m",
             cpu_request: str = "250m", **kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """Apply the scenario's Deployment and return its pod once Ready on the real node."""
    for obj in scenario_objects(name, kube.namespace, BATCH, image=node.images["workload"].name,
                                node=node.name, cpu_limit=cpu_limit, cpu_request=cpu_request,
                                **kwargs):  # fmt: skip
        kube.create("v1/configmaps" if obj["kind"] == "ConfigMap" else "apps/v1/deployments", obj)

    def ready(pods: list[dict[str, Any]]) -> bool:
        conditions = pods[0]["status"].get("conditions") or []
        return len(pods) == 1 and any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in conditions)  # fmt: skip

    pods = kube.until(f"{name}'s pod Ready on {node.name}",
                      lambda: kube.list("v1/pods", kube.namespace, selector=f"app={name}"),
                      ready, timeout_s=90)  # fmt: skip
    return pods[0]


def _container_cgroup(node: RealNode, layout: Layout, pod: dict[str, Any]) -> Cgroup:
    """The container's cgroup, named as the kubelet's cgroupfs driver names it."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    qos = pod["status"]["qosClass"].lower()
    tier = "" if qos == "guaranteed" else f"/{qos}"
    rel = f"{node.cgroup_parent}/kubepods{tier}/pod{pod['metadata']['uid']}/{cid}"
    return Cgroup(layout, rel)


def _scrape(node: RealNode, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    if context is None:
        return 200, node.scrape("/metrics/cadvisor")
    try:
        with urllib.request.urlopen(node.endpoint + "/metrics/cadvisor", context=context,
                                    timeout=10) as reply:  # fmt: skip
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
