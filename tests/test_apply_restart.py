"""The operator may die at any point: killed (SIGKILL) while its patch is in flight, or
between a patch and its verdict, a restarted operator resumes from the Deployments'
records. The real `unthrottle operator` (Kopf) against the emulator and a real Prometheus."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_emulator import KubeEmulator
from operator_proc import OperatorProcess
from prom import PrometheusServer, requires_prometheus
from shop import Workload, objects, openmetrics
from unthrottle.cfs.settings import parse_cpu
from unthrottle.kube.patching import RECORD_ANNOTATION, Record

pytestmark = requires_prometheus
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
APP = Workload("stage", "checkout", 0.1, 0.10, 1.2, 0.5, 2, {"tier": "web"})


def _wait(check: Any, what: str, operator: OperatorProcess, timeout: float = 40) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened; operator log:\n{operator.tail()}")


def _settings(deploy: dict[str, Any]) -> tuple[int, str | None]:
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    burst = (deploy["spec"]["template"]["metadata"].get("annotations") or {}).get(
        "unthrottle.io/cpu-burst")  # fmt: skip
    return parse_cpu(container["resources"]["limits"]["cpu"]), burst


def _limit_patches(kube: KubeEmulator) -> int:
    """JSON Patches to the Deployment that change its CPU limit."""
    return sum(1 for r in kube.requests("PATCH", "/deployments/checkout$")
               if any("/resources" in op.get("path", "") and op["op"] != "test"
                      for op in r.body or []))  # fmt: skip


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[KubeEmulator, PrometheusServer, Path]]:
    end = int(time.time()) // 60 * 60
    with (
        KubeEmulator() as kube,
        PrometheusServer(tmp_path, openmetrics=openmetrics([APP], end, span=2 * 3600)) as prom,
    ):
        for resource, obj in objects(APP):
            kube.put(resource, obj)
        yield kube, prom, kube.kubeconfig(tmp_path / "kubeconfig")


def test_a_sigkill_mid_cycle_leaves_no_half_change_and_a_restart_resumes(
    world: tuple[KubeEmulator, PrometheusServer, Path], tmp_path: Path
) -> None:
    kube, prom, kubeconfig = world
    log = tmp_path / "operator.log"
    original = kube.get("apps/v1/deployments", "stage", "checkout")
    assert original is not None
    kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
                           "metadata": {"namespace": "stage", "name": "web"},
                           "spec": {"mode": "Apply", "window": "2h",
                                    "selector": {"matchLabels": {"tier": "web"}}}})  # fmt: skip
    # 1. the patch hangs in flight; the operator is killed before the API server answers
    kube.fail_next("PATCH", r"/deployments/checkout$", status=None, delay=30)
    with OperatorProcess(kubeconfig, prom.url, log) as first:
        _wait(lambda: kube.requests("PATCH", r"/deployments/checkout$"), "a patch", first)
        first.kill()
    time.sleep(0.5)
    now = kube.get("apps/v1/deployments", "stage", "checkout")
    assert now is not None
    assert now["spec"] == original["spec"]  # nothing half-applied
    assert RECORD_ANNOTATION not in (now["metadata"].get("annotations") or {})
    # 2. restarted, it patches once: the change and its record together
    kube.clear_requests()
    with OperatorProcess(kubeconfig, prom.url, log) as second:
        patched = _wait(lambda: (RECORD_ANNOTATION in ((kube.get(
            "apps/v1/deployments", "stage", "checkout") or {}).get("metadata", {}).get(
            "annotations") or {})) and kube.get("apps/v1/deployments", "stage", "checkout"),
            "the change", second)  # fmt: skip
        second.kill()  # 3. killed again, between the change and its verdict
    record = Record.from_annotation(patched["metadata"]["annotations"][RECORD_ANNOTATION])
    (change,) = record.containers
    limit, burst = _settings(patched)
    assert limit == change.after.cpu_limit > 500 and change.before.cpu_limit == 500
    assert (burst is None) == (change.after.burst_us == 0)
    assert record.verdict is None
    assert _limit_patches(kube) == 1
    # 4. the third operator resumes the cycle from the record: in verification, no new patch
    kube.clear_requests()
    with OperatorProcess(kubeconfig, prom.url, log) as third:
        status = _wait(lambda: next((w for w in ((kube.get(POLICIES, "stage", "web") or {})
                                                 .get("status") or {}).get("workloads", [])
                                     if w["state"] == "Verifying"
                                     and "rolling out" in (w["message"] or "")), None),
                       "Verifying", third)  # fmt: skip
        assert status["deployment"] == "checkout"
        time.sleep(2)
        assert _limit_patches(kube) == 0
        # the rollout completes: the resumed cycle goes on (the rollout is noted in the record)
        kube.complete_rollout("stage", "checkout")
        kube.patch(POLICIES, "stage", "web", {"spec": {"headroom": 0.11}})  # reconcile now
        noted = _wait(lambda: Record.from_annotation((kube.get(
            "apps/v1/deployments", "stage", "checkout") or {})["metadata"]["annotations"][
            RECORD_ANNOTATION]).rollout_done_at, "the rollout noted", third)  # fmt: skip
        assert noted > record.at
    final = kube.get("apps/v1/deployments", "stage", "checkout")
    assert final is not None and _settings(final) == (limit, burst)
