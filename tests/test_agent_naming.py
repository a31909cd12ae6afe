"""Pods named through the Kubernetes API, served by the kmock emulator over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kmock_thread import KmockThread, pod
from unthrottle.agent.discovery import Identity
from unthrottle.agent.naming import CachedPods, KubePodSource, PodInfo, name_cgroups

UID_A = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f"
UID_B = "0a0b0c0d-1111-2222-3333-444455556666"
CID_API = "a" * 64
CID_SIDECAR = "b" * 64


@pytest.fixture
def api() -> Iterator[tuple[KmockThread, Any]]:
    with KmockThread() as km:
        yield km, client.CoreV1Api(client.ApiClient(client.Configuration(host=km.url)))


def test_only_this_nodes_pods_with_their_container_ids(api: tuple[KmockThread, Any]) -> None:
    km, core = api
    km.put_pod(pod("shop", "api-1", UID_A, "node-a", {"api": CID_API, "envoy": CID_SIDECAR},
                   {"unthrottle.io/cpu-burst": "40ms"}))  # fmt: skip
    km.put_pod(pod("shop", "api-2", UID_B, "node-b", {"api": "c" * 64}))
    pods = KubePodSource(core, "node-a").pods()
    assert [(p.namespace, p.name, p.uid) for p in pods] == [("shop", "api-1", UID_A)]
    assert pods[0].containers == {CID_API: "api", CID_SIDECAR: "envoy"}
    assert pods[0].annotations == {"unthrottle.io/cpu-burst": "40ms"}


def test_new_restarted_and_deleted_pods_are_followed(api: tuple[KmockThread, Any]) -> None:
    km, core = api
    source = KubePodSource(core, "node-a")
    assert source.pods() == []
    km.put_pod(pod("shop", "api-1", UID_A, "node-a", {"api": CID_API}))
    assert source.pods()[0].containers == {CID_API: "api"}
    km.put_pod(pod("shop", "api-1", UID_A, "node-a", {"api": "d" * 64}))  # restarted
    assert source.pods()[0].containers == {"d" * 64: "api"}
    km.delete_pod("shop", "api-1")
    assert source.pods() == []


def test_an_api_outage_keeps_the_last_list_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with KmockThread() as km:
        km.put_pod(pod("shop", "api-1", UID_A, "node-a", {"api": CID_API}))
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=km.url)))
        cached = CachedPods(KubePodSource(core, "node-a"))
        assert len(cached.pods()) == 1
    core.api_client.configuration.retries = 0
    for _ in range(3):
        assert [p.name for p in cached.pods()] == ["api-1"]  # the emulator is gone
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


def test_a_pod_list_that_hangs_gives_up_after_the_timeout(api: tuple[KmockThread, Any]) -> None:
    km, core = api
    km.put_pod(pod("shop", "api-1", UID_A, "node-a", {"api": CID_API}))
    cached = CachedPods(KubePodSource(core, "node-a", timeout_s=0.5))
    assert len(cached.pods()) == 1
    km.fail_next("GET", "/api/v1/pods", status=None, delay=20)  # answers, 20 s late
    core.api_client.configuration.retries = 0
    started = time.monotonic()
    assert [p.name for p in cached.pods()] == ["api-1"]  # the last good list
    assert 0.4 < time.monotonic() - started < 5  # it waited, then gave up
