"""The cluster admin's plain calls to a :class:`ControlPlane`, for the demo and the benches:
create, read, patch and wait on objects whose bodies are the server's own JSON, and a
ServiceAccount's token in a kubeconfig of its own, for a process that runs as that account
(the operator, on the chart's RBAC).

Resources are named ``apps/v1/deployments``, ``v1/pods`` or
``unthrottle.io/v1alpha1/throttlepolicies``. The tests have their own, larger view
(``tests/kube.py``); a tool never imports the test tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import yaml

from unthrottle_lab.kube.cluster import ControlPlane

__all__ = ["CLUSTER_SCOPED", "Admin", "AdminError", "path_of", "until"]

Obj = dict[str, Any]
T = TypeVar("T")
MERGE = "application/merge-patch+json"
CLUSTER_SCOPED = {
    "namespaces", "nodes", "customresourcedefinitions", "clusterroles", "clusterrolebindings",
    "priorityclasses", "mutatingwebhookconfigurations", "validatingwebhookconfigurations",
    "persistentvolumes", "storageclasses", "clusterkopfpeerings",
}  # fmt: skip


class AdminError(RuntimeError):
    """The API server refused a call (its status and reply in the message)."""


def path_of(resource: str, namespace: str | None, name: str | None = None,
            sub: str | None = None) -> str:  # fmt: skip
    """The URL path of a resource, e.g. ``/apis/apps/v1/namespaces/ns/deployments/web``."""
    *group_version, plural = resource.split("/")
    out = ("/api/" if len(group_version) == 1 else "/apis/") + "/".join(group_version)
    if namespace is not None and plural not in CLUSTER_SCOPED:
        out += f"/namespaces/{namespace}"
    out += f"/{plural}"
    out += f"/{name}" if name is not None else ""
    return out + (f"/{sub}" if sub is not None else "")


def until(what: str, read: Callable[[], T], check: Callable[[T], bool], *,
          timeout_s: float = 60.0, every_s: float = 0.5) -> T:  # fmt: skip
    """``read()`` once ``check`` holds on it; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = read()
        try:
            if check(found):
                return found
        except (KeyError, TypeError, IndexError, StopIteration):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s (last: {found})")
        time.sleep(every_s)


class Admin:
    """The control plane's admin (its client certificate)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def call(self, method: str, path: str, body: Any = None, *,
             content_type: str = "application/json", query: dict[str, str] | None = None,
             ok: tuple[int, ...] = (200, 201, 202)) -> Any:  # fmt: skip
        """One request; :class:`AdminError` unless its status is in ``ok``."""
        full = path + ("?" + urlencode(query) if query else "")
        status, reply = self.plane.request(method, full, body, content_type=content_type)
        if status not in ok:
            raise AdminError(f"{method} {full}: HTTP {status}: {reply}")
        return reply

    def create(self, resource: str, obj: Obj) -> Obj:
        namespace = (obj.get("metadata") or {}).get("namespace")
        return dict(self.call("POST", path_of(resource, namespace), obj))

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """The object, or None when there is none."""
        reply = self.call("GET", path_of(resource, namespace, name), ok=(200, 404))
        return dict(reply) if (reply or {}).get("kind") != "Status" else None

    def list(self, resource: str, namespace: str | None = None, *,
             selector: str | None = None) -> list[Obj]:  # fmt: skip
        query = {"labelSelector": selector} if selector else None
        return list(self.call("GET", path_of(resource, namespace), query=query)["items"])

    def patch(self, resource: str, namespace: str | None, name: str, patch: Any, *,
              content_type: str = MERGE) -> Obj:  # fmt: skip
        return dict(self.call("PATCH", path_of(resource, namespace, name), patch,
                              content_type=content_type))  # fmt: skip

    def create_namespace(self, name: str) -> Obj:
        return self.create("v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": name}})  # fmt: skip

    def until(self, what: str, read: Callable[[], T], check: Callable[[T], bool], *,
              timeout_s: float = 60.0, every_s: float = 0.5) -> T:  # fmt: skip
        """:func:`until`, for the admin's reads."""
        return until(what, read, check, timeout_s=timeout_s, every_s=every_s)

    def token(self, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
        """A token of the ServiceAccount (TokenRequest), as a pod of it is given."""
        reply = self.call("POST", path_of("v1/serviceaccounts", namespace, service_account,
                                          "token"),
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": seconds}})  # fmt: skip
        return str(reply["status"]["token"])

    def kubeconfig_for(self, path: Path, namespace: str, service_account: str) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount (its token), as its pods do."""
        config = yaml.safe_load(self.plane.kubeconfig.read_text())
        config["users"][0]["user"] = {"token": self.token(namespace, service_account)}
        config["contexts"][0]["context"]["namespace"] = namespace
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path
