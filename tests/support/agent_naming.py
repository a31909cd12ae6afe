"""What test_agent_naming.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from kube import JSON_PATCH, Kube
from kube_faults import FaultProxy
from unthrottle.agent.naming import PodInfo, PodSource

UID_A = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f"
UID_B = "0a0b0c0d-1111-2222-3333-444455556666"
CID_API = "a" * 64
CID_SIDECAR = "b" * 64
CONTAINERD_ID = re.compile(r"[0-9a-f]{64}")


# -- pods on the real server (test_agent_kernel.py uses these too) -------------------------


def fake_nodes(kube: Kube, count: int = 2) -> list[str]:
    """Names of ``count`` of the control plane's fake nodes (kwok plays their kubelets)."""
    names = sorted(n["metadata"]["name"] for n in kube.list("v1/nodes"))
    assert len(names) >= count, f"the control plane has {len(names)} nodes: {names}"
    return names[:count]


def container_ids(pod: dict[str, Any]) -> dict[str, str]:
    """Container name → the ID its kubelet reported, without the runtime's prefix."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {cs["name"]: cs["containerID"].partition("://")[2]
            for cs in statuses if cs.get("containerID")}  # fmt: skip


def bound_pod(kube: Kube, name: str, node: str, containers: list[str],
              annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod bound to ``node`` (as the scheduler would bind it), in the test's namespace,
    once its kubelet reports it running: the server's object, with the UID the server gave
    it and the container IDs the kubelet reported."""
    kube.create("v1/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": kube.namespace, "name": name,
                     "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [
            {"name": c, "image": f"registry.example/{c}:1"} for c in containers]},
    })  # fmt: skip
    return kube.until(f"pod {name} running on {node}",
                      lambda: kube.get("v1/pods", kube.namespace, name) or {},
                      lambda p: set(container_ids(p)) == set(containers))  # fmt: skip


def restart(kube: Kube, name: str, container: str, new_id: str) -> None:
    """What a kubelet reports when a container restarts: its new ID, one restart more."""
    pod = kube.get("v1/pods", kube.namespace, name)
    assert pod is not None
    index, status = next((i, cs) for i, cs in enumerate(pod["status"]["containerStatuses"])
                         if cs["name"] == container)  # fmt: skip
    at = f"/status/containerStatuses/{index}"
    kube.patch("v1/pods", kube.namespace, name, [
        {"op": "test", "path": f"{at}/containerID", "value": status["containerID"]},
        {"op": "replace", "path": f"{at}/containerID", "value": f"containerd://{new_id}"},
        {"op": "replace", "path": f"{at}/restartCount", "value": status["restartCount"] + 1},
    ], content_type=JSON_PATCH, sub="status")  # fmt: skip


def ours(kube: Kube, pods: Iterable[PodInfo]) -> list[PodInfo]:
    """The pods of the test's namespace: the nodes are shared with the session's other tests
    (and a DaemonSet that tolerates every taint runs everywhere)."""
    return [p for p in pods if p.namespace == kube.namespace]


def running(pods: list[PodInfo]) -> bool:
    return bool(pods) and all(p.containers for p in pods)


def listed(kube: Kube, source: PodSource,
           check: Callable[[list[PodInfo]], bool] = running) -> list[PodInfo]:  # fmt: skip
    """The test's pods in ``source``'s list, once ``check`` holds on them (by default: some
    pods, each with its containers' IDs). The agent lists from the API server's cache
    (``resourceVersion=0``), which may trail a write by a moment: its next discovery sees
    the write."""
    return kube.until("the node's pods, as the agent lists them",
                      lambda: ours(kube, source.pods()), check, timeout_s=10)  # fmt: skip


# -- the tests ----------------------------------------------------------------------------


# -- the watch: one list, then a watch resumed by resourceVersion ---------------------------

LISTS = r"^/api/v1/pods$"


def _lists_and_watches(proxy: FaultProxy) -> tuple[int, int]:
    seen = proxy.requests("GET", LISTS)
    watches = sum(1 for r in seen if r.params.get("watch") in ("true", "1", "True"))
    return len(seen) - watches, watches
