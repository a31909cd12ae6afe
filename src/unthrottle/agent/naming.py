"""Name container cgroups after their pods: namespace, pod and container, from the API.

The agent knows the pods bound to its node (``spec.nodeName``) and maps each
container ID in ``status.containerStatuses`` (``containerd://<id>``,
``cri-o://<id>``, ``docker://<id>``) to the container's name. It lists them once
and then watches them (:mod:`unthrottle.agent.podwatch`), so new pods, restarted
containers (new IDs) and deleted pods are followed; :class:`KubePodSource` is the
one-shot list. A cgroup whose pod or container the API does not
know (yet), such as the sandbox's pause container, is not exported.

The API is read through :class:`PodSource`, a narrow interface: from
``KUBECONFIG`` or the in-cluster service account. The tests read a real
kube-apiserver whose pods run on kwok's fake nodes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from unthrottle.agent.discovery import Found, Identity
from unthrottle.kube.informer import one_attempt

log = logging.getLogger("unthrottle.agent")


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the agent needs of a pod."""

    namespace: str
    name: str
    uid: str
    containers: dict[str, str] = field(default_factory=dict)
    """Container ID (without the runtime prefix) → container name."""
    annotations: dict[str, str] = field(default_factory=dict)


class PodSource(Protocol):
    """The pods bound to this node."""

    def pods(self) -> list[PodInfo]:
        """The current list (raises on failure)."""
        ...


def pod_info(item: dict[str, Any]) -> PodInfo:
    """A pod object from the API, reduced to what the agent needs."""
    meta = item.get("metadata", {})
    status = item.get("status", {})
    containers = {}
    for group in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(group) or []:
            cid = (cs.get("containerID") or "").partition("://")[2]
            if cid and cs.get("name"):
                containers[cid] = cs["name"]
    return PodInfo(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        containers=containers,
        annotations=dict(meta.get("annotations") or {}),
    )


class KubePodSource:
    """Pods on one node, from the Kubernetes API (``kubernetes.client.CoreV1Api``)."""

    def __init__(self, api: Any, node_name: str, *, timeout_s: float = 10.0) -> None:
        self.api = api
        self.node_name = node_name
        self.timeout_s = timeout_s
        """Connect and read timeout of each list, s: a hung API server must not hang the
        discovery thread (and with it the burst writer) forever."""
        one_attempt(api)

    def pods(self) -> list[PodInfo]:
        """List this node's pods (from the API server's cache: resourceVersion 0)."""
        reply = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}",
            resource_version="0",
            _preload_content=False,
            _request_timeout=(self.timeout_s, self.timeout_s),
        )
        items = json.loads(reply.data).get("items", [])
        # Filter here too (cheap): another node's pod must never name a cgroup here.
        return [
            pod_info(item)
            for item in items
            if (item.get("spec") or {}).get("nodeName") == self.node_name
        ]


def name_cgroups(found: Iterable[tuple[str, Identity]], pods: Iterable[PodInfo]) -> list[Found]:
    """Label discovered cgroups with their pods' names; skip what the API does not know."""
    by_uid = {p.uid: p for p in pods}
    out = []
    for path, identity in found:
        pod = by_uid.get(identity.pod_uid)
        if pod is None:
            continue
        if identity.container_id is None:
            out.append(Found(path, pod.namespace, pod.name, "", identity))
            continue
        name = pod.containers.get(identity.container_id)
        if name is not None:
            out.append(Found(path, pod.namespace, pod.name, name, identity))
    return out


class CachedPods:
    """The last good pod list: an API hiccup must not drop every series."""

    def __init__(self, source: PodSource) -> None:
        self.source = source
        self.last: list[PodInfo] = []
        self._failing = False

    def pods(self) -> list[PodInfo]:
        """A fresh list, or the last good one when the API fails (logged once per outage)."""
        try:
            self.last = self.source.pods()
            if self._failing:
                log.info("pod list from the API works again")
            self._failing = False
        except Exception as err:  # the API client raises many kinds
            if not self._failing:
                log.error("cannot list pods from the API (%s); keeping the last list", err)
            self._failing = True
        return self.last
