"""Apply's Rollout for StatefulSets and DaemonSets: patched by their own kind, their rollout
seen done as ``kubectl rollout status`` sees it, verified on the pods of the new revision,
rolled back when worse; OnDelete waits for the team's restarts; InPlace says it covers
Deployments only. On the real control plane (the StatefulSet and DaemonSet controllers
replace kwok's pods) with a real Prometheus, on the test's clock (tests/support/apply.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from kube import Kube
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deploy, openmetrics, own_pods
from support.apply import NOW, T0, World, running
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


def _part(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": name}


DB = Workload("kinds", "db", 0.1, 0.10, 1.2, 0.5, 2, _part("db"), kind="StatefulSet")
LOGS = Workload("kinds", "logs", 0.1, 0.10, 1.2, 0.5, 1, _part("logs"), kind="DaemonSet")
SHARDS = Workload("kinds", "shards", 0.1, 0.10, 1.2, 0.5, 3, _part("shards"), kind="StatefulSet")
"""Three replicas under partition 2: a rollout updates shards-2 alone."""
QUEUE = Workload("kinds", "queue", 0.1, 0.10, 1.2, 0.5, 2, _part("queue"), kind="StatefulSet")
"""updateStrategy OnDelete: its pods take a new template only when deleted."""
AGENT = Workload("kinds", "agent", 0.1, 0.10, 1.2, 0.5, 1, _part("agent"), kind="DaemonSet")
HELPED = {"limit": 1.3}
HURT = {"share": 0.4, "limit": 0.66}
STRATEGIES = {"shards": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
              "queue": {"type": "OnDelete", "rollingUpdate": None}}  # fmt: skip


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[World]:  # fmt: skip
    kube = Kube(control_plane)
    placed = deploy(kube, [DB, LOGS, SHARDS, QUEUE, AGENT])
    namespace = placed[0].namespace
    for name, strategy in STRATEGIES.items():
        kube.patch("apps/v1/statefulsets", namespace, name, {"spec": {"updateStrategy": strategy}})
    with running(tmp_path_factory.mktemp("apply-kinds"), kube, placed, namespace,
                 PrometheusServer) as world:  # fmt: skip
        yield world


def _resource(w: Workload) -> str:
    return f"apps/v1/{w.kind.lower()}s"


def _obj(world: World, w: Workload) -> dict[str, Any]:
    found = world.kube.get(_resource(w), world.stage, w.name)
    assert found is not None
    return {"kind": w.kind, **found}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


def _limit(obj: dict[str, Any]) -> int:
    return parse_cpu(obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])


def _state(status: dict[str, Any], w: Workload) -> tuple[str, str]:
    found = next(x for x in status["workloads"] if (x["kind"], x["name"]) == (w.kind, w.name))
    return found["state"], found["message"]


def _rolled(world: World, w: Workload, **changes: Any) -> Workload:
    """``w`` once its controller rolled the change out, with the new pods' history from
    T0 + 120 s on (their demand changed by ``changes``)."""
    now = replace(w, namespace=world.stage, names=own_pods(world.kube, replace(
        w, namespace=world.stage)), **changes)  # fmt: skip
    world.add_history(openmetrics([now], NOW, span=NOW - (T0 + 120)))
    return now


def test_rollout_changes_a_statefulset_and_a_daemonset_keeps_the_better_and_rolls_back_the_worse(
    world: World,
) -> None:
    before = {w.name: _obj(world, w) for w in (DB, LOGS)}
    world.policy("rollout", "db", kinds=["StatefulSet"])
    world.policy("rollout-ds", "logs", kinds=["DaemonSet"])
    for policy, w in (("rollout", DB), ("rollout-ds", LOGS)):
        state, message = _state(world.reconcile(policy), w)
        assert state == "Verifying" and "waiting for the rollout" in message, message
        patched = _obj(world, w)
        assert _limit(patched) > 500
        record = Record.from_annotation(patched["metadata"]["annotations"][RECORD_ANNOTATION])
        assert record.containers[0].before.cpu_limit == 500
        (event,) = [e for e in world.events(w.name) if e["reason"] == "Applied"]
        assert event["involvedObject"]["kind"] == w.kind
    _rolled(world, DB, **HELPED)
    _rolled(world, LOGS, **HURT)
    world.clock.now = T0 + 300  # the rollouts seen done: verification starts
    for policy, w in (("rollout", DB), ("rollout-ds", LOGS)):
        assert "verifying until" in _state(world.reconcile(policy), w)[1]
    world.clock.now = T0 + 25 * 60  # verifyFor (15m) later
    state, message = _state(world.reconcile("rollout"), DB)
    assert state == "Applied" and "of periods throttled" in message, message
    state, message = _state(world.reconcile("rollout-ds"), LOGS)
    assert state == "RolledBack" and "got worse" in message, message
    back = _obj(world, LOGS)
    assert back["spec"]["template"] == before["logs"]["spec"]["template"]  # byte for byte
    assert _limit(_obj(world, DB)) > 500  # kept


def test_a_partitioned_statefulset_is_judged_on_the_pods_of_its_new_revision(
    world: World,
) -> None:
    world.policy("partition", "shards", kinds=["StatefulSet"])
    world.reconcile("partition")
    obj = world.kube.until("shards-2 updated", lambda: _obj(world, SHARDS),
                           lambda o: _status(o).get("updatedReplicas") == 1)  # fmt: skip
    assert (obj["status"].get("currentReplicas"), obj["spec"]["replicas"]) == (2, 3)
    # the new revision's pod (shards-2) is not throttled any more; the two the partition
    # keeps on the old template are throttled three times as often as before: read
    # together, the change would look worse
    pods = own_pods(world.kube, replace(SHARDS, namespace=world.stage))
    new = replace(SHARDS, namespace=world.stage, names=(pods[2],), limit=1.3)
    old = replace(SHARDS, namespace=world.stage, names=pods[:2], share=0.3)
    world.add_history(openmetrics([new, old], NOW, span=NOW - (T0 + 120)))
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("partition"), SHARDS)[1]
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("partition"), SHARDS)
    assert state == "Applied", message
    record = Record.from_annotation(
        _obj(world, SHARDS)["metadata"]["annotations"][RECORD_ANNOTATION])  # fmt: skip
    assert record.ratio_after["app"] is not None and record.ratio_after["app"] < 0.02


def test_on_delete_the_change_waits_for_the_teams_restarts(world: World) -> None:
    world.policy("on-delete", "queue", kinds=["StatefulSet"])
    state, message = _state(world.reconcile("on-delete"), QUEUE)
    assert state == "Verifying" and "OnDelete" in message, message
    world.clock.now = T0 + 60
    state, message = _state(world.reconcile("on-delete"), QUEUE)
    assert state == "Verifying" and "0 of 2 pods have it" in message, message
    for pod in ("queue-0", "queue-1"):  # the team's restarts (no rollout is done before)
        world.kube.delete("v1/pods", world.stage, pod)
    world.kube.until("queue's pods at the new revision", lambda: _obj(world, QUEUE),
                     lambda o: _status(o).get("updatedReplicas") == 2)  # fmt: skip
    _rolled(world, QUEUE, **HELPED)
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("on-delete"), QUEUE)[1]


def test_in_place_sends_a_daemonsets_canary_of_its_current_revision_first(
    world: World,
) -> None:
    """kwok's nodes do not support in-place resize, and the API server says so for the
    canary's resize (the real kubelet's part: tests/cluster/test_inplace_kinds_real_node.py):
    what this shows is whom InPlace picks, the pods of the DaemonSet's current revision
    (its newest ControllerRevision), the canary alone first, and the template untouched."""
    before = _obj(world, AGENT)
    pods = {p["metadata"]["name"]: p for p in world.kube.list("v1/pods", world.stage)
            if p["metadata"]["name"].startswith("agent-")}  # fmt: skip
    (revision,) = {p["metadata"]["labels"]["controller-revision-hash"] for p in pods.values()}
    world.policy("agent-in-place", "agent", kinds=["DaemonSet"], apply={"method": "InPlace"})
    state, message = _state(world.reconcile("agent-in-place"), AGENT)
    assert state == "RolledBack" and "without support for resize" in message, message
    record = Record.from_annotation(_obj(world, AGENT)["metadata"]["annotations"][
        RECORD_ANNOTATION])  # fmt: skip
    assert record.in_place and record.replicaset == revision  # its pods' revision
    assert record.canary in pods
    (resize,) = world.proxy.requests("PATCH", "/resize$")  # the canary alone
    assert resize.path.endswith(f"/pods/{record.canary}/resize")
    assert _obj(world, AGENT)["spec"]["template"] == before["spec"]["template"]  # no rollout
