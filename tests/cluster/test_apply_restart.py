"""The operator may die at any point: killed (SIGKILL) while its patch is in flight, or
between a patch and its verdict, a restarted operator resumes from the Deployments'
records. The real `unthrottle operator` (Kopf) against the real control plane, through a
fault proxy (tests/kube_faults.py) that holds the patch in flight, and a real Prometheus.

A patch in flight when the operator dies either never reaches the API server (the
connection is lost) or reaches it after the client is gone, and a real server then
applies it: the Deployment must show no change, or the change with its record, never a
half. The rollout the change starts is held until the test lets it finish: the pods of
``checkout`` may only run on a node carrying a label of this test's, taken off the node
before the first patch (the running pods stay; the new ones wait, as for a full cluster)
and put back for the rollout to complete."""

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
from support.apply_restart import (
    APP,
    DEPLOYMENTS,
    IN_FLIGHT_S,
    POLICIES,
    World,
    _label_node,
    _record,
    _settings,
    _wait,
)
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture
def world(tmp_path: Path, control_plane: ControlPlane,
          throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    kube = Kube(control_plane)
    namespace = fresh_name("stage")
    hold = f"test.unthrottle.io/{namespace}"
    kube.create_namespace(namespace)
    _label_node(kube, hold, "ready")
    try:
        body = deployment(replace(APP, namespace=namespace))
        body["spec"]["template"]["spec"]["nodeSelector"] = {hold: "ready"}
        kube.create(DEPLOYMENTS, body)
        rs = kube.replicaset_of(kube.rolled_out(namespace, "checkout"))
        placed = replace(APP, namespace=namespace,
                         template_hash=rs["metadata"]["labels"]["pod-template-hash"])  # fmt: skip
        end = int(time.time()) // 60 * 60
        history = openmetrics([placed], end, span=2 * 3600)
        with FaultProxy(kube) as proxy, PrometheusServer(tmp_path, openmetrics=history) as prom:
            _label_node(kube, hold, None)  # from now on, new pods wait for a node
            yield World(kube, proxy, prom, proxy.kubeconfig(tmp_path / "kubeconfig"),
                        namespace, hold)  # fmt: skip
    finally:
        _label_node(kube, hold, None)
        # Kopf's finalizer would keep the policy, and the namespace, with no operator running
        for policy in kube.list(POLICIES, namespace):
            kube.patch(POLICIES, namespace, policy["metadata"]["name"],
                       {"metadata": {"finalizers": None}})  # fmt: skip
        kube.delete("v1/namespaces", None, namespace)


@pytest.mark.parametrize(
    "lost",
    [True, False],
    ids=["the patch is lost with the connection",
         "the server applies the patch after the operator died"],
)  # fmt: skip
def test_a_sigkill_mid_cycle_leaves_no_half_change_and_a_restart_resumes(
    world: World, tmp_path: Path, lost: bool
) -> None:
    log = tmp_path / "operator.log"
    original = world.deployment()
    spec = {"mode": "Apply", "window": "2h", "selector": {"matchLabels": {"tier": "web"}}}
    world.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                                 "metadata": {"namespace": world.namespace, "name": "web"},
                                 "spec": spec})  # fmt: skip
    # 1. the patch is held in flight; the operator is killed before the API server answers
    world.proxy.fail_next("PATCH", r"/deployments/checkout$", status=None, delay=IN_FLIGHT_S,
                          disconnect=lost)  # fmt: skip
    with world.operator(log) as first:
        _wait(lambda: world.proxy.requests("PATCH", r"/deployments/checkout$"), "a patch", first)
        first.kill()
    time.sleep(IN_FLIGHT_S + 1)  # the proxy has dropped the patch, or the server applied it
    now = world.deployment()
    record = _record(now)
    if lost:  # nothing half-applied: no change at all
        assert now["spec"] == original["spec"] and record is None
    else:  # the whole change, with its record
        assert record is not None and record.verdict is None
        assert _settings(now)[0] == record.containers[0].after.cpu_limit > 500
    # 2. restarted, it changes the Deployment once in all: the change and its record together
    world.proxy.clear_requests()
    with world.operator(log) as second:
        patched = _wait(lambda: _record(world.deployment()) and world.deployment(),
                        "the change", second)  # fmt: skip
        if not lost:  # the record says a change is in verification: nothing to patch
            _wait(world.status, "a status", second)
        second.kill()  # 3. killed again, between the change and its verdict
    record = _record(patched)
    assert record is not None
    (change,) = record.containers
    limit, burst = _settings(patched)
    assert limit == change.after.cpu_limit > 500 and change.before.cpu_limit == 500
    assert (burst is None) == (change.after.burst_us == 0)
    assert record.verdict is None
    assert world.limit_patches() == (1 if lost else 0)
    # 4. the third operator resumes the cycle from the record: in verification, no new patch
    world.proxy.clear_requests()
    with world.operator(log) as third:
        status = _wait(lambda: next((w for w in world.status().get("workloads", [])
                                     if w["state"] == "Verifying"
                                     and "rolling out" in (w["message"] or "")), None),
                       "Verifying", third)  # fmt: skip
        assert status["deployment"] == "checkout"
        time.sleep(2)
        assert world.limit_patches() == 0
        # the rollout completes: the resumed cycle goes on (the rollout is noted in the record)
        world.let_pods_run()
        world.kube.rolled_out(world.namespace, "checkout")
        world.kube.patch(POLICIES, world.namespace, "web", {"spec": {"headroom": 0.11}})
        noted = _wait(lambda: (_record(world.deployment()) or record).rollout_done_at,
                      "the rollout noted", third)  # fmt: skip
        assert noted > record.at
    final = world.deployment()
    assert _settings(final) == (limit, burst)
    assert world.limit_patches() == 0
