"""The chart's RBAC applied on a control plane, and the operator's identity from it: shared
by the chart's install tests on their own control plane and the real node's test of the
InPlace permissions on the session's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from chart_on_cluster import RBAC_KINDS, apply, delete, render, service_account_user
from kube import Kube, fresh_name
from prom import free_port

PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}  # docs/install.md, step 1


@dataclass
class ChartRbac:
    """The chart's RBAC objects applied for a release; the operator's identity."""

    kube: Kube
    release: str
    namespace: str
    objects: list[dict[str, Any]]

    def account(self, component: str) -> str:
        label = "app.kubernetes.io/component"
        return next(o["metadata"]["name"] for o in self.objects
                    if o["kind"] == "ServiceAccount"
                    and o["metadata"]["labels"][label] == component)  # fmt: skip

    def user(self, component: str = "operator") -> str:
        return service_account_user(self.namespace, self.account(component))

    def token(self, component: str = "operator") -> str:
        return self.kube.token(self.namespace, self.account(component))

    def command(self, prometheus: str) -> list[str]:
        """The operator's command line as the chart's container runs it (the peering shell
        line included), with this test's Prometheus, listening addresses and log format."""
        deployment = next(o for o in self.objects if o["kind"] == "Deployment")
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        # the webhook's flags too: its certificate is the chart's Secret, mounted in-cluster
        ours = ("--prometheus=", "--liveness=", "--metrics=", "--log-format=", "--webhook=",
                "--webhook-tls-dir=")  # fmt: skip
        args = [a for a in c["args"] if not a.startswith(ours)]
        args += [f"--prometheus={prometheus}", f"--liveness=127.0.0.1:{free_port()}",
                 f"--metrics=127.0.0.1:{free_port()}", "--log-format=text"]  # fmt: skip
        return [*c.get("command", ["unthrottle"]), *args]

    def granted(self) -> set[tuple[str, str, str]]:
        """(group, resource, verb) of the operator's roles, as rendered."""
        names = {o["roleRef"]["name"] for o in self.objects
                 if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
                 and any(s["name"] == self.account("operator") for s in o["subjects"])}  # fmt: skip
        return {(g, r, v) for o in self.objects
                if o["kind"] in ("ClusterRole", "Role") and o["metadata"]["name"] in names
                for rule in o["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                for v in rule["verbs"]}  # fmt: skip


@contextmanager
def chart_rbac(kube: Kube, values: dict[str, Any]) -> Iterator[ChartRbac]:
    """The chart rendered by Helm for this control plane, and its ServiceAccounts, roles,
    bindings and Kopf peering objects applied with kubectl (the rest is not needed to run
    the operator here)."""
    kube.create_namespace(kube.namespace, PRIVILEGED)
    release = fresh_name("ut")
    objects = render(kube, release, kube.namespace, values)
    rbac = [o for o in objects if o["kind"] in RBAC_KINDS or o["apiVersion"] == "kopf.dev/v1"]
    apply(kube, rbac)
    try:
        yield ChartRbac(kube, release, kube.namespace, objects)
    finally:
        delete(kube, [o for o in rbac if o["kind"].startswith("Cluster")])
