"""The chart's pods on the real node, seen as a user and as the node sees them: the pods'
state through the API, the processes of their containers through the host's /proc (the
user id, the capabilities, the root filesystem's mount), a Prometheus on the host that
finds them by ``kubernetes_sd_configs``.

Used by tests/cluster/test_chart_on_the_real_node.py."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube import Kube
from support.real_node import _container_cgroup
from unthrottle.cgroups import Layout
from unthrottle_lab.kube import RealNode

INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
LISTED = ("deployments,daemonsets,replicasets,pods,services,endpoints,serviceaccounts,secrets,"
          "configmaps,roles,rolebindings,clusterroles,clusterrolebindings,priorityclasses,"
          "mutatingwebhookconfigurations,poddisruptionbudgets,controllerrevisions")  # fmt: skip
"""Every kind the chart makes, or its controllers make for it, as kubectl names them."""


def drop_prometheus_rbac(kube: Kube, namespace: str) -> None:
    rbac = "rbac.authorization.k8s.io/v1"
    kube.delete(f"{rbac}/clusterrolebindings", None, f"prometheus-{namespace}")
    kube.delete(f"{rbac}/clusterroles", None, f"prometheus-{namespace}")


def component_pods(kube: Kube, namespace: str, component: str) -> list[dict[str, Any]]:
    return list(kube.list("v1/pods", namespace, selector=f"{COMPONENT}={component}"))


def ready(pod: dict[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod["status"].get("conditions") or []
    )


@dataclass(frozen=True)
class Process:
    """A container's first process, as the host's /proc shows it."""

    pid: int
    uid: int
    cap_eff: int
    root_read_only: bool
    pid_namespace_is_hosts: bool


def container_process(node: RealNode, layout: Layout, pod: dict[str, Any]) -> Process:
    """The process of the pod's (first) container, found in the cgroup the kubelet made."""
    pids = _container_cgroup(node, layout, pod).pids()
    assert pids, f"no process in {pod['metadata']['name']}'s container cgroup"
    pid = min(pids)
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)  # fmt: skip
    root = next(line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                if line.split()[4] == "/")  # fmt: skip
    options = root.split()[5].split(",")
    host_ns = Path("/proc/self/ns/pid").readlink() == Path(f"/proc/{pid}/ns/pid").readlink()
    return Process(pid, int(status["Uid"].split()[0]), int(status["CapEff"].strip(), 16),
                   "ro" in options, host_ns)  # fmt: skip


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    encoded = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{encoded}", timeout=10) as reply:
        return list(json.loads(reply.read())["data"]["result"])


def pod_log(kube: Kube, namespace: str, name: str) -> str:
    """The pod's log through the API server (the kubelet serves it)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/log"
    reply = kube.call("GET", path)
    return reply if isinstance(reply, str) else json.dumps(reply)
