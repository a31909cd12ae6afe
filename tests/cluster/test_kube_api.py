"""The operator's contact with the real kube-apiserver (built from k8s.io/kubernetes; the
control plane of tests/kube.py): the CRD installs, the schema refuses what the model
refuses, Apply's JSON Patches land on Deployments that look like real ones, the real
Deployment controller rolls them out, and rollback restores what was there."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, KubeError
from realistic import NON_ASCII, URL, container, deployment
from unthrottle.kube.deployments import KubeDeployments, PatchConflict, PatchRefused
from unthrottle.kube.patching import (
    RECORD_ANNOTATION,
    ContainerChange,
    Settings,
    apply_patch,
    plan,
    record_of,
    rollback_patch,
)
from unthrottle.operator.gates import rollout
from unthrottle.units import parse_cpu

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = "apps/v1/deployments"
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


def kubectl(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    """The kubectl built with the control plane (same release), as the admin."""
    return subprocess.run([str(kube.plane.bin("kubectl")), "--kubeconfig",
                           str(kube.plane.kubeconfig), *args],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.fixture
def crd(kube: Kube, throttlepolicy_crd: None) -> Kube:
    """The ThrottlePolicy CRD applied with kubectl from crds/ (conftest), and Established."""
    return kube


def _policy(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": namespace, "name": name},
            "spec": {"selector": {"matchLabels": {"team": "pay"}}, **spec}}  # fmt: skip


# -- the CRD -------------------------------------------------------------------------------


def test_the_crd_installs_with_kubectl_and_serves_policies_with_their_defaults(
    crd: Kube,
) -> None:
    made = crd.create(POLICIES, _policy(crd.namespace, "checkout"))
    # the server filled in the schema's defaults, as a user reading the policy back sees
    assert made["spec"]["targetThrottleRatio"] == pytest.approx(0.05)
    assert made["spec"]["mode"] == "Recommend"
    listed = kubectl(crd, "get", "tpol", "-n", crd.namespace)
    assert listed.returncode == 0, listed.stderr
    assert "checkout" in listed.stdout and "Recommend" in listed.stdout


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"targetThrottleRatio": 1.5}, "spec.targetThrottleRatio"),
        ({"mode": "Sometimes"}, "spec.mode"),
        ({"window": "a while"}, "spec.window"),
        ({"kinds": ["CronJob"]}, "spec.kinds"),
    ],
    ids=["ratio-above-1", "unknown-mode", "unparsable-window", "a-kind-it-cannot-act-on"],
)
def test_the_server_refuses_a_malformed_policy_naming_the_field(
    crd: Kube, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(KubeError) as refused:
        crd.create(POLICIES, _policy(crd.namespace, "bad", **spec))
    assert refused.value.status == 422
    assert field in json.dumps(refused.value.body)


def test_the_status_subresource_keeps_what_the_operator_writes(crd: Kube) -> None:
    from unthrottle.kube.objects import KubeObjects

    crd.create(POLICIES, _policy(crd.namespace, "pay"))
    status = {"observedGeneration": 1, "summary": {"deployments": 0, "overTarget": 0},
              "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
                              "message": f"ok — {NON_ASCII}",
                              "lastTransitionTime": "2026-12-01T00:00:00Z"}]}  # fmt: skip
    KubeObjects(crd.api_client()).patch_status(crd.namespace, "pay", status)
    read = crd.get(POLICIES, crd.namespace, "pay")
    assert read is not None
    assert read["status"]["conditions"][0]["message"] == f"ok — {NON_ASCII}"
    assert read["status"]["summary"]["deployments"] == 0
    # a spec change through the main resource leaves the status alone, and vice versa
    crd.patch(POLICIES, crd.namespace, "pay", {"spec": {"targetThrottleRatio": 0.1}})
    read = crd.get(POLICIES, crd.namespace, "pay")
    assert read is not None and read["status"]["summary"]["deployments"] == 0


@pytest.mark.parametrize("length", [63, 64], ids=["longest-allowed", "one-too-long"])
def test_a_policy_name_is_at_most_63_characters_the_longest_label_value(
    crd: Kube, length: int
) -> None:
    name = ("p" * length)[:length]
    status, body = crd.try_call(
        "POST",
        f"/apis/unthrottle.io/v1alpha1/namespaces/{crd.namespace}/throttlepolicies",
        _policy(crd.namespace, name),
    )
    if length <= 63:
        assert status == 201, body
    else:
        assert status == 422 and "metadata.name" in json.dumps(body), body


# -- Apply's JSON Patches on real-looking Deployments ----------------------------------


def _change(name: str, before: int, after: int, *, burst_us: int = 0) -> ContainerChange:
    return ContainerChange(name=name, before=Settings(before, 0, None),
                           after=Settings(after, burst_us, None), ratio_before=0.3,
                           expected_ratio=0.01)  # fmt: skip


def _limits(d: dict[str, Any]) -> dict[str, int | None]:
    return {
        c["name"]: (parse_cpu(c["resources"]["limits"]["cpu"])
                    if "cpu" in (c.get("resources") or {}).get("limits", {}) else None)
        for c in d["spec"]["template"]["spec"]["containers"]
    }  # fmt: skip


def _patch_as_the_operator_does(
    store: KubeDeployments,
    namespace: str,
    name: str,
    ops_of: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    """Patch from a fresh read, and read again on a conflict, three times at most: the
    controller may still be writing the status of a rollout it just finished (its
    resourceVersion moved after the rollout was seen done, once in a CI run). A patch whose
    `test` operations never match the server's bytes fails all three."""
    for attempt in range(3):
        fresh = store.get(namespace, name)
        assert fresh is not None
        try:
            store.json_patch(namespace, name, ops_of(fresh))
            return
        except PatchConflict:
            if attempt == 2:
                raise


def _rolled_out(kube: Kube, name: str) -> dict[str, Any]:
    return kube.rolled_out(kube.namespace, name)


def test_apply_patches_a_deployment_with_shell_urls_and_non_ascii_text_and_rolls_back(
    kube: Kube,
) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "checkout"))
    before = _rolled_out(kube, "checkout")
    store = KubeDeployments(kube.api_client())

    def first(fresh: dict[str, Any]) -> list[dict[str, Any]]:
        record = plan(fresh, [_change("app", 500, 1200, burst_us=20_000)], policy="pay",
                      policy_uid="uid-1", policy_generation=1, now=1000.0)  # fmt: skip
        return apply_patch(fresh, record)

    _patch_as_the_operator_does(store, kube.namespace, "checkout", first)
    patched = _rolled_out(kube, "checkout")
    assert _limits(patched) == {"app": 1200, "sidecar": 100}
    template = patched["spec"]["template"]
    assert template["metadata"]["annotations"]["unthrottle.io/cpu-burst"] == "app=20ms"
    # everything else is as the user wrote it, byte for byte once decoded
    for key in ("command", "args", "env", "readinessProbe", "livenessProbe"):
        assert (
            template["spec"]["containers"][0][key]
            == (before["spec"]["template"]["spec"]["containers"][0][key])
        )
    assert template["spec"]["containers"][0]["env"][0]["value"] == URL
    # the real controller made a new ReplicaSet whose pods carry the new limit and burst
    rs = kube.replicaset_of(patched)
    pods = kube.pods_of(rs)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "1200m"
        assert pod["metadata"]["annotations"]["unthrottle.io/cpu-burst"] == "app=20ms"
        assert pod["status"]["phase"] == "Running"
    assert rollout(patched) == "done"

    # rollback restores the limit and removes our annotation, through the same kind of patch
    def rollback(fresh: dict[str, Any]) -> list[dict[str, Any]]:
        stored = record_of(fresh)
        assert stored is not None
        return rollback_patch(fresh, stored, now=2000.0, reason="worse: 30 % → 45 %")[0]

    _patch_as_the_operator_does(store, kube.namespace, "checkout", rollback)
    back = _rolled_out(kube, "checkout")
    assert _limits(back) == {"app": 500, "sidecar": 100}
    assert "unthrottle.io/cpu-burst" not in back["spec"]["template"]["metadata"]["annotations"]
    assert (
        back["spec"]["template"]["metadata"]["annotations"]["note"]
        == (before["spec"]["template"]["metadata"]["annotations"]["note"])
    )
    kept = record_of(back)
    assert kept is not None and kept.verdict == "RolledBack"
    assert kept.verdict_reason == "worse: 30 % → 45 %"

    # and the record, with its non-ASCII reason, can be rewritten again (no stale test)
    def again(fresh: dict[str, Any]) -> list[dict[str, Any]]:
        record = plan(fresh, [_change("app", 500, 900)], policy="pay", policy_uid="uid-1",
                      policy_generation=2, now=3000.0)  # fmt: skip
        return apply_patch(fresh, record)

    _patch_as_the_operator_does(store, kube.namespace, "checkout", again)
    assert _limits(_rolled_out(kube, "checkout"))["app"] == 900


def test_a_deployment_changed_after_it_was_read_is_not_patched(kube: Kube) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "web", replicas=1))
    _rolled_out(kube, "web")
    store = KubeDeployments(kube.api_client())
    raw = store.get(kube.namespace, "web")
    assert raw is not None
    # somebody edits the Deployment (not even a container) after unthrottle read it
    kube.patch(DEPLOYMENTS, kube.namespace, "web", {"metadata": {"labels": {"tier": "gold"}}})
    record = plan(raw, [_change("app", 500, 800)], policy="pay", policy_uid="u",
                  policy_generation=1, now=1.0)  # fmt: skip
    with pytest.raises(PatchConflict):
        store.json_patch(kube.namespace, "web", apply_patch(raw, record))
    now = kube.get(DEPLOYMENTS, kube.namespace, "web")
    assert now is not None
    assert _limits(now)["app"] == 500 and RECORD_ANNOTATION not in now["metadata"]["annotations"]


def test_a_dry_run_patch_is_validated_by_the_server_and_changes_nothing(kube: Kube) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "web", replicas=1))
    before = _rolled_out(kube, "web")
    store = KubeDeployments(kube.api_client())
    record = plan(before, [_change("app", 500, 800)], policy="pay", policy_uid="u",
                  policy_generation=1, now=1.0)  # fmt: skip
    answer = store.json_patch(kube.namespace, "web", apply_patch(before, record), dry_run=True)
    assert _limits(answer)["app"] == 800
    after = kube.get(DEPLOYMENTS, kube.namespace, "web")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_a_limit_below_the_request_is_refused_by_the_server_whole(kube: Kube) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "web", replicas=1))
    before = _rolled_out(kube, "web")
    store = KubeDeployments(kube.api_client())
    # 100m under a 250m request: the server refuses it (422 Invalid), which is not "it
    # changed since it was read" (also 422): retrying cannot help, and the reason is named
    record = plan(before, [_change("app", 500, 100)], policy="pay", policy_uid="u",
                  policy_generation=1, now=1.0)  # fmt: skip
    with pytest.raises(PatchRefused) as refused:
        store.json_patch(kube.namespace, "web", apply_patch(before, record))
    assert "must be less than or equal to cpu limit" in str(refused.value)
    after = kube.get(DEPLOYMENTS, kube.namespace, "web")
    assert after is not None and after["metadata"]["generation"] == before["metadata"]["generation"]


# -- rollouts as the real Deployment controller carries them out ----------------------


def test_a_rollout_that_cannot_become_ready_ends_in_progress_deadline_exceeded(
    kube: Kube,
) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "stuck", replicas=1,
                                        progressDeadlineSeconds=2))  # fmt: skip
    _rolled_out(kube, "stuck")
    # a node selector no fake node matches: the new pod stays Pending
    kube.patch(
        DEPLOYMENTS,
        kube.namespace,
        "stuck",
        {"spec": {"template": {"spec": {"nodeSelector": {"zone": "nowhere"}}}}},
    )
    failed = kube.until(
        "ProgressDeadlineExceeded",
        lambda: kube.get(DEPLOYMENTS, kube.namespace, "stuck"),
        lambda d: d is not None and rollout(d) == "failed", timeout_s=60)  # fmt: skip
    assert failed is not None
    # meanwhile the old pod kept serving
    assert failed["status"]["availableReplicas"] == 1


def test_a_rollout_is_done_only_once_the_old_pods_are_gone(kube: Kube) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "web", replicas=3))
    _rolled_out(kube, "web")
    kube.patch(
        DEPLOYMENTS,
        kube.namespace,
        "web",
        {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}},
    )
    seen: list[tuple[str, int, int]] = []

    def state() -> dict[str, Any]:
        d = kube.get(DEPLOYMENTS, kube.namespace, "web")
        assert d is not None
        status = d.get("status") or {}
        seen.append((rollout(d), status.get("replicas", 0), status.get("updatedReplicas", 0)))
        return d

    kube.until("the rollout", state, lambda d: rollout(d) == "done", timeout_s=60)
    # whenever the operator would have called it done, no old replica was left
    assert all(replicas == updated for verdict, replicas, updated in seen if verdict == "done")


def test_a_deployment_scaled_to_zero_rolls_out_with_no_pods(kube: Kube) -> None:
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "idle", replicas=0))
    done = _rolled_out(kube, "idle")
    assert rollout(done) == "done"
    store = KubeDeployments(kube.api_client())

    def ops(fresh: dict[str, Any]) -> list[dict[str, Any]]:
        record = plan(fresh, [_change("app", 500, 700)], policy="pay", policy_uid="u",
                      policy_generation=1, now=1.0)  # fmt: skip
        return apply_patch(fresh, record)

    _patch_as_the_operator_does(store, kube.namespace, "idle", ops)
    after = _rolled_out(kube, "idle")
    assert _limits(after)["app"] == 700 and rollout(after) == "done"


def test_several_containers_are_patched_by_name_whatever_their_order(kube: Kube) -> None:
    containers = [container("sidecar", limit="100m", request="50m"), container("api"),
                  container("worker", limit=None)]  # fmt: skip
    kube.create(DEPLOYMENTS, deployment(kube.namespace, "multi", replicas=1,
                                        containers=copy.deepcopy(containers)))  # fmt: skip
    _rolled_out(kube, "multi")
    store = KubeDeployments(kube.api_client())
    changes = [_change("api", 500, 1500), _change("worker", 0, 2000)]
    changes[1] = ContainerChange(name="worker", before=Settings(None, 0, None),
                                 after=Settings(2000, 0, None), ratio_before=0.2,
                                 expected_ratio=0.0)  # fmt: skip
    _patch_as_the_operator_does(
        store, kube.namespace, "multi",
        lambda fresh: apply_patch(fresh, plan(fresh, changes, policy="pay", policy_uid="u",
                                              policy_generation=1, now=1.0)),
    )  # fmt: skip
    after = _rolled_out(kube, "multi")
    assert _limits(after) == {"sidecar": 100, "api": 1500, "worker": 2000}
