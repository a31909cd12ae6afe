"""The operator's own reads and writes: ThrottlePolicies, their status, ConfigMaps, events.

Behind :class:`ObjectStore`, a narrow interface; :class:`KubeObjects` serves it over
``kubernetes.client`` with a timeout on every call. Bodies are plain JSON dicts.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

GROUP, VERSION, PLURAL, KIND = "unthrottle.io", "v1alpha1", "throttlepolicies", "ThrottlePolicy"
API_VERSION = f"{GROUP}/{VERSION}"


class ObjectStore(Protocol):
    """What the reconciler writes besides Deployments."""

    def policies(self, namespace: str) -> list[dict[str, Any]]:
        """Every ThrottlePolicy in a namespace."""
        ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge ``status`` into a policy's status subresource."""
        ...

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap, or None when there is none."""
        ...

    def put_configmap(self, namespace: str, name: str, *, owner: dict[str, Any],
                      data: dict[str, str] | None = None,
                      binary_data: dict[str, str] | None = None,
                      labels: dict[str, str] | None = None) -> None:  # fmt: skip
        """Create or replace a ConfigMap owned by ``owner`` (a policy's body)."""
        ...

    def event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Post an event (``kind``: Normal or Warning) about an object."""
        ...


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """An owner reference to a policy: what it owns goes when it goes."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", KIND),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _status_of(error: Exception) -> int | None:
    return getattr(error, "status", None)


class KubeObjects:
    """An :class:`ObjectStore` over ``kubernetes.client``."""

    def __init__(self, api_client: Any, *, timeout_s: float = 30.0) -> None:
        from kubernetes import client

        # untyped on purpose: bodies are plain JSON dicts, replies raw (_preload_content=False)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def policies(self, namespace: str) -> list[dict[str, Any]]:
        reply = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL,
            _preload_content=False, _request_timeout=self.timeout_s,
        )  # fmt: skip
        return list(json.loads(reply.data).get("items", []))

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": status},
            _request_timeout=self.timeout_s,
        )  # fmt: skip

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.core.read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=self.timeout_s
            )
        except ApiException as error:
            if _status_of(error) == 404:
                return None
            raise
        return dict(json.loads(reply.data))

    def put_configmap(self, namespace: str, name: str, *, owner: dict[str, Any],
                      data: dict[str, str] | None = None,
                      binary_data: dict[str, str] | None = None,
                      labels: dict[str, str] | None = None) -> None:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels or {},
                "ownerReferences": [owner_reference(owner)],
            },
            "data": data or {},
            "binaryData": binary_data or {},
        }
        try:
            self.core.replace_namespaced_config_map(
                name, namespace, body, _request_timeout=self.timeout_s
            )
        except ApiException as error:
            if _status_of(error) != 404:
                raise
            self.core.create_namespaced_config_map(namespace, body, _request_timeout=self.timeout_s)

    def event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = involved.get("metadata") or {}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'unthrottle')}.",
                         "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"),
                "name": meta.get("name"), "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": kind, "reason": reason,
            "message": message.replace("\n", " ")[:1000],  # one line, as kubectl shows them
            "source": {"component": "unthrottle-operator"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": "unthrottle-operator",
        }  # fmt: skip
        self.core.create_namespaced_event(
            meta.get("namespace"), body, _request_timeout=self.timeout_s
        )
