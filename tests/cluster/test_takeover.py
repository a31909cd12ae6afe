"""A second replica: two `unthrottle operator --peering` processes (Kopf) against the real
control plane, in the peering object the chart creates; one works, the other stands by.
The working one is killed (SIGKILL: its keep-alive stays in the peering object until it
expires); the standby resumes the policy from its checkpoint and the Deployment's record:
its next status within two of the policy's intervals, reading only the gap, and the
Deployment patched once in all. A real Prometheus serves the history and logs every query
it answers (its query log), so whole-window reads are told from reads of the gap."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kube import Kube, fresh_name
from kube_faults import FaultProxy
from prom import PrometheusServer, requires_prometheus
from shop import deployment, openmetrics
from support.takeover import (
    APP,
    DEPLOYMENTS,
    INTERVAL_S,
    LIFETIME_S,
    PEERING,
    PEERING_CRDS,
    PEERINGS,
    POLICIES,
    WINDOW_S,
    StatusWatch,
    World,
    record,
    wait,
    with_query_log,
)
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture
def world(tmp_path: Path, control_plane: ControlPlane,
          throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    control_plane.install_crds(PEERING_CRDS)  # the chart's crds/
    kube = Kube(control_plane)
    namespace = fresh_name("takeover")
    kube.create_namespace(namespace)
    try:
        kube.create(DEPLOYMENTS, deployment(replace(APP, namespace=namespace)))
        rs = kube.replicaset_of(kube.rolled_out(namespace, "checkout"))
        placed = replace(APP, namespace=namespace,
                         template_hash=rs["metadata"]["labels"]["pod-template-hash"])  # fmt: skip
        end = int(time.time()) // 60 * 60
        # the chart's templates/operator-peering.yaml, for an operator given namespaces
        kube.create(PEERINGS, {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                               "metadata": {"namespace": namespace, "name": PEERING}})  # fmt: skip
        prom = PrometheusServer(tmp_path, openmetrics=openmetrics([placed], end, span=WINDOW_S))
        query_log = tmp_path / "queries.jsonl"
        with_query_log(prom, query_log)
        with FaultProxy(kube) as proxy, prom:
            yield World(kube, proxy, prom, query_log, proxy.kubeconfig(tmp_path / "kubeconfig"),
                        namespace, tmp_path)  # fmt: skip
    finally:
        # Kopf's finalizer would keep the policy, and the namespace, with no operator running
        for policy in kube.list(POLICIES, namespace):
            kube.patch(POLICIES, namespace, policy["metadata"]["name"],
                       {"metadata": {"finalizers": None}})  # fmt: skip
        kube.delete("v1/namespaces", None, namespace)


@pytest.mark.parametrize(
    ("after", "kill_after_s"),
    [("status", 3), ("status", 27), ("keep-alive", 12)],
    ids=["3 s after a status", "27 s after a status",
         "at a keep-alive 12 s or more after a status"],
)  # fmt: skip
def test_a_standby_resumes_a_killed_replicas_policy_within_two_intervals(
    world: World, after: str, kill_after_s: int
) -> None:
    """The standby resumes when the killed replica's keep-alive expires: at most
    ``LIFETIME_S`` after the kill (the whole of it when the kill comes right after a
    keep-alive), so the policy's next status comes within two intervals."""
    spec = {"mode": "Apply", "window": "2h", "interval": f"{INTERVAL_S}s",
            "selector": {"matchLabels": {"tier": "web"}}}  # fmt: skip
    world.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                                 "metadata": {"namespace": world.namespace, "name": "web"},
                                 "spec": spec})  # fmt: skip
    started = time.time()
    first, second = world.replica("replica-a", 2), world.replica("replica-b", 1)
    with StatusWatch(Kube(world.kube.plane), world.namespace, "web") as statuses, first:
        wait(lambda: "replica-a" in world.peers(), "replica-a's keep-alive", first)
        with second:
            wait(lambda: "replica-b" in world.peers(), "replica-b's keep-alive", second)
            # 1. replica-a works: the change, its rollout noted in the record, a status after
            changed = wait(lambda: record(world.deployment()), "the change", first, second)
            noted = wait(lambda: (record(world.deployment()) or changed).rollout_done_at,
                         "the rollout noted", first, second)  # fmt: skip
            last = statuses.after(time.time(), 2 * INTERVAL_S, first)
            # replica-b started paused (peering is mandatory with --peering) and stayed so
            assert "Resuming operations" not in second.log.read_text()
            assert second.queries() == 0  # it has read nothing
            full = [r for r in world.reads(started) if not r.plots and r.covers_s >= WINDOW_S]
            assert full, "replica-a's first reconcile read the whole window"
            # 2. SIGKILL replica-a some time after its last status (or right after its first
            # keep-alive from then on: its record then lasts the longest after the kill)
            time.sleep(max(0.0, last.at + kill_after_s - time.time()))
            if after == "keep-alive":
                seen = world.peers()["replica-a"]["lastseen"]
                wait(lambda: world.peers()["replica-a"]["lastseen"] != seen,
                     "replica-a's next keep-alive", first, timeout=LIFETIME_S)  # fmt: skip
            killed = time.time()
            first.kill()
            assert world.limit_patches() == 1  # replica-a's change
            world.proxy.clear_requests()
            # 3. replica-b resumes from the checkpoint and the record
            resumed = wait(lambda: "Resuming operations" in second.log.read_text() and time.time(),
                           "replica-b resuming", second, timeout=3 * INTERVAL_S)  # fmt: skip
            taken = statuses.after(killed, 3 * INTERVAL_S, second)
            assert second.queries() > 0
            later = [r for r in world.reads(killed) if not r.plots]  # the evidence's
            time.sleep(2)
            assert world.limit_patches() == 0  # none by replica-b
            # it read the policy's checkpoint back
            assert world.proxy.requests("GET", "/configmaps/web-evidence$")
    last = [w for w in statuses.writes if w.at < killed][-1]  # replica-a's last status
    gap, takeover = taken.at - last.at, taken.at - killed
    print(
        f"\ntakeover: killed {killed - last.at:.1f} s after a status; replica-b resumed "
        f"{resumed - killed:.1f} s after the kill, its status {takeover:.1f} s after it; "
        f"{gap:.1f} s between the statuses (interval {INTERVAL_S} s); "
        f"reads after the kill: {sorted({round(r.covers_s) for r in later})} s"
    )
    assert gap <= 2 * INTERVAL_S
    assert resumed - killed <= LIFETIME_S + 2
    if after == "keep-alive":  # nothing but the record's expiry let replica-b resume
        assert resumed - killed >= LIFETIME_S - 2
    # only the gap was read: no query covered the window again
    assert later and max(r.covers_s for r in later) < WINDOW_S / 4
    # the Deployment was changed once, by replica-a; replica-b goes on verifying it
    final = record(world.deployment())
    assert final is not None and (final.at, final.rollout_done_at) == (changed.at, noted)
    (checkout,) = taken.status["workloads"]
    assert checkout["state"] == "Verifying", checkout
