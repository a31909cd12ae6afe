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
    """The Deployment changed since it was read (409 / 422): re-read, retry next cycle."""


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
        """The VerticalPodAutoscalers of a namespace; None where their CRD is not installed."""
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
            if error.status in (409, 422):
                raise PatchConflict(f"Deployment {namespace}/{name} changed since it was read "
                                    f"(HTTP {error.status})") from None  # fmt: skip
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
            raise
        return list(json.loads(reply.data).get("items", []))
