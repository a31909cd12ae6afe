"""The operator's own reads and writes: ThrottlePolicies, their status, ConfigMaps, events.

Behind :class:`ObjectStore`, a narrow interface; :class:`KubeObjects` serves it over
``kubernetes.client`` with a timeout on every call. Bodies are plain JSON dicts.

A ConfigMap is replaced only when the policy owns it (an owner reference with the policy's
uid): one of the same name that it does not own, made by anyone else, is left as it is
(:class:`NotOwnedError`), since whoever may write a policy could otherwise have any
ConfigMap of the namespace overwritten, and garbage-collected with the policy.
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
        """Create a ConfigMap owned by ``owner`` (a policy's body), or replace one that
        ``owner`` owns; :class:`NotOwnedError` when one of that name is not its own."""
        ...

    def event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Post an event (``kind``: Normal or Warning) about an object."""
        ...


class NotOwnedError(Exception):
    """A ConfigMap of the name a policy writes exists, and the policy does not own it: it
    is left untouched. The message names it, its owners, and the fix."""

    def __init__(self, namespace: str, name: str, found: dict[str, Any]) -> None:
        meta = found.get("metadata") or {}
        owners = [f"{o.get('kind')} {o.get('name')}" for o in meta.get("ownerReferences") or []]
        whose = f"owned by {', '.join(owners)}" if owners else "with no owner"
        super().__init__(
            f"ConfigMap {namespace}/{name} exists and is not this policy's ({whose}): it is "
            "left untouched; rename or delete that ConfigMap, or give the policy another name"
        )
        self.namespace, self.name = namespace, name


def owned_by(found: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether an object carries an owner reference to ``owner`` (by uid, which a policy
    deleted and made again under the same name does not share)."""
    uid = (owner.get("metadata") or {}).get("uid")
    refs = (found.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(ref.get("uid") == uid for ref in refs)


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
        found = self.configmap(namespace, name)
        if found is None:
            try:
                self.core.create_namespaced_config_map(
                    namespace, body, _request_timeout=self.timeout_s
                )
                return
            except ApiException as error:
                if _status_of(error) != 409:  # made by someone else meanwhile: whose is it?
                    raise
            found = self.configmap(namespace, name)
            if found is None:
                raise NotOwnedError(namespace, name, {})  # made and deleted meanwhile
        if not owned_by(found, owner):
            raise NotOwnedError(namespace, name, found)
        # replaced only as read: a change made since (409 Conflict) is not overwritten
        body["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
        self.core.replace_namespaced_config_map(
            name, namespace, body, _request_timeout=self.timeout_s
        )

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
