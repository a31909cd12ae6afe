"""Pods named through the Kubernetes API: the real kube-apiserver, with pods bound to kwok's
fake nodes, whose stand-in kubelet reports each container's ID as a kubelet does
(``containerd://<64 hex>``). A fault proxy in front of the server stands for an API that
goes away or hangs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client

from kube import Kube
from kube_faults import FaultProxy
from support.agent_naming import (
    CID_API,
    CID_SIDECAR,
    CONTAINERD_ID,
    LISTS,
    UID_A,
    UID_B,
    _lists_and_watches,
    bound_pod,
    container_ids,
    fake_nodes,
    listed,
    ours,
    restart,
)
from unthrottle.agent.discovery import Identity
from unthrottle.agent.naming import CachedPods, KubePodSource, PodInfo, name_cgroups
from unthrottle.agent.podwatch import WatchedPods


@pytest.fixture
def core(kube: Kube) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client())


def test_only_this_nodes_pods_with_their_container_ids(kube: Kube,
                                                       core: client.CoreV1Api) -> None:  # fmt: skip
    here, there = fake_nodes(kube)
    bound_pod(kube, "api-2", there, ["api"])
    assert [p.name for p in listed(kube, KubePodSource(core, there))] == ["api-2"]
    api = bound_pod(kube, "api-1", here, ["api", "envoy"], {"unthrottle.io/cpu-burst": "40ms"})
    pods = listed(kube, KubePodSource(core, here))
    assert [(p.namespace, p.name, p.uid) for p in pods] == [
        (kube.namespace, "api-1", api["metadata"]["uid"])
    ]
    reported = container_ids(api)
    assert pods[0].containers == {reported["api"]: "api", reported["envoy"]: "envoy"}
    assert all(CONTAINERD_ID.fullmatch(cid) for cid in pods[0].containers)  # prefix gone
    assert pods[0].annotations == {"unthrottle.io/cpu-burst": "40ms"}


def test_new_restarted_and_deleted_pods_are_followed(kube: Kube, core: client.CoreV1Api) -> None:
    (node,) = fake_nodes(kube, 1)
    source = KubePodSource(core, node)
    assert ours(kube, source.pods()) == []
    first = container_ids(bound_pod(kube, "api-1", node, ["api"]))["api"]
    assert listed(kube, source)[0].containers == {first: "api"}
    restart(kube, "api-1", "api", "d" * 64)
    restarted = listed(kube, source, lambda pods: pods[0].containers != {first: "api"})
    assert restarted[0].containers == {"d" * 64: "api"}
    kube.delete("v1/pods", kube.namespace, "api-1")
    # deleted: terminating until its kubelet confirms (its cgroups are still there), then gone
    assert listed(kube, source, lambda pods: pods == []) == []


def test_an_api_outage_keeps_the_last_list_and_says_so_once(
    kube: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (node,) = fake_nodes(kube, 1)
    bound_pod(kube, "api-1", node, ["api"])
    with FaultProxy(kube) as proxy:  # the agent's way to the API server
        core = client.CoreV1Api(kube.api_client(proxy.kubeconfig(tmp_path / "kc")))
        cached = CachedPods(KubePodSource(core, node))
        assert [p.name for p in listed(kube, cached)] == ["api-1"]
    for _ in range(3):
        assert [p.name for p in ours(kube, cached.pods())] == ["api-1"]  # the API is gone
    assert sum("cannot list pods" in r.message for r in caplog.records) == 1


def test_cgroups_get_namespace_pod_and_container_names() -> None:
    pods = [PodInfo("shop", "api-1", UID_A, {CID_API: "api"})]
    found = [
        ("kubepods/burstable/pod" + UID_A, Identity(UID_A, "burstable")),
        ("kubepods/burstable/pod" + UID_A + "/" + CID_API, Identity(UID_A, "burstable", CID_API)),
        ("kubepods/burstable/pod" + UID_A + "/" + "e" * 64, Identity(UID_A, "burstable", "e" * 64)),
        ("kubepods/pod" + UID_B + "/" + CID_SIDECAR, Identity(UID_B, "guaranteed", CID_SIDECAR)),
    ]
    named = {(f.namespace, f.pod, f.container) for f in name_cgroups(found, pods)}
    # the pod cgroup and its known container; the pause container and the unknown pod are not
    assert named == {("shop", "api-1", ""), ("shop", "api-1", "api")}


def test_a_pod_list_that_hangs_gives_up_after_the_timeout(kube: Kube, tmp_path: Path) -> None:
    (node,) = fake_nodes(kube, 1)
    bound_pod(kube, "api-1", node, ["api"])
    with FaultProxy(kube) as proxy:
        core = client.CoreV1Api(kube.api_client(proxy.kubeconfig(tmp_path / "kc")))
        cached = CachedPods(KubePodSource(core, node, timeout_s=0.5))
        assert [p.name for p in listed(kube, cached)] == ["api-1"]
        # every list answers, 20 s late (a client that retried would meet the same)
        proxy.fail_next("GET", r"^/api/v1/pods$", status=None, count=10, delay=20)
        proxy.clear_requests()
        started = time.monotonic()
        assert [p.name for p in ours(kube, cached.pods())] == ["api-1"]  # the last good list
        assert 0.4 < time.monotonic() - started < 1.5  # it waited, then gave up: not 4 × 0.5 s
        assert len(proxy.requests("GET", r"^/api/v1/pods$")) == 1  # one request, no retries


def test_the_watch_follows_pods_with_one_list_and_no_periodic_list(
    kube: Kube, tmp_path: Path
) -> None:
    """New, restarted and deleted pods reach the agent through its watch: after the first
    list, no other, however many changes and however long."""
    (node,) = fake_nodes(kube, 1)
    with FaultProxy(kube) as proxy:
        core = client.CoreV1Api(kube.api_client(proxy.kubeconfig(tmp_path / "kc")))
        source = WatchedPods(core, node).start(wait_s=10)
        try:
            assert source.synced and ours(kube, source.pods()) == []
            first = container_ids(bound_pod(kube, "api-1", node, ["api"]))["api"]
            assert listed(kube, source)[0].containers == {first: "api"}
            restart(kube, "api-1", "api", "d" * 64)
            restarted = listed(kube, source, lambda pods: pods[0].containers != {first: "api"})
            assert restarted[0].containers == {"d" * 64: "api"}
            kube.delete("v1/pods", kube.namespace, "api-1")
            assert listed(kube, source, lambda pods: pods == []) == []
            time.sleep(6)  # longer than the old 5 s relist: still nothing new asked
            assert _lists_and_watches(proxy) == (1, 1)
            (watch,) = [r for r in proxy.requests("GET", LISTS) if r.params.get("watch")]
            assert watch.params["fieldSelector"] == f"spec.nodeName={node}"
            assert watch.params["resourceVersion"] and watch.params["allowWatchBookmarks"]
        finally:
            source.close()


def test_a_watch_that_ends_resumes_from_its_resource_version_and_a_gone_one_relists(
    kube: Kube, tmp_path: Path
) -> None:
    (node,) = fake_nodes(kube, 1)
    with FaultProxy(kube) as proxy:
        core = client.CoreV1Api(kube.api_client(proxy.kubeconfig(tmp_path / "kc")))
        source = WatchedPods(core, node).start(wait_s=10)
        try:
            bound_pod(kube, "api-1", node, ["api"])
            assert [p.name for p in listed(kube, source)] == ["api-1"]
            seen = source.resource_version
            proxy.end_watches()  # the connection drops (an API server restarts, a proxy)
            kube.until("a second watch", lambda: _lists_and_watches(proxy),
                       lambda counts: counts[1] == 2)  # fmt: skip
            second = [r for r in proxy.requests("GET", LISTS) if r.params.get("watch")][1]
            assert int(second.params["resourceVersion"]) >= int(seen)  # resumed, not relisted
            assert _lists_and_watches(proxy)[0] == 1
            bound_pod(kube, "api-2", node, ["api"])  # and it still follows
            assert sorted(p.name for p in listed(kube, source, lambda p: len(p) == 2)) == [
                "api-1", "api-2"]  # fmt: skip
            # the server no longer has the version (410 Gone): the node's pods listed again
            proxy.fail_next("GET", LISTS, status=410)
            proxy.end_watches()
            kube.until("a list after 410 Gone", lambda: _lists_and_watches(proxy)[0],
                       lambda lists: lists == 2)  # fmt: skip
            assert sorted(p.name for p in listed(kube, source, lambda p: len(p) == 2)) == [
                "api-1", "api-2"]  # fmt: skip
        finally:
            source.close()
