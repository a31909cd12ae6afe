"""A policy's reconcile in the test's own process, against the real API server and a real
Prometheus: the operator's :class:`~unthrottle.operator.reconcile.Reconciler` as its
Kopf handler builds it, called once per step."""

from __future__ import annotations

from typing import Any

from kube import Kube

POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


def reconciler(kube: Kube, prometheus: str, *, apply: bool, pods: bool = False) -> Any:
    """The Reconciler over the API server ``kube`` speaks to and ``prometheus``; with
    ``apply``, able to patch workloads; with ``pods``, to resize pods in place too."""
    from kubernetes import client

    from unthrottle.kube.deployments import KubeDeployments
    from unthrottle.kube.objects import KubeObjects
    from unthrottle.kube.pods import KubePods
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
    from unthrottle.operator.reconcile import Reconciler
    from unthrottle.operator.settings import OperatorSettings

    source = PrometheusSource(PrometheusConfig(prometheus, retries=0))
    api = kube.api_client()
    return Reconciler(
        OperatorSettings(source.config), metrics=source,
        workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
        objects=KubeObjects(api), deployments=KubeDeployments(api) if apply else None,
        pods=KubePods(api) if pods else None,
    )  # fmt: skip


def create_policy(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Create a ThrottlePolicy and return it as the API server stored it."""
    kube.create(POLICIES, {
        "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
        "metadata": {"namespace": namespace, "name": name}, "spec": spec,
    })  # fmt: skip
    body = kube.get(POLICIES, namespace, name)
    assert body is not None
    return body


def drop_policies(kube: Kube, namespace: str) -> None:
    """Delete the namespace's policies and wait until they are gone."""
    for policy in kube.list(POLICIES, namespace):
        kube.delete(POLICIES, namespace, policy["metadata"]["name"])
    kube.until("the policies gone", lambda: kube.list(POLICIES, namespace),
               lambda left: not left)  # fmt: skip
