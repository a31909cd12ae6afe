"""Reading and patching Deployments (Apply mode), and the VPAs that may control them.

Behind :class:`DeploymentStore`; :class:`KubeDeployments` serves it over
``kubernetes.client`` with a timeout on every call. Patches are JSON Patches only
(RFC 6902, with ``test`` operations): a refused test is a :class:`PatchConflict`,
never a partial change (the API server applies a JSON Patch whole or not at all).
"""

from __future__ import annotations

import json
from typing import Any, Protocol


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
        """The Deployment now, or None when it is gone."""
        ...

    def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]], *,
                   dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        """Apply a JSON Patch (``dry_run``: admission runs, nothing is stored)."""
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
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.timeout_s = timeout_s
        self._vpa_missing = False

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.apps.read_namespaced_deployment(
                name, namespace, _preload_content=False, _request_timeout=self.timeout_s
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(json.loads(reply.data))

    def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]], *,
                   dry_run: bool = False) -> dict[str, Any]:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout_s,
                                   "_content_type": "application/json-patch+json"}  # fmt: skip
        if dry_run:
            options["dry_run"] = "All"
        try:
            reply = self.apps.patch_namespaced_deployment(name, namespace, ops, **options)
        except ApiException as error:
            # A patch that does not apply to the object as it is now (a failed `test`, a path
            # that is gone) is 422 with no causes; a patched object the server refuses is 422
            # with a cause per field. Only the first means it changed since it was read.
            if error.status == 409 or (error.status == 422 and not _causes(error)):
                raise PatchConflict(f"Deployment {namespace}/{name} changed since it was read "
                                    f"(HTTP {error.status})") from None  # fmt: skip
            if error.status in (400, 403, 422):
                raise PatchRefused(f"the API server refused the patch of Deployment "
                                   f"{namespace}/{name}: {refusal(error)}") from None  # fmt: skip
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
