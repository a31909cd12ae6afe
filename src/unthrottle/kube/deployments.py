"""Reading and patching workloads (Apply mode), and the VPAs that may control them.

Behind :class:`DeploymentStore`; :class:`KubeDeployments` serves it over
``kubernetes.client`` with a timeout on every call. A workload is named by its reference
(:func:`~unthrottle.model.owners.ref`): a Deployment's name, ``statefulset/<name>`` or
``daemonset/<name>``; an object read has its ``kind``. Patches are JSON Patches only
(RFC 6902, with ``test`` operations): a refused test is a :class:`PatchConflict`,
never a partial change (the API server applies a JSON Patch whole or not at all).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from unthrottle.model.owners import DAEMONSET, DEPLOYMENT, STATEFULSET, kind_and_name

_CALLS = {DEPLOYMENT: "deployment", STATEFULSET: "stateful_set", DAEMONSET: "daemon_set"}
"""``kubernetes.client.AppsV1Api``'s name of each kind in its methods."""
REVISION_LABEL = "controller-revision-hash"
"""The label a StatefulSet's and a DaemonSet's controllers give each pod (and each of their
ControllerRevisions): its revision."""


def selector_of(workload: dict[str, Any]) -> str:
    """The workload's ``matchLabels`` as a label selector (``app=web,tier=a``)."""
    labels = ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def controlled_by(obj: dict[str, Any], kind: str, uid: str) -> bool:
    """Is ``obj`` controlled by the object of ``kind`` with ``uid``?"""
    return any(ref.get("kind") == kind and ref.get("uid") == uid and ref.get("controller")
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])  # fmt: skip


def revision_pod_objects(core: Any, workload: dict[str, Any], revision: str,
                         timeout_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """A StatefulSet's or DaemonSet's pods at ``revision`` (their ``controller-revision-hash``),
    as the API serves them, by name: one LIST through ``core`` (CoreV1Api)."""
    meta = workload["metadata"]
    reply = core.list_namespaced_pod(
        meta["namespace"], label_selector=f"{selector_of(workload)},{REVISION_LABEL}={revision}",
        _preload_content=False, _request_timeout=timeout_s)  # fmt: skip
    kind = workload.get("kind") or DEPLOYMENT
    return sorted((p for p in json.loads(reply.data).get("items") or []
                   if controlled_by(p, kind, meta["uid"])),
                  key=lambda p: p["metadata"]["name"])  # fmt: skip


class PatchConflict(RuntimeError):
    """The Deployment changed since it was read (409, or 422 from a failed ``test``):
    re-read, retry next cycle."""


class AccessDenied(RuntimeError):
    """The operator's role lacks a permission (403). The message is the API server's, one
    line, naming the verb and the resource: not a fault to retry."""


class PatchRefused(RuntimeError):
    """The API server refused the patched Deployment itself (422 Invalid, or an admission
    webhook's 400/403): retrying the same change cannot help. The message is the server's."""


def _status(error: Any) -> dict[str, Any]:
    """An API error's Status body, decoded ({} when it has none or it is not JSON)."""
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _causes(error: Any) -> list[dict[str, Any]]:
    """The ``details.causes`` of an API error's Status body (none when it has no body)."""
    return list((_status(error).get("details") or {}).get("causes") or [])


def refusal(error: Any) -> str:
    """The API server's own words for a refused request, one line: its causes (each field
    and why), else its message."""
    text = "; ".join(str(c.get("message")) for c in _causes(error) if c.get("message"))
    message = _status(error).get("message")
    return " ".join(str(text or message or f"HTTP {error.status}").split())[:500]


class DeploymentStore(Protocol):
    """What Apply mode needs of Deployments."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The workload now (``name``: its reference), or None when it is gone."""
        ...

    def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]], *,
                   dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        """Apply a JSON Patch to the workload ``name`` names (``dry_run``: admission runs,
        nothing is stored)."""
        ...

    def revision_pods(self, workload: dict[str, Any], revision: str) -> list[str]:
        """The names of the workload's pods at ``revision`` (their
        ``controller-revision-hash``): a StatefulSet's or a DaemonSet's new pods."""
        ...

    def vpas(self, namespace: str) -> list[dict[str, Any]] | None:
        """The VerticalPodAutoscalers of a namespace; None where their CRD is not installed;
        :class:`AccessDenied` where the operator may not list them."""
        ...


class KubeDeployments:
    """A :class:`DeploymentStore` over ``kubernetes.client``."""

    def __init__(self, api_client: Any, *, timeout_s: float = 30.0) -> None:
        from kubernetes import client

        self.apps: Any = client.AppsV1Api(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.timeout_s = timeout_s
        self._vpa_missing = False

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        kind, plain = kind_and_name(name)
        read = getattr(self.apps, f"read_namespaced_{_CALLS[kind]}")
        try:
            reply = read(plain, namespace, _preload_content=False, _request_timeout=self.timeout_s)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        obj = dict(json.loads(reply.data))
        obj.setdefault("kind", kind)
        return obj

    def revision_pods(self, workload: dict[str, Any], revision: str) -> list[str]:
        pods = revision_pod_objects(self.core, workload, revision, self.timeout_s)
        return [p["metadata"]["name"] for p in pods]

    def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]], *,
                   dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout_s,
                                   "_content_type": "application/json-patch+json"}  # fmt: skip
        if dry_run:
            options["dry_run"] = "All"
        kind, plain = kind_and_name(name)
        patch = getattr(self.apps, f"patch_namespaced_{_CALLS[kind]}")
        try:
            reply = patch(plain, namespace, ops, **options)
        except ApiException as error:
            # A patch that does not apply to the object as it is now (a failed `test`, a path
            # that is gone) is 422 with no causes; a patched object the server refuses is 422
            # with a cause per field. Only the first means it changed since it was read.
            if error.status == 409 or (error.status == 422 and not _causes(error)):
                raise PatchConflict(f"{kind} {namespace}/{plain} changed since it was read "
                                    f"(HTTP {error.status})") from None  # fmt: skip
            if error.status in (400, 403, 422):
                raise PatchRefused(f"the API server refused the patch of {kind} "
                                   f"{namespace}/{plain}: {refusal(error)}") from None  # fmt: skip
            raise
        return dict(json.loads(reply.data))

    def vpas(self, namespace: str) -> list[dict[str, Any]] | None:
        from kubernetes.client.exceptions import ApiException

        if self._vpa_missing:
            return None
        try:
            reply = self.custom.list_namespaced_custom_object(
                "autoscaling.k8s.io", "v1", namespace, "verticalpodautoscalers",
                _preload_content=False, _request_timeout=self.timeout_s,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 404:  # no VPA CRD on this cluster
                self._vpa_missing = True
                return None
            if error.status == 403:  # authorization runs before routing: CRD or not
                raise AccessDenied(refusal(error)) from None
            raise
        return list(json.loads(reply.data).get("items", []))
