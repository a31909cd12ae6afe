"""Apply mode, one reconcile at a time on a clock the test moves: patches, verification on
the new pods' counters, rollback, and the safety rules.

The real control plane (tests/kube.py): the reconciler patches Deployments on the real
kube-apiserver through a recording proxy (tests/kube_faults.py), and the real Deployment
controller rolls them out onto kwok's fake nodes. A real Prometheus serves the history:
before the patch, the pods of each Deployment's ReplicaSet; after the rollout, the pods of
the ReplicaSet the controller made for the patched template, better or worse. That
ReplicaSet's name is known only once it exists, so its history is added then: Prometheus
reads backfilled blocks when it starts, and is restarted on its port with the new ones."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name
from prom import PrometheusServer, requires_prometheus
from realistic import NON_ASCII, URL
from realistic import deployment as realistic_deployment
from support.apply import (  # noqa: F401 (autouse fixtures; its tests)
    BETTER,
    DEPLOYMENTS,
    HELPED,
    HURT,
    NOW,
    REAL_APP,
    REAL_SIDECAR,
    ROOT,
    T0,
    VPAS,
    World,
    _hash,
    _limit,
    _limits,
    _record,
    _state,
    _without,
    running,
    shop_world,
    test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds,
    test_a_regression_after_verification_is_rolled_back_to_the_recorded_values,
    test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch,
)
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.patching import RECORD_ANNOTATION
from unthrottle.operator.gates import rollout
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture
def world(tmp_path: Path, control_plane: ControlPlane,
          throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    with shop_world(tmp_path, control_plane, PrometheusServer) as world:
        yield world


@pytest.fixture
def real_world(tmp_path: Path, control_plane: ControlPlane,
               throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    """The realistic ``checkout`` (app, sidecar, init container) in a fresh namespace."""
    kube = Kube(control_plane)
    namespace = fresh_name("real")
    kube.create_namespace(namespace)
    kube.create(DEPLOYMENTS, realistic_deployment(
        namespace, "checkout", labels={"app.kubernetes.io/part-of": "r"}))  # fmt: skip
    rs = kube.replicaset_of(kube.rolled_out(namespace, "checkout"))
    placed = [replace(w, namespace=namespace,
                      template_hash=rs["metadata"]["labels"]["pod-template-hash"])
              for w in (REAL_APP, REAL_SIDECAR)]  # fmt: skip
    with running(tmp_path, kube, placed, namespace, PrometheusServer) as world:
        yield world


@pytest.fixture(scope="session")
def vpa_crd(control_plane: ControlPlane) -> None:
    """The VerticalPodAutoscaler CRD (tests/crds/), applied with kubectl and Established."""
    control_plane.install_crds(ROOT / "crds" / "verticalpodautoscaler.yaml")


def test_apply_patches_exactly_the_intended_fields_and_records_what_was_there(
    world: World,
) -> None:
    before = world.deployment("better")
    world.policy("a", "a")
    status = world.reconcile("a")
    assert _state(status, "better")[0] == "Verifying"
    after = world.deployment("better")
    assert _limit(after) > 500
    record = _record(after)
    (change,) = record.containers
    assert (change.before.cpu_limit, change.after.cpu_limit) == (500, _limit(after))
    assert change.ratio_before == pytest.approx(BETTER.throttled_share(), abs=0.02)
    assert record.policy == "a" and record.verdict is None
    burst = after["spec"]["template"]["metadata"].get("annotations", {}).get(
        "unthrottle.io/cpu-burst")  # fmt: skip
    assert (burst is None) == (change.after.burst_us == 0)
    # nothing else changed: other fields, the request, env and labels are as they were
    # (the status is the Deployment controller's, managedFields the server's bookkeeping)
    changed = [
        ("metadata", "annotations"),
        ("metadata", "resourceVersion"),
        ("metadata", "generation"),
        ("metadata", "managedFields"),
        ("status",),
        ("spec", "template", "metadata", "annotations"),
        ("spec", "template", "spec", "containers", "0", "resources", "limits"),
    ]
    assert _without(after, *changed) == _without(before, *changed)
    added = set(after["metadata"]["annotations"]) - set(before["metadata"].get("annotations", {}))
    assert added == {RECORD_ANNOTATION}
    assert (
        after["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        == (before["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"])
    )
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    # one JSON Patch, with tests, and an event in words
    (patch,) = world.proxy.requests("PATCH", "/deployments/better$")
    assert patch.content_type.startswith("application/json-patch+json")
    assert any(op["op"] == "test" and op["path"].endswith("/name") for op in patch.body)
    (event,) = [e for e in world.events("better") if e["reason"] == "Applied"]
    assert event["message"].startswith("raised CPU limit of app 500m → ")
    assert "policy a: 10 % of periods throttled" in event["message"]
    # the other namespace is never touched
    assert world.proxy.requests("PATCH", f"/namespaces/{world.elsewhere}/") == []


def test_a_burst_the_new_pods_never_used_is_named_in_the_verdict(world: World) -> None:
    """cAdvisor's burst counters (#3795) after the change: zero, the burst was not needed."""
    world.policy("a", "a")
    world.reconcile("a")
    (change,) = _record(world.deployment("better")).containers
    assert change.after.burst_us > 0  # Auto gives better's rare peaks a burst
    world.roll_out("better", **HELPED)
    lines = [f'container_cpu_cfs_burst_{kind}_total{{namespace="{w.namespace}",pod="{pod}",'
             f'container="{w.container}"}} 0 {t}'
             for w in world.containers["better"] for pod in w.pod_names()
             for kind in ("periods", "seconds") for t in range(T0 + 120, NOW + 1, 60)]  # fmt: skip
    world.add_history("\n".join(lines) + "\n")
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("a"), "better")[1]
    world.clock.now = T0 + 25 * 60  # verifyFor (15m) after the rollout was seen done
    state, _ = _state(world.reconcile("a"), "better")
    record = _record(world.deployment("better"))
    assert state == "Applied" and record.verdict == "Applied"
    assert record.verdict_reason is not None
    assert "the burst was never used (app " in record.verdict_reason, record.verdict_reason


def test_a_pod_replaced_during_the_reconcile_does_not_hold_the_rollback_back(
    world: World,
) -> None:
    # The Deployment controller writes the status whenever a pod comes or goes, and every
    # write moves the resourceVersion that guards unthrottle's patches. A pod replaced
    # between the reconcile's read of the Deployments and its verdict (the metrics queries
    # lie between) changes nothing of the Deployment's own: the rollback happens then.
    class PodReplacedMeanwhile(KubeDeployments):
        def vpas(self, namespace: str) -> list[dict[str, Any]] | None:
            found = world.deployment("worse")
            (pod, *_) = world.kube.pods_of(world.kube.replicaset_of(found))
            world.kube.delete("v1/pods", world.stage, pod["metadata"]["name"])
            world.kube.until("the controller's status write", lambda: world.deployment("worse"),
                             lambda d: d["metadata"]["resourceVersion"] != (
                                 found["metadata"]["resourceVersion"]))  # fmt: skip
            return super().vpas(namespace)

    original = world.deployment("worse")
    world.policy("b", "b")
    world.reconcile("b")
    world.roll_out("worse", **HURT)
    world.clock.now = T0 + 300
    world.reconcile("b")
    world.kube.rolled_out(world.stage, "worse")  # the record's rewrite seen by the controller
    assert world.reconciler.applier is not None
    world.reconciler.applier.deployments = PodReplacedMeanwhile(world.api)
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("b"), "worse")
    assert state == "RolledBack", message
    assert world.deployment("worse")["spec"]["template"] == original["spec"]["template"]


def test_a_failed_rollout_is_rolled_back(world: World) -> None:
    # The namespace caps each container's CPU limit at 500m (a LimitRange), with a progress
    # deadline of 2 s: the API server takes the patched template (a LimitRange checks pods,
    # not templates), the new ReplicaSet's pods are refused at admission, and the rollout
    # ends in ProgressDeadlineExceeded while the old pods keep serving.
    world.kube.create("v1/limitranges", {
        "apiVersion": "v1", "kind": "LimitRange",
        "metadata": {"namespace": world.stage, "name": "cpu-cap"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "500m"}}]},
    })  # fmt: skip
    world.edit("fails", {"spec": {"progressDeadlineSeconds": 2}})
    original = world.deployment("fails")
    first = world.kube.replicaset_of(original)
    serving = {p["metadata"]["uid"] for p in world.kube.pods_of(first)}
    world.policy("c", "c")
    world.reconcile("c")
    assert _limit(world.deployment("fails")) > 500
    world.kube.until("ProgressDeadlineExceeded", lambda: world.deployment("fails"),
                     lambda d: rollout(d) == "failed")  # fmt: skip
    world.clock.now = T0 + 600
    state, message = _state(world.reconcile("c"), "fails")
    assert state == "RolledBack" and "rollout failed" in message
    assert world.deployment("fails")["spec"]["template"] == original["spec"]["template"]
    # the original pods served throughout, and the Deployment is whole again
    rs = world.kube.replicaset_of(world.kube.rolled_out(world.stage, "fails"))
    assert rs["metadata"]["uid"] == first["metadata"]["uid"]
    assert {p["metadata"]["uid"] for p in world.kube.pods_of(rs)} == serving


def test_at_most_max_concurrent_deployments_change_at_once(world: World) -> None:
    for name in ("worse", "fails"):  # three throttled Deployments under one policy
        world.edit(name, {"metadata": {"labels": {"app.kubernetes.io/part-of": "a"}}})
    world.policy("a", "a", apply={"maxConcurrent": 2})
    status = world.reconcile("a")
    states = sorted(_state(status, d)[0] for d in ("better", "worse", "fails"))
    assert states == ["Recommended", "Verifying", "Verifying"]
    waiting = next(w for w in status["workloads"] if w["state"] == "Recommended")
    assert "apply.maxConcurrent 2" in waiting["message"]
    assert len(world.proxy.requests("PATCH", "/deployments/")) == 2


def test_the_step_limit_holds_for_every_patch(world: World) -> None:
    world.policy("a", "a", limits={"maxStepUp": 1.2})
    world.reconcile("a")
    assert 500 < _limit(world.deployment("better")) <= 600


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"spec": {"paused": True}}, "paused"),
        ({"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": "shop:apps/x"}}},
         "Argo CD"),
        ({"metadata": {"labels": {"kustomize.toolkit.fluxcd.io/name": "apps"}}}, "Flux"),
        ({"metadata": {"annotations": {"unthrottle.io/ignore": "true"}}}, "opted out"),
    ],
    ids=["paused", "argo-cd", "flux", "opt-out"],
)  # fmt: skip
def test_deployments_apply_must_leave_alone_are_skipped_with_a_reason(
    world: World, change: dict[str, Any], reason: str
) -> None:
    world.edit("better", change)
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Skipped" and reason in message
    assert world.proxy.requests("PATCH", "/deployments/") == []


def test_a_deployment_whose_limits_a_vpa_controls_is_skipped(world: World, vpa_crd: None) -> None:
    world.kube.create(VPAS, {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"namespace": world.stage, "name": "better-vpa"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "better"},
                 "updatePolicy": {"updateMode": "Auto"}},
    })  # fmt: skip
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Skipped" and "better-vpa" in message
    assert world.proxy.requests("PATCH", "/deployments/") == []


def test_a_vpa_that_sets_requests_only_leaves_the_limits_to_apply(
    world: World, vpa_crd: None
) -> None:
    world.kube.create(VPAS, {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"namespace": world.stage, "name": "better-vpa"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "better"},
                 "updatePolicy": {"updateMode": "Auto"},
                 "resourcePolicy": {"containerPolicies": [
                     {"containerName": "*", "controlledValues": "RequestsOnly"}]}},
    })  # fmt: skip
    world.policy("a", "a")
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"


def test_gitops_patch_overrides_the_gitops_skip(world: World) -> None:
    world.edit("better", {"metadata": {"labels": {"helm.toolkit.fluxcd.io/name": "shop"}}})
    world.policy("a", "a", apply={"gitOps": "Patch"})
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"


def test_a_deployment_changed_between_read_and_patch_is_not_overwritten(world: World) -> None:
    class ChangedMeanwhile(KubeDeployments):
        """Another writer edits the Deployment right after it was read."""

        def get(self, namespace: str, name: str) -> dict[str, Any] | None:
            found = super().get(namespace, name)
            assert found is not None
            world.edit(name, [{"op": "replace", "path": "/spec/template/spec/containers/0/image",
                               "value": "registry.example/shop:2"}], json_patch=True)  # fmt: skip
            return found

    assert world.reconciler.applier is not None
    world.reconciler.applier.deployments = ChangedMeanwhile(world.api)
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Recommended" and "changed since it was read" in message
    now = world.deployment("better")
    assert now["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/shop:2"
    assert _limit(now) == 500 and RECORD_ANNOTATION not in now["metadata"].get("annotations", {})


@pytest.mark.parametrize(
    ("status", "says"),
    [(409, "changed since it was read"), (500, "the patch failed (HTTP 500")],
    ids=["a-storm-of-conflicts", "a-run-of-server-errors"],
)
def test_refused_patches_are_retried_each_cycle_and_the_change_lands_once(
    world: World, status: int, says: str
) -> None:
    world.policy("a", "a")
    world.proxy.fail_next("PATCH", "/deployments/better$", status, count=3)
    for minute in range(3):
        world.clock.now = T0 + 60 * minute
        state, message = _state(world.reconcile("a"), "better")
        assert state == "Recommended" and says in message, message
        now = world.deployment("better")  # nothing written, not even half
        assert _limit(now) == 500 and RECORD_ANNOTATION not in now["metadata"]["annotations"]
    world.clock.now = T0 + 180
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"
    patched = world.deployment("better")
    assert _record(patched).containers[0].after.cpu_limit == _limit(patched) > 500
    assert len(world.proxy.requests("PATCH", "/deployments/better$")) == 4
    assert len([e for e in world.events("better") if e["reason"] == "Applied"]) == 1


def test_a_dry_run_sends_the_patch_with_dry_run_and_changes_nothing(world: World) -> None:
    before = world.deployment("better")
    world.policy("a", "a", apply={"dryRun": True})
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Recommended" and message.startswith("dry run")
    (patch,) = world.proxy.requests("PATCH", "/deployments/better$")
    assert patch.params.get("dryRun") == "All"
    assert world.deployment("better") == before
    assert any(e["reason"] == "DryRun" for e in world.events("better"))


def test_gomaxprocs_set_by_hand_is_kept_and_ours_is_set(world: World) -> None:
    for name, env in (("better", [{"name": "GOMAXPROCS", "value": "7"}]),
                      ("worse", [{"name": "GOGC", "value": "100"}])):  # fmt: skip
        world.edit(name, {"metadata": {"labels": {"app.kubernetes.io/part-of": "go"}}})
        world.edit(name, [{"op": "add", "path": "/spec/template/spec/containers/0/env",
                           "value": env}], json_patch=True)  # fmt: skip
    world.policy("go", "go", apply={"maxConcurrent": 2})
    world.reconcile("go")
    by_hand = world.deployment("better")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert by_hand == [{"name": "GOMAXPROCS", "value": "7"}]
    ours = world.deployment("worse")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert ours[0] == {"name": "GOGC", "value": "100"}
    assert ours[1]["name"] == "GOMAXPROCS" and int(ours[1]["value"]) >= 1


def test_a_koordinator_burst_annotation_is_updated_not_doubled(world: World) -> None:
    world.edit("better", [{"op": "add", "path": "/spec/template/metadata/annotations",
                           "value": {"koordinator.sh/cpuBurst": json.dumps({"policy": "none"})}}],
               json_patch=True)  # fmt: skip
    world.policy("a", "a", strategy="BurstPreferred")
    world.reconcile("a")
    annotations = world.deployment("better")["spec"]["template"]["metadata"]["annotations"]
    assert "unthrottle.io/cpu-burst" not in annotations
    assert json.loads(annotations["koordinator.sh/cpuBurst"])["policy"] == "auto"


def test_apply_and_rollback_on_a_deployment_with_a_sidecar_an_init_container_and_shell_text(
    real_world: World,
) -> None:
    world = real_world
    original = world.deployment("checkout")
    first = _hash(world.kube.replicaset_of(original))
    world.policy("r", "r")
    assert _state(world.reconcile("r"), "checkout")[0] == "Verifying"
    patched = world.deployment("checkout")
    # both throttled containers raised in one patch, each found by its name
    limits = _limits(patched)
    assert limits["app"] > 500 and limits["sidecar"] > 100
    record = _record(patched)
    assert {c.name for c in record.containers} == {"app", "sidecar"}
    assert {c.name: c.after.cpu_limit for c in record.containers} == limits
    # what the user wrote is as they wrote it: shell text, URLs, non-ASCII, probes, requests
    template, was = patched["spec"]["template"], original["spec"]["template"]
    assert template["spec"]["initContainers"] == was["spec"]["initContainers"]
    for now, then in zip(template["spec"]["containers"], was["spec"]["containers"], strict=True):
        for key in ("image", "command", "args", "readinessProbe", "livenessProbe"):
            assert now[key] == then[key]
        assert now["resources"]["requests"] == then["resources"]["requests"]
        assert now["env"][: len(then["env"])] == then["env"]  # GOMAXPROCS may follow GOGC
    assert template["spec"]["containers"][0]["env"][0]["value"] == URL
    assert template["metadata"]["annotations"]["note"] == was["metadata"]["annotations"]["note"]
    assert NON_ASCII in patched["metadata"]["annotations"]["owner"]
    # the real controller rolls it out: the new pods run with the new limits
    world.roll_out("checkout", app=HURT["app"], sidecar={"limit": 0.3})
    pods = world.kube.pods_of(world.kube.replicaset_of(world.deployment("checkout")))
    assert len(pods) == 2
    for pod in pods:
        assert {c["name"]: parse_cpu(c["resources"]["limits"]["cpu"])
                for c in pod["spec"]["containers"]} == limits  # fmt: skip
    # the app got worse: the whole change is rolled back, the template byte for byte
    world.clock.now = T0 + 300
    world.reconcile("r")
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("r"), "checkout")
    assert state == "RolledBack" and "app 10 % → " in message
    rolled = world.deployment("checkout")
    assert rolled["spec"]["template"] == original["spec"]["template"]
    assert _record(rolled).verdict == "RolledBack"
    assert _hash(world.kube.replicaset_of(world.kube.rolled_out(world.stage, "checkout"))) == (
        first)  # fmt: skip


def test_a_deployment_scaled_to_zero_is_patched_and_verified_once_it_runs_again(
    world: World,
) -> None:
    # throttled while it ran; scaled to zero since (its pods are gone, its history is not)
    world.edit("better", {"spec": {"replicas": 0}})
    world.policy("a", "a")
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"
    patched = world.deployment("better")
    assert _limit(patched) > 500
    assert rollout(world.kube.rolled_out(world.stage, "better")) == "done"  # no pod to replace
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("a"), "better")[1]
    # no pod ran the new limit: no verdict, and nothing else is done to it
    world.proxy.clear_requests()
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Verifying" and "scaled to zero" in message, message
    assert world.proxy.requests("PATCH", "/deployments/") == []
    assert _record(world.deployment("better")).verdict is None
    # scaled up again (by hand, an autoscaler): its pods' counters give the verdict
    world.edit("better", {"spec": {"replicas": 2}})
    world.roll_out("better", since=T0 + 30 * 60, **HELPED)
    world.clock.now = T0 + 60 * 60
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Applied", message
    assert _limit(world.deployment("better")) == _limit(patched)


def test_two_apply_policies_over_one_deployment_only_the_older_changes_it(
    world: World,
) -> None:
    world.policy("a", "a")
    time.sleep(1.1)  # a later creation time (the API keeps seconds)
    world.policy("later", "a")
    # the newer policy leaves it to the older one, says so, and patches nothing
    status = world.reconcile("later")
    state, message = _state(status, "better")
    assert state == "Skipped" and "older policy a" in message
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Conflict")
    assert world.proxy.requests("PATCH", "/deployments/") == []
    # the older one applies its change; the newer one never touches it, in verification or after
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"
    world.roll_out("better", **HELPED)
    for at in (300, 25 * 60):
        world.clock.now = T0 + at
        world.reconcile("a")
        world.proxy.clear_requests()
        assert _state(world.reconcile("later"), "better")[0] == "Skipped"
        assert world.proxy.requests("PATCH", "/deployments/") == []
    record = _record(world.deployment("better"))
    assert (record.policy, record.verdict) == ("a", "Applied")
    assert len([e for e in world.events("better") if e["reason"] == "Applied"]) == 1
