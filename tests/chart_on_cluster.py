"""The chart on the real control plane: rendered and installed by Helm's own Go SDK
(helm-python-sdk), its objects applied with the control plane's kubectl, and the questions
a cluster admin asks of RBAC put to the real API server (SubjectAccessReview,
SelfSubjectAccessReview, SelfSubjectRulesReview).

Used by tests/cluster/test_chart_install.py; nothing here stands in for the server.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from kube import Kube, path_of

CHART = Path(__file__).resolve().parent.parent / "charts" / "unthrottle"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
IMAGE = {"repository": "registry.example/unthrottle"}
"""Where the tests' image is: the chart requires it (README's install command sets it)."""


def with_image(values: dict[str, Any] | None) -> dict[str, Any]:
    """``values`` with the tests' ``image.repository`` unless they say where the image is."""
    values = dict(values or {})
    values["image"] = {**IMAGE, **(values.get("image") or {})}
    return values


REVIEWS = "authorization.k8s.io/v1"


def helm_config(kube: Kube, namespace: str) -> helm.Config:
    """Helm's client for the control plane, as the admin, releases stored in ``namespace``."""
    return helm.Config(kubeconfig_path=kube.plane.kubeconfig, namespace=namespace)


def render(kube: Kube, release: str, namespace: str,
           values: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """The chart's objects as ``helm install`` would make them on this control plane (its
    version and served APIs are the server's own; crds/ not included)."""
    with helm.Chart.load(CHART) as chart, helm_config(kube, namespace) as config:
        files = config.render(chart, with_image(values), name=release, namespace=namespace,
                              is_install=True)  # fmt: skip
    return [doc for path, text in sorted(files.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]  # fmt: skip


def kubectl(kube: Kube, *args: str, stdin: str | None = None) -> str:
    """The control plane's own kubectl, as the admin; AssertionError with its stderr."""
    done = subprocess.run(
        [str(kube.plane.bin("kubectl")), "--kubeconfig", str(kube.plane.kubeconfig), *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def apply(kube: Kube, objects: Iterable[dict[str, Any]]) -> None:
    """``kubectl apply`` of ``objects``, as a user applies what ``helm template`` printed."""
    kubectl(kube, "apply", "-f", "-", stdin=yaml.safe_dump_all(list(objects)))


def delete(kube: Kube, objects: Iterable[dict[str, Any]]) -> None:
    kubectl(kube, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            stdin=yaml.safe_dump_all(list(objects)))  # fmt: skip


# --- what a request asks for, and whether RBAC allows it --------------------------------


@dataclass(frozen=True, order=True)
class Access:
    """One request's authorization attributes, as the API server derives them."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""

    def __str__(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f" in {self.namespace}" if self.namespace else " (cluster-wide)"
        return f"{self.verb} {res}{'.' + self.group if self.group else ''}{where}"

    def review(self) -> dict[str, Any]:
        attributes = {"verb": self.verb, "group": self.group, "resource": self.resource,
                      "subresource": self.subresource, "namespace": self.namespace}  # fmt: skip
        return {k: v for k, v in attributes.items() if v}


_RESOURCE_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def access_of(method: str, path: str, params: dict[str, str]) -> Access | None:
    """The attributes RBAC decides a request on; None for discovery and other non-resource
    paths (which every authenticated user may read)."""
    match = _RESOURCE_PATH.match(path)
    if match is None:
        return None
    return _access(method, params, match["group"] or "", match["resource"], match["name"],
                   match["sub"] or "", match["ns"] or "")  # fmt: skip


def _access(method: str, params: dict[str, str], group: str, resource: str, name: str | None,
            sub: str, namespace: str) -> Access:  # fmt: skip
    if method == "GET":
        verb = "get" if name else ("watch" if params.get("watch") in ("1", "true") else "list")
    else:
        verb = _VERBS[method]
    return Access(verb, group, resource, sub, namespace)


def allowed_for(kube: Kube, user: str, access: Access) -> tuple[bool, str]:
    """The API server's SubjectAccessReview of ``access`` for ``user`` (with the groups a
    ServiceAccount's token carries): (allowed, the server's reason)."""
    groups = ["system:authenticated"]
    if user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2]
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    reply = kube.create(f"{REVIEWS}/subjectaccessreviews", {
        "apiVersion": REVIEWS, "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": access.review()},
    })  # fmt: skip
    status = reply.get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or status.get("denied") or "")


def self_allowed(api_client: Any, access: Access) -> bool:
    """SelfSubjectAccessReview with the client's own credentials (a token's)."""
    from kubernetes import client

    reply = client.AuthorizationV1Api(api_client).create_self_subject_access_review(
        {"apiVersion": REVIEWS, "kind": "SelfSubjectAccessReview",
         "spec": {"resourceAttributes": access.review()}})  # fmt: skip
    return bool(reply.status.allowed)


def self_rules(api_client: Any, namespace: str) -> list[dict[str, Any]]:
    """SelfSubjectRulesReview: every resource rule the client's credentials hold in
    ``namespace`` (cluster-wide rules included), as the server evaluates them."""
    from kubernetes import client

    reply = client.AuthorizationV1Api(api_client).create_self_subject_rules_review(
        {"apiVersion": REVIEWS, "kind": "SelfSubjectRulesReview",
         "spec": {"namespace": namespace}})  # fmt: skip
    return [r.to_dict() for r in reply.status.resource_rules or []]


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def exists(kube: Kube, resource: str, namespace: str | None, name: str) -> bool:
    status, _ = kube.try_call("GET", path_of(resource, namespace, name))
    return status == 200


__all__ = ["IMAGE", "RBAC_KINDS", "Access", "access_of", "allowed_for", "apply", "delete", "exists",
           "helm_config", "kubectl", "render", "self_allowed", "self_rules",
           "service_account_user", "with_image"]  # fmt: skip
