"""A workload's running pods (a Deployment's through its current ReplicaSet, a
StatefulSet's and a DaemonSet's by their current revision), and the two writes InPlace
makes to them: a resize through the pod's ``resize`` subresource, and the burst annotation
(a merge patch of the pod)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from unthrottle.kube.deployments import (
    REVISION_LABEL,
    PatchRefused,
    controlled_by,
    refusal,
    revision_pod_objects,
    selector_of,
)

REVISION = "deployment.kubernetes.io/revision"


class NoResizeSubresource(RuntimeError):
    """The API server has no ``pods/resize`` (Kubernetes before 1.33)."""


class PodStore(Protocol):
    """What InPlace reads and writes of pods."""

    def current(self, deployment: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        """The workload's current revision and its pods: a Deployment's current ReplicaSet
        (of its revision) by name, a StatefulSet's or DaemonSet's revision by its pods'
        ``controller-revision-hash`` (None, []: none yet, or a StatefulSet between two
        revisions under a partition)."""
        ...

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod, or None when it is gone."""
        ...

    def resize(self, namespace: str, name: str, body: dict[str, Any], *,
               dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        """A strategic merge patch of the pod's ``resize`` subresource: PatchRefused when the
        server refuses it, NoResizeSubresource when it has none."""
        ...

    def annotate(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the pod's metadata."""
        ...


def current_replicaset(deployment: dict[str, Any],
                       replicasets: list[dict[str, Any]]) -> dict[str, Any] | None:  # fmt: skip
    """The ReplicaSet of the Deployment's current revision, among ``replicasets``."""
    meta = deployment["metadata"]
    revision = (meta.get("annotations") or {}).get(REVISION)
    for rs in replicasets:
        if not controlled_by(rs, "Deployment", meta["uid"]):
            continue
        if revision is not None and (rs["metadata"].get("annotations") or {}).get(REVISION) == (
            revision
        ):
            return rs
    return None


def present(pod: dict[str, Any]) -> bool:
    """Started and not being deleted, Ready or not: a pod a resize (or its undo) acts on."""
    status = pod.get("status") or {}
    return not pod["metadata"].get("deletionTimestamp") and status.get("phase") == "Running"


def running(pod: dict[str, Any]) -> bool:
    """Running, not being deleted, every container ready (a pod a resize can act on)."""
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])  # fmt: skip


class KubePods:
    """A :class:`PodStore` over ``kubernetes.client``."""

    def __init__(self, api_client: Any, *, timeout_s: float = 30.0) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.apps: Any = client.AppsV1Api(api_client)
        self.timeout_s = timeout_s

    def _opts(self, **more: Any) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self.timeout_s, **more}

    def _revision(self, workload: dict[str, Any], selector: str) -> str | None:
        """A StatefulSet's revision (its pods all at one), or a DaemonSet's newest
        ControllerRevision's hash."""
        status = workload.get("status") or {}
        if workload.get("kind") == "StatefulSet":
            current = status.get("currentRevision")
            return str(current) if current and current == status.get("updateRevision") else None
        reply = self.apps.list_namespaced_controller_revision(
            workload["metadata"]["namespace"], label_selector=selector, **self._opts()
        )
        owned = [r for r in json.loads(reply.data).get("items") or []
                 if controlled_by(r, "DaemonSet", workload["metadata"]["uid"])]  # fmt: skip
        if not owned:
            return None
        newest = max(owned, key=lambda r: int(r.get("revision") or 0))
        return (newest["metadata"].get("labels") or {}).get(REVISION_LABEL)

    def current(self, deployment: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        namespace = deployment["metadata"]["namespace"]
        selector = selector_of(deployment)
        if (deployment.get("kind") or "Deployment") != "Deployment":
            revision = self._revision(deployment, selector)
            if revision is None:
                return None, []
            return revision, revision_pod_objects(self.core, deployment, revision, self.timeout_s)
        reply = self.apps.list_namespaced_replica_set(namespace, label_selector=selector,
                                                      **self._opts())  # fmt: skip
        rs = current_replicaset(deployment, json.loads(reply.data).get("items") or [])
        if rs is None:
            return None, []
        reply = self.core.list_namespaced_pod(namespace, label_selector=selector, **self._opts())
        uid = rs["metadata"]["uid"]
        pods = [p for p in json.loads(reply.data).get("items") or []
                if controlled_by(p, "ReplicaSet", uid)]  # fmt: skip
        return rs["metadata"]["name"], sorted(pods, key=lambda p: p["metadata"]["name"])

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.core.read_namespaced_pod(name, namespace, **self._opts())
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(json.loads(reply.data))

    def resize(self, namespace: str, name: str, body: dict[str, Any], *,
               dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        options = self._opts(_content_type="application/strategic-merge-patch+json")
        if dry_run:
            options["dry_run"] = "All"
        try:
            reply = self.core.patch_namespaced_pod_resize(name, namespace, body, **options)
        except ApiException as error:
            if error.status == 404 and self.get(namespace, name) is not None:
                raise NoResizeSubresource("the API server has no pods/resize subresource "
                                          "(in-place resize needs Kubernetes 1.33 or later)"
                                          ) from None  # fmt: skip
            if error.status in (400, 403, 422):
                raise PatchRefused(f"the API server refused the resize of pod {namespace}/"
                                   f"{name}: {refusal(error)}") from None  # fmt: skip
            raise
        return dict(json.loads(reply.data))

    def annotate(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.core.patch_namespaced_pod(
                name, namespace, patch, **self._opts(_content_type="application/merge-patch+json")
            )
        except ApiException as error:
            if error.status in (400, 403, 422):
                raise PatchRefused(f"the API server refused the annotation of pod {namespace}/"
                                   f"{name}: {refusal(error)}") from None  # fmt: skip
            raise
        return dict(json.loads(reply.data))
