"""Against a real cluster: opt-in, never run by ``make test`` unless asked.

It runs only with ``UNTHROTTLE_TEST_CLUSTER=1``: against the *current context* of
``KUBECONFIG`` when it names a cluster, or, without ``KUBECONFIG``, against the tests' own
control plane (kube-apiserver, controllers and kwok's nodes built from their Go modules,
tests/kube.py), started for the run. It creates and deletes a namespace there. An
unreachable cluster is a skip with the reason, not a failure.

    UNTHROTTLE_TEST_CLUSTER=1 KUBECONFIG=~/.kube/config .venv/bin/pytest -m cluster
    UNTHROTTLE_TEST_CLUSTER=1 .venv/bin/pytest -m cluster     # the local control plane
    # and, for `recommend` end to end, a Prometheus that scrapes that cluster:
    UNTHROTTLE_TEST_CLUSTER=1 UNTHROTTLE_TEST_PROMETHEUS=http://prometheus:9090 \
        KUBECONFIG=… .venv/bin/pytest -m cluster

Each test works in a namespace of its own (``unthrottle-test-<pid>``), deleted at the end.
The Deployment runs the pause image; its pods need not be scheduled for ownership to show.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.real_cluster import (
    KUBECONFIG,
    UNTHROTTLE,
    Cluster,
    delete_policy,
)
from unthrottle_lab.children import stop

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get("UNTHROTTLE_TEST_CLUSTER") != "1",
        reason="real-cluster suite is opt-in: set UNTHROTTLE_TEST_CLUSTER=1 (and KUBECONFIG, "
        "or none for the local control plane)",
    ),
    pytest.mark.skipif(
        bool(KUBECONFIG) and not Path(KUBECONFIG.split(os.pathsep)[0]).expanduser().exists(),
        reason="KUBECONFIG does not name a file",
    ),
]


@pytest.fixture(scope="module")
def namespace(apis: tuple[Any, Any]) -> Iterator[str]:
    core, apps = apis
    name = f"unthrottle-test-{os.getpid()}"
    core.create_namespace({"metadata": {"name": name}})
    container = {
        "image": "registry.k8s.io/pause:3.9",
        "resources": {"limits": {"cpu": "300m"}, "requests": {"cpu": "100m"}},
    }
    apps.create_namespaced_deployment(name, {
        "metadata": {"name": "web", "labels": {"tier": "front"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {**container, "name": "app", "env": [{"name": "GOMAXPROCS", "value": "4"}]},
                    {**container, "name": "sidecar"},
                ]},
            },
        },
    })  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(core.list_namespaced_pod(name).items) >= 2:
                break
            time.sleep(1)
        yield name
    finally:
        core.delete_namespace(name)


def test_deployments_containers_and_pod_owners_come_from_the_api(
    apis: tuple[Any, Any], namespace: str
) -> None:
    from unthrottle.kube.workloads import KubeWorkloadStore
    from unthrottle.recommend import Runtime

    store = KubeWorkloadStore(*apis)
    (web,) = store.deployments([namespace])
    assert (web.name, web.labels) == ("web", {"tier": "front"})
    app = web.containers["app"]
    assert (app.limit_millicores, app.request_millicores) == (300, 100)
    assert (app.runtime, app.gomaxprocs_env) == (Runtime.GO, 4)
    owners = store.pod_owners([namespace])
    pods = [p.metadata.name for p in apis[0].list_namespaced_pod(namespace).items]
    assert len(pods) >= 2
    assert all(owners.workload_of(namespace, pod) == "web" for pod in pods)
    # the names the ReplicaSet controller gives are the ones gone pods are known by
    assert all(owners.workload_of(namespace, pod[:-5] + "zzzzz") == "web" for pod in pods)


@pytest.mark.skipif(
    "UNTHROTTLE_TEST_PROMETHEUS" not in os.environ, reason="UNTHROTTLE_TEST_PROMETHEUS not set"
)
def test_recommend_lists_the_deployment_in_cluster_mode(cluster: Cluster, namespace: str) -> None:
    out = subprocess.run(
        [str(UNTHROTTLE), "recommend", "--prometheus", os.environ["UNTHROTTLE_TEST_PROMETHEUS"],
         "--namespace", namespace, "--selector", "tier=front", "--window", "1h",
         "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False, env=cluster.env(),
    )  # fmt: skip
    # a fresh Deployment may have no CPU series yet: that is exit 1 with the reason
    if out.returncode == 1:
        assert "no CPU counters" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr
    (web,) = json.loads(out.stdout)["workloads"]
    assert web["deployment"] == "web"
    assert {c["name"] for c in web["containers"]} == {"app", "sidecar"}


def test_the_crd_installs_and_a_recommend_reconcile_writes_status(
    cluster: Cluster, namespace: str, crd_installed: None, tmp_path: Path
) -> None:
    from kubernetes import client

    from prom import PrometheusServer

    custom = client.CustomObjectsApi()
    with PrometheusServer(tmp_path) as local:
        url = os.environ.get("UNTHROTTLE_TEST_PROMETHEUS", local.url)
        log = (tmp_path / "operator.log").open("w")
        operator = subprocess.Popen(
            [str(UNTHROTTLE), "operator", "--prometheus", url, "--namespace", namespace,
             "--standalone", "--log-format", "text"],
            stdout=log, stderr=subprocess.STDOUT, env=cluster.env(),
        )  # fmt: skip
        try:
            custom.create_namespaced_custom_object(
                "unthrottle.io", "v1alpha1", namespace, "throttlepolicies",
                {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                 "metadata": {"name": "front"},
                 "spec": {"selector": {"matchLabels": {"tier": "front"}}, "window": "1h"}},
            )  # fmt: skip
            status: dict[str, Any] = {}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not status.get("summary"):
                policy = custom.get_namespaced_custom_object(
                    "unthrottle.io", "v1alpha1", namespace, "throttlepolicies", "front"
                )
                status = policy.get("status") or {}
                time.sleep(2)
            assert status.get("summary", {}).get("deployments") == 1, (
                tmp_path / "operator.log"
            ).read_text()
            (web,) = status["workloads"]
            assert web["deployment"] == "web"
            assert {c["name"] for c in web["containers"]} == {"app", "sidecar"}
            # nothing was patched in Recommend mode
            apps = client.AppsV1Api()
            deploy = apps.read_namespaced_deployment("web", namespace)
            assert deploy.spec.template.spec.containers[0].resources.limits["cpu"] == "300m"
        finally:
            delete_policy(namespace, "front")  # while the operator runs: Kopf's finalizer
            stop(operator, timeout_s=30)
            log.close()
