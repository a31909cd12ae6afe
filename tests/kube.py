"""The real Kubernetes control plane in the tests: one per run, a namespace per test.

``control_plane`` (session scope, in conftest) starts etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok's fake nodes once
(:mod:`unthrottle_lab.kube`); :class:`Kube` is the tests' admin view of it: plain
HTTP calls whose bodies are the server's own JSON, with helpers to create objects, wait
for a rollout that the real Deployment controller carries out, and write a kubeconfig
for a process under test.

Resources are named as ``apps/v1/deployments``, ``v1/pods`` or
``unthrottle.io/v1alpha1/throttlepolicies``.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import yaml

from unthrottle_lab.kube import ControlPlane
from unthrottle_lab.kube.admin import Admin, path_of
from unthrottle_lab.kube.admin import until as _until

Obj = dict[str, Any]
T = TypeVar("T")

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(AssertionError):
    """The API server refused a call the test expected to succeed."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body}")
        self.status, self.body = status, body


class Kube:
    """The admin's view of a running control plane."""

    def __init__(self, plane: ControlPlane, namespace: str = "default") -> None:
        self.plane = plane
        self.namespace = namespace

    # -- calls --------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, *, query: dict[str, str] | None = None,
             content_type: str = "application/json", ok: tuple[int, ...] = (200, 201, 202),
             ) -> Any:  # fmt: skip
        """One request; KubeError unless the status is in ``ok``."""
        full = path + ("?" + urlencode(query) if query else "")
        status, reply = self.plane.request(method, full, body, content_type=content_type)
        if status not in ok:
            raise KubeError(status, reply, f"{method} {full}")
        return reply

    def try_call(self, method: str, path: str, body: Any = None, *,
                 content_type: str = "application/json") -> tuple[int, Any]:  # fmt: skip
        """One request: (HTTP status, body), whatever the status."""
        return self.plane.request(method, path, body, content_type=content_type)

    # -- objects --------------------------------------------------------------------------

    def create(self, resource: str, obj: Obj) -> Obj:
        ns = (obj.get("metadata") or {}).get("namespace")
        return dict(self.call("POST", path_of(resource, ns), obj))

    def put(self, resource: str, obj: Obj) -> Obj:
        """Create or update ``obj`` (server-side apply by the test, forced)."""
        meta = obj["metadata"]
        path = path_of(resource, meta.get("namespace"), meta["name"])
        return dict(self.call("PATCH", path, obj, content_type=APPLY,
                              query={"fieldManager": "test", "force": "true"}))  # fmt: skip

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        status, reply = self.try_call("GET", path_of(resource, namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, reply, f"GET {resource} {namespace}/{name}")
        return dict(reply)

    def list(self, resource: str, namespace: str | None = None, *,
             selector: str | None = None) -> list[Obj]:  # fmt: skip
        query = {"labelSelector": selector} if selector else None
        return list(self.call("GET", path_of(resource, namespace), query=query)["items"])

    def patch(self, resource: str, namespace: str | None, name: str, patch: Any, *,
              content_type: str = MERGE, sub: str | None = None) -> Obj:  # fmt: skip
        return dict(self.call("PATCH", path_of(resource, namespace, name, sub), patch,
                              content_type=content_type))  # fmt: skip

    def delete(self, resource: str, namespace: str | None, name: str) -> None:
        self.call("DELETE", path_of(resource, namespace, name), ok=(200, 202, 404))

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        return self.put(
            "v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            },
        )

    # -- waiting --------------------------------------------------------------------------

    def until(self, what: str, read: Callable[[], T], check: Callable[[T], bool], *,
              timeout_s: float = 60.0) -> T:  # fmt: skip
        """``read()`` once ``check`` holds on it (AssertionError with the last value)."""
        try:
            return _until(what, read, check, timeout_s=timeout_s, every_s=0.2)
        except TimeoutError as error:
            raise AssertionError(str(error)) from None

    def rolled_out(self, namespace: str, name: str, *, timeout_s: float = 60.0) -> Obj:
        """The Deployment once its rollout is complete as ``kubectl rollout status`` sees it:
        the controller observed the generation, and every replica is updated, available
        and the only one left (old pods gone)."""

        def done(d: Obj | None) -> bool:
            if d is None:
                return False
            spec, status = d["spec"], d.get("status") or {}
            want = spec.get("replicas", 1)
            return (status.get("observedGeneration", 0) >= d["metadata"]["generation"]
                    and status.get("updatedReplicas", 0) == want
                    and status.get("replicas", 0) == want
                    and status.get("availableReplicas", 0) == want)  # fmt: skip

        found = self.until(f"rollout of {namespace}/{name}",
                           lambda: self.get("apps/v1/deployments", namespace, name), done,
                           timeout_s=timeout_s)  # fmt: skip
        assert found is not None
        return found

    def replicaset_of(self, deployment: Obj) -> Obj:
        """The Deployment's current ReplicaSet (the one its template hashes to)."""
        meta = deployment["metadata"]
        for rs in self.list("apps/v1/replicasets", meta["namespace"]):
            owners = rs["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == meta["uid"] for o in owners) and rs["metadata"].get(
                "annotations", {}
            ).get("deployment.kubernetes.io/revision") == meta.get("annotations", {}).get(
                "deployment.kubernetes.io/revision"
            ):
                return rs  # fmt: skip
        raise AssertionError(f"no current ReplicaSet for {meta['namespace']}/{meta['name']}")

    def pods_of(self, replicaset: Obj) -> list[Obj]:
        meta = replicaset["metadata"]
        return [p for p in self.list("v1/pods", meta["namespace"])
                if any(o.get("uid") == meta["uid"]
                       for o in p["metadata"].get("ownerReferences") or [])]  # fmt: skip

    # -- credentials ---------------------------------------------------------------------

    def kubeconfig(self, path: Path, *, namespace: str | None = None, token: str | None = None,
                   server: str | None = None) -> Path:  # fmt: skip
        """A kubeconfig for a client under test: the admin's, or a bearer ``token``'s (a
        ServiceAccount's, for RBAC), or plain HTTP to ``server`` (a fault proxy)."""
        config = yaml.safe_load(self.plane.kubeconfig.read_text())
        cluster, user, context = (config["clusters"][0]["cluster"], config["users"][0]["user"],
                                  config["contexts"][0]["context"])  # fmt: skip
        if token is not None:
            user.clear()
            user["token"] = token
        if server is not None:
            cluster.clear()
            cluster["server"] = server
        if namespace is not None:
            context["namespace"] = namespace
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def token(self, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
        """A token of a ServiceAccount (TokenRequest), as a pod would be given."""
        return Admin(self.plane).token(namespace, service_account, seconds=seconds)

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A ``kubernetes`` ApiClient for a kubeconfig (the admin's by default)."""
        from kubernetes import config

        return config.new_client_from_config(str(kubeconfig or self.plane.kubeconfig))


def api_requests(plane: ControlPlane) -> list[tuple[dict[str, str], int]]:
    """Every series of the API server's own ``apiserver_request_total`` so far: its labels
    (verb, resource, subresource, scope, ...) and its count."""
    status, text = plane.request("GET", "/metrics")
    assert status == 200, text
    out = []
    for line in str(text).splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, value = line[len("apiserver_request_total{") :].rsplit("} ", 1)
            out.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), int(float(value))))
    return out


def fresh_name(prefix: str) -> str:
    """A namespace or object name no other test uses: ``prefix-xxxxxx``."""
    return f"{prefix[:50].rstrip('-')}-{secrets.token_hex(3)}"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, ensure_ascii=False)
