"""Apply mode, one reconcile at a time on a clock the test moves: patches, verification on
the new pods' counters, rollback, and the safety rules. The Kubernetes emulator over HTTP
stands in for the API server (and the test for the Deployment controller); a real
Prometheus serves history in which the series go on after the patch, better or worse."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube_emulator import KubeEmulator
from prom import PrometheusServer, requires_prometheus
from shop import Workload, objects, openmetrics
from unthrottle.cfs.settings import parse_cpu
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings

pytestmark = requires_prometheus
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
HOUR = 3600
NOW = int(time.time()) // 60 * 60
T0 = NOW - 3 * HOUR
"""When the policy first reconciles (the test's clock): history before, series after."""

# Deployments in "stage", each throttled 10 % of periods under 500m before T0
BETTER = Workload("stage", "better", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "a"})
WORSE = Workload("stage", "worse", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "b"})
FAILS = Workload("stage", "fails", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "c"})
OTHER_NS = Workload(
    "elsewhere", "better", 0.1, 0.10, 1.2, 0.5, 1, {"app.kubernetes.io/part-of": "a"}
)
BEFORE = [BETTER, WORSE, FAILS, OTHER_NS]
# after the rollout (new ReplicaSets): better is not throttled any more, worse is more
AFTER = [replace(BETTER, template_hash="9f8e7d", limit=1.3),
         replace(WORSE, template_hash="9f8e7d", share=0.4, limit=0.66)]  # fmt: skip


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, kube: KubeEmulator, prom: PrometheusServer, api: Any) -> None:
        self.kube, self.prom, self.api = kube, prom, api
        self.clock = Clock(T0)
        self.source = PrometheusSource(PrometheusConfig(prom.url, retries=0))
        from kubernetes import client

        self.reconciler = Reconciler(
            OperatorSettings(self.source.config), metrics=self.source,
            workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
            objects=KubeObjects(api), deployments=KubeDeployments(api), clock=self.clock,
        )  # fmt: skip

    def policy(self, name: str, part_of: str, **spec: Any) -> None:
        spec = {"mode": "Apply", "window": "2h",
                "selector": {"matchLabels": {"app.kubernetes.io/part-of": part_of}},
                "apply": {"verifyFor": "15m", "cooldown": "30m", **spec.pop("apply", {})},
                **spec}  # fmt: skip
        self.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                    "kind": "ThrottlePolicy",
                                    "metadata": {"namespace": "stage", "name": name},
                                    "spec": spec})  # fmt: skip

    def reconcile(self, name: str) -> dict[str, Any]:
        body = self.kube.get(POLICIES, "stage", name)
        assert body is not None
        outcome = self.reconciler.reconcile(body)
        assert outcome.fault is None, self.status(name)
        return self.status(name)

    def status(self, name: str) -> dict[str, Any]:
        return (self.kube.get(POLICIES, "stage", name) or {}).get("status") or {}

    def deployment(self, name: str, namespace: str = "stage") -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, namespace, name)
        assert found is not None
        return found

    def roll_out(self, before: Workload, after: Workload | None) -> None:
        """Play the Deployment controller: the new ReplicaSet's pods replace the old ones."""
        if after is not None:
            for pod in before.pod_names():
                self.kube.delete("v1/pods", before.namespace, pod, force=True)
            for resource, obj in objects(after):
                if resource != DEPLOYMENTS:
                    self.kube.put(resource, obj)
        self.kube.complete_rollout(before.namespace, before.name)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1/events", "stage")
                if e.get("involvedObject", {}).get("name") == name]  # fmt: skip


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    history = openmetrics(BEFORE, T0, span=2 * HOUR) + "".join(
        openmetrics([w], NOW, span=NOW - T0 - 120) for w in AFTER)  # fmt: skip
    with KubeEmulator(vpa=True) as kube, PrometheusServer(tmp_path, openmetrics=history) as prom:
        for w in BEFORE:
            for resource, obj in objects(w):
                kube.put(resource, obj)
            kube.complete_rollout(w.namespace, w.name)
        yield World(kube, prom, kube.api_client(kube.kubeconfig(tmp_path / "kubeconfig")))


def _state(status: dict[str, Any], deployment: str) -> tuple[str, str]:
    w = next(w for w in status["workloads"] if w["deployment"] == deployment)
    return w["state"], w["message"] or ""


def _limit(deployment: dict[str, Any]) -> int:
    cpu = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    return parse_cpu(cpu)


def _without(d: dict[str, Any], *paths: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(d)
    for path in paths:
        node = out
        for part in path[:-1]:
            node = node[part] if not isinstance(node, list) else node[int(part)]
        node.pop(path[-1], None)
    return out


def test_apply_patches_exactly_the_intended_fields_and_records_what_was_there(
    world: World,
) -> None:
    before = world.deployment("better")
    world.policy("a", "a")
    status = world.reconcile("a")
    assert _state(status, "better")[0] == "Verifying"
    after = world.deployment("better")
    assert _limit(after) > 500
    record = Record.from_annotation(after["metadata"]["annotations"][RECORD_ANNOTATION])
    (change,) = record.containers
    assert (change.before.cpu_limit, change.after.cpu_limit) == (500, _limit(after))
    assert change.ratio_before == pytest.approx(BETTER.throttled_share(), abs=0.02)
    assert record.policy == "a" and record.verdict is None
    burst = after["spec"]["template"]["metadata"].get("annotations", {}).get(
        "unthrottle.io/cpu-burst")  # fmt: skip
    assert (burst is None) == (change.after.burst_us == 0)
    # nothing else changed: other fields, the request, env and labels are as they were
    changed = [
        ("metadata", "annotations"),
        ("metadata", "resourceVersion"),
        ("metadata", "generation"),
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
    (patch,) = world.kube.requests("PATCH", "/deployments/better$")
    assert patch.content_type.startswith("application/json-patch+json")
    assert any(op["op"] == "test" and op["path"].endswith("/name") for op in patch.body)
    (event,) = [e for e in world.events("better") if e["reason"] == "Applied"]
    assert event["message"].startswith("raised CPU limit of app 500m → ")
    assert "policy a: 10 % of periods throttled" in event["message"]
    # the other namespace is never touched
    assert world.kube.requests("PATCH", "/namespaces/elsewhere/") == []


def test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds(
    world: World,
) -> None:
    world.policy("a", "a")
    world.reconcile("a")
    patched = _limit(world.deployment("better"))
    world.roll_out(BETTER, AFTER[0])
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("a"), "better")[1]
    world.clock.now = T0 + 25 * 60  # verifyFor (15m) after the rollout was seen done
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Applied" and re.search(r"app 10 % → [01] % of periods throttled", message)
    record = Record.from_annotation(world.deployment("better")["metadata"]["annotations"][
        RECORD_ANNOTATION])  # fmt: skip
    assert record.verdict == "Applied" and record.ratio_after["app"] < 0.02
    # within the cooldown nothing is patched again, whatever is recommended
    world.kube.clear_requests()
    world.clock.now = T0 + 28 * 60
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Applied" and "cooldown until" in message
    assert world.kube.requests("PATCH", "/deployments/") == []
    assert _limit(world.deployment("better")) == patched


def test_a_regression_after_verification_is_rolled_back_to_the_recorded_values(
    world: World,
) -> None:
    original = world.deployment("worse")
    world.policy("b", "b")
    world.reconcile("b")
    assert _limit(world.deployment("worse")) > 500
    world.roll_out(WORSE, AFTER[1])
    world.clock.now = T0 + 300
    world.reconcile("b")
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("b"), "worse")
    assert state == "RolledBack" and "got worse" in message
    rolled = world.deployment("worse")
    assert _limit(rolled) == 500
    assert rolled["spec"]["template"] == original["spec"]["template"]  # byte for byte
    record = Record.from_annotation(rolled["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record.verdict == "RolledBack"
    assert any(
        e["reason"] == "RolledBack" and e["type"] == "Warning" for e in world.events("worse")
    )
    # not tried again until the policy or the Deployment changes
    world.kube.clear_requests()
    world.clock.now = T0 + 90 * 60
    assert _state(world.reconcile("b"), "worse")[0] == "RolledBack"
    assert world.kube.requests("PATCH", "/deployments/") == []


def test_a_failed_rollout_is_rolled_back(world: World) -> None:
    original = world.deployment("fails")
    world.policy("c", "c")
    world.reconcile("c")
    world.kube.fail_rollout("stage", "fails")
    world.clock.now = T0 + 600
    state, message = _state(world.reconcile("c"), "fails")
    assert state == "RolledBack" and "rollout failed" in message
    assert world.deployment("fails")["spec"]["template"] == original["spec"]["template"]


def test_at_most_max_concurrent_deployments_change_at_once(world: World) -> None:
    for w in (WORSE, FAILS):  # three throttled Deployments under one policy
        world.kube.patch(DEPLOYMENTS, "stage", w.name,
                         {"metadata": {"labels": {"app.kubernetes.io/part-of": "a"}}})  # fmt: skip
    world.policy("a", "a", apply={"maxConcurrent": 2})
    status = world.reconcile("a")
    states = sorted(_state(status, d)[0] for d in ("better", "worse", "fails"))
    assert states == ["Recommended", "Verifying", "Verifying"]
    waiting = next(w for w in status["workloads"] if w["state"] == "Recommended")
    assert "apply.maxConcurrent 2" in waiting["message"]
    assert len(world.kube.requests("PATCH", "/deployments/")) == 2


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
    world.kube.patch(DEPLOYMENTS, "stage", "better", change)
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Skipped" and reason in message
    assert world.kube.requests("PATCH", "/deployments/") == []


def test_a_deployment_whose_limits_a_vpa_controls_is_skipped(world: World) -> None:
    world.kube.put("autoscaling.k8s.io/v1/verticalpodautoscalers", {
        "apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
        "metadata": {"namespace": "stage", "name": "better-vpa"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "better"},
                 "updatePolicy": {"updateMode": "Auto"}},
    })  # fmt: skip
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Skipped" and "better-vpa" in message
    assert world.kube.requests("PATCH", "/deployments/") == []


def test_gitops_patch_overrides_the_gitops_skip(world: World) -> None:
    world.kube.patch(DEPLOYMENTS, "stage", "better",
                     {"metadata": {"labels": {"helm.toolkit.fluxcd.io/name": "shop"}}})  # fmt: skip
    world.policy("a", "a", apply={"gitOps": "Patch"})
    assert _state(world.reconcile("a"), "better")[0] == "Verifying"


def test_a_deployment_changed_between_read_and_patch_is_not_overwritten(world: World) -> None:
    class ChangedMeanwhile(KubeDeployments):
        """Another writer edits the Deployment right after it was read."""

        def get(self, namespace: str, name: str) -> dict[str, Any] | None:
            found = super().get(namespace, name)
            assert found is not None
            edited = copy.deepcopy(found)
            edited["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/shop:2"
            world.kube.put(DEPLOYMENTS, edited)
            return found

    assert world.reconciler.applier is not None
    world.reconciler.applier.deployments = ChangedMeanwhile(world.api)
    world.policy("a", "a")
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Recommended" and "changed since it was read" in message
    now = world.deployment("better")
    assert now["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/shop:2"
    assert _limit(now) == 500 and RECORD_ANNOTATION not in now["metadata"].get("annotations", {})


def test_a_dry_run_sends_the_patch_with_dry_run_and_changes_nothing(world: World) -> None:
    before = world.deployment("better")
    world.policy("a", "a", apply={"dryRun": True})
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Recommended" and message.startswith("dry run")
    (patch,) = world.kube.requests("PATCH", "/deployments/better$")
    assert patch.query.get("dryRun") == "All"
    assert world.deployment("better") == before
    assert any(e["reason"] == "DryRun" for e in world.events("better"))


def test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch(world: World) -> None:
    world.policy("b", "b")
    world.reconcile("b")
    world.roll_out(WORSE, AFTER[1])
    world.clock.now = T0 + 300
    world.reconcile("b")
    patched = world.deployment("worse")
    world.prom.__exit__(None, None, None)
    world.clock.now = T0 + 25 * 60
    body = world.kube.get(POLICIES, "stage", "b")
    assert body is not None
    world.kube.clear_requests()
    assert world.reconciler.reconcile(body).fault == "PrometheusUnavailable"
    assert world.kube.requests("PATCH", "/deployments/") == []
    assert world.deployment("worse") == patched  # no verdict, no rollback
    record = Record.from_annotation(patched["metadata"]["annotations"][RECORD_ANNOTATION])
    assert record.verdict is None
    port = world.prom.port
    world.prom.port, world.prom.url = port, f"http://127.0.0.1:{port}"
    world.prom.__enter__()
    assert _state(world.reconcile("b"), "worse")[0] == "RolledBack"  # back: the verdict


def test_gomaxprocs_set_by_hand_is_kept_and_ours_is_set(world: World) -> None:
    for w, env in ((BETTER, [{"name": "GOMAXPROCS", "value": "7"}]),
                   (WORSE, [{"name": "GOGC", "value": "100"}])):  # fmt: skip
        deploy = world.deployment(w.name)
        deploy["metadata"]["labels"]["app.kubernetes.io/part-of"] = "go"
        deploy["spec"]["template"]["spec"]["containers"][0]["env"] = env
        world.kube.put(DEPLOYMENTS, deploy)
    world.policy("go", "go", apply={"maxConcurrent": 2})
    world.reconcile("go")
    by_hand = world.deployment("better")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert by_hand == [{"name": "GOMAXPROCS", "value": "7"}]
    ours = world.deployment("worse")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert ours[0] == {"name": "GOGC", "value": "100"}
    assert ours[1]["name"] == "GOMAXPROCS" and int(ours[1]["value"]) >= 1


def test_a_koordinator_burst_annotation_is_updated_not_doubled(world: World) -> None:
    deploy = world.deployment("better")
    deploy["spec"]["template"]["metadata"]["annotations"] = {
        "koordinator.sh/cpuBurst": json.dumps({"policy": "none"})}  # fmt: skip
    world.kube.put(DEPLOYMENTS, deploy)
    world.policy("a", "a", strategy="BurstPreferred")
    world.reconcile("a")
    annotations = world.deployment("better")["spec"]["template"]["metadata"]["annotations"]
    assert "unthrottle.io/cpu-burst" not in annotations
    assert json.loads(annotations["koordinator.sh/cpuBurst"])["policy"] == "auto"
