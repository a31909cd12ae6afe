"""Deployments as the workload store reads them from the real API server: containers,
runtimes, labels and bursts; which pods and ReplicaSets the real controllers made for
them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kube import Kube, fresh_name
from realistic import NON_ASCII, URL, container, deployment
from unthrottle.kube.watched import WatchedWorkloadStore
from unthrottle.kube.workloads import KubeWorkloadStore, WorkloadStore
from unthrottle.recommend import Runtime
from unthrottle.units import DEFAULT_PERIOD_US

DEPLOYMENTS = "apps/v1/deployments"


@pytest.fixture
def other(kube: Kube) -> Iterator[str]:
    """A second fresh namespace, deleted after the test."""
    name = fresh_name("other")
    kube.create_namespace(name)
    yield name
    kube.delete("v1/namespaces", None, name)


@pytest.fixture(params=["listed", "watched", "watched in its namespace"])
def store(request: pytest.FixtureRequest, kube: Kube) -> Iterator[WorkloadStore]:
    """The store as ``recommend`` makes it (LISTs), and as the operator does (watches, of
    every namespace or of the one it watches): the same answers."""
    from kubernetes import client

    api = kube.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    if request.param == "listed":
        yield KubeWorkloadStore(core, apps)
        return
    scope = (kube.namespace,) if request.param == "watched in its namespace" else ()
    watched = WatchedWorkloadStore(core, apps, namespaces=scope, timeout_s=10)
    yield watched
    watched.close()


def plain(namespace: str, name: str, annotations: dict[str, str],
          containers: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """A Deployment with only what the server requires beside the test's containers."""
    for c in containers:
        c.setdefault("image", f"registry.example/{c['name']}:1")
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": name, "labels": {"team": "a"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}, "annotations": annotations},
                         "spec": {"containers": containers}},
        },
    }  # fmt: skip


def test_containers_runtimes_labels_and_bursts_are_read(
    kube: Kube, store: WorkloadStore, caplog: pytest.LogCaptureFixture
) -> None:
    go = {"name": "api", "resources": {"limits": {"cpu": "0.5"}, "requests": {"cpu": "100m"}},
          "env": [{"name": "GOMAXPROCS", "value": "6"}]}  # fmt: skip
    jvm = {"name": "jvm", "resources": {"limits": {"cpu": "2"}},
           "env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx1g"}]}  # fmt: skip
    bare = {"name": "bare"}
    ns = kube.namespace
    asked = {"unthrottle.io/cpu-burst": "*=10%,api=80ms"}
    kube.create(DEPLOYMENTS, plain(ns, "api", asked, [go, jvm, bare]))
    kube.create(DEPLOYMENTS, plain(ns, "bad", {"unthrottle.io/cpu-burst": "lots"}, [dict(go)]))
    found = {d.name: d for d in store.deployments([ns])}
    api = found["api"]
    assert api.labels == {"team": "a"}
    c = api.containers
    # "0.5" is served back as "500m"
    assert (c["api"].limit_millicores, c["api"].request_millicores) == (500, 100)
    # a limit without a request: the template has none; its pods get the limit as their
    # request, and it moves with the limit, so it bounds no recommendation
    assert (c["jvm"].limit_millicores, c["jvm"].request_millicores) == (2000, 0)
    (pod,) = kube.pods_of(kube.replicaset_of(kube.rolled_out(ns, "api")))
    jvm_pod = next(x for x in pod["spec"]["containers"] if x["name"] == "jvm")
    assert jvm_pod["resources"]["requests"]["cpu"] == "2"
    assert (c["api"].runtime, c["api"].gomaxprocs_env) == (Runtime.GO, 6)
    assert c["jvm"].runtime is Runtime.JVM and c["bare"].runtime is Runtime.UNKNOWN
    # 80 ms asked, 50 ms quota: clamped as the agent writes it; 10 % of 200 ms; no limit, none
    at_100ms = [c[name].burst_at(DEFAULT_PERIOD_US) for name in ("api", "jvm", "bare")]
    assert at_100ms == [50_000, 20_000, 0]
    # a malformed annotation counts as no burst, and says why
    assert found["bad"].containers["api"].burst_at(DEFAULT_PERIOD_US) == 0
    assert f"{ns}/bad" in caplog.text and "'lots' is not a duration" in caplog.text


def test_a_deployment_that_looks_like_a_real_one_is_read_as_its_template_says(
    kube: Kube, store: WorkloadStore
) -> None:
    ns = kube.namespace
    jvm_env = [{"name": "JAVA_TOOL_OPTIONS",
                "value": f"-XX:+UseG1GC -Dupstream={URL} -Dmotd='{NON_ASCII}'"},
               {"name": "POD_NAME",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]  # fmt: skip
    go_env = [{"name": "GOMAXPROCS", "value": "3"}, {"name": "UPSTREAM", "value": URL},
              {"name": "GOMEMLIMIT", "valueFrom": {"resourceFieldRef": {
                  "resource": "limits.memory"}}}]  # fmt: skip
    burst = {"unthrottle.io/cpu-burst": "*=5ms,app=50%"}
    kube.create(DEPLOYMENTS, deployment(ns, "checkout", labels={"team": "pay"},
                                        template_annotations=burst))  # fmt: skip
    kube.create(DEPLOYMENTS, deployment(ns, "ledger", containers=[
        container("ledger", limit="1500m", request="1", env=jvm_env),
        container("proxy", limit=None, request="20m", env=go_env),
    ]))  # fmt: skip
    found = {d.name: d for d in store.deployments([ns])}
    checkout = found["checkout"]
    # the app and its sidecar; the init container ran to completion and is not sized
    assert list(checkout.containers) == ["app", "sidecar"]
    app, sidecar = checkout.containers["app"], checkout.containers["sidecar"]
    assert (app.limit_millicores, app.request_millicores) == (500, 250)
    assert (sidecar.limit_millicores, sidecar.request_millicores) == (100, 50)
    assert app.runtime is Runtime.GO and app.gomaxprocs_env is None  # GOGC only
    # half of app's 50 ms quota; the sidecar the default 5 ms, within its 10 ms quota
    assert (app.burst_at(DEFAULT_PERIOD_US), sidecar.burst_at(DEFAULT_PERIOD_US)) == (
        25_000, 5_000)  # fmt: skip
    assert checkout.labels == {"app.kubernetes.io/name": "checkout", "team": "pay"}
    assert checkout.annotations["owner"] == f"équipe paiements <pay@example.com> & {NON_ASCII}"
    assert checkout.raw["spec"]["template"]["spec"]["initContainers"][0]["name"] == "init"
    ledger, proxy = found["ledger"].containers["ledger"], found["ledger"].containers["proxy"]
    assert (ledger.limit_millicores, ledger.request_millicores) == (1500, 1000)
    assert ledger.runtime is Runtime.JVM and ledger.gomaxprocs_env is None
    # no CPU limit: nothing to size a quota from, and its request as given
    assert (proxy.limit_millicores, proxy.request_millicores) == (None, 20)
    assert (proxy.runtime, proxy.gomaxprocs_env) == (Runtime.GO, 3)


def test_pods_and_replicasets_are_owned_through_the_controllers_references(
    kube: Kube, store: WorkloadStore, other: str
) -> None:
    ns = kube.namespace
    kube.create(DEPLOYMENTS, deployment(ns, "checkout"))
    rolled = kube.rolled_out(ns, "checkout")
    first = kube.replicaset_of(rolled)
    # a rollout: a new ReplicaSet, the old one kept (scaled to 0) as history
    kube.patch(DEPLOYMENTS, ns, "checkout", {"spec": {"template": {"metadata": {
        "annotations": {"restarted": "1"}}}}})  # fmt: skip
    second = kube.replicaset_of(kube.rolled_out(ns, "checkout"))
    kube.create(DEPLOYMENTS, deployment(other, "checkout"))
    kube.rolled_out(other, "checkout")
    kube.create("v1/pods", {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"namespace": ns, "name": "bare"},
                            "spec": {"containers": [{"name": "x", "image": "x"}]}})  # fmt: skip
    owners = store.pod_owners([ns])
    rs_names = {first["metadata"]["name"], second["metadata"]["name"]}
    assert owners.replicasets == {(ns, rs): "checkout" for rs in rs_names}
    live = {p["metadata"]["name"] for p in kube.pods_of(second)}
    assert len(live) == 2 and owners.pods == {(ns, pod): "checkout" for pod in live}
    # a pod of the old ReplicaSet, gone in the rollout, is found by its generated name
    gone = f"{first['metadata']['name']}-x7k2b"
    assert owners.workload_of(ns, gone) == "checkout"
    assert owners.workload_of(ns, "bare") is None  # no owner: not a Deployment's
    assert all(namespace == ns for namespace, _ in owners.pods)  # the namespace boundary
