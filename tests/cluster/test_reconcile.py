"""One policy's reconcile, called directly (no Kopf): caps, truncation, engine reuse, names
at the API's limits and API faults, against the real Kubernetes API server (through a
fault proxy, for a server that fails) and a real Prometheus."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kube import Kube
from kube_faults import FaultProxy
from prom import PrometheusServer, requires_prometheus
from shop import deploy, openmetrics
from support.reconcile import (  # noqa: F401 (autouse fixtures; its tests)
    LONGEST,
    MANY,
    World,
    one_policy_at_a_time,
    restore,
    test_a_restarted_operator_reads_only_the_gap_from_its_checkpoint,
    test_a_second_reconcile_over_the_same_evidence_runs_no_engine,
    test_status_keeps_the_most_harmful_and_says_how_many_were_left_out,
)
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.operator.reconcile import Reconciler
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[World]:  # fmt: skip
    folder = tmp_path_factory.mktemp("reconcile")
    kube = Kube(control_plane)
    placed = deploy(kube, MANY)
    end = int(time.time()) // 60 * 60
    with (
        FaultProxy(kube) as proxy,
        PrometheusServer(folder, openmetrics=openmetrics(placed, end, span=6 * 3600)) as prom,
    ):
        api = kube.api_client(proxy.kubeconfig(folder / "kubeconfig"))
        source = PrometheusSource(PrometheusConfig(prom.url, retries=0))
        yield World(kube, proxy, source, api, placed)
    kube.delete("v1/namespaces", None, placed[0].namespace)


def test_a_report_too_big_for_a_configmap_is_truncated_with_a_note(world: World) -> None:
    world.policy("small-report", {"window": "5h"})
    world.reconciler(report_max_bytes=6_000).reconcile(world.body("small-report"))
    report = world.configmap("small-report-report")
    assert report is not None
    doc = json.loads(report["data"]["report.json"])
    assert doc["truncated"]["left_out"] > 0
    assert len(doc["workloads"]) + doc["truncated"]["left_out"] == 12
    assert "more Deployments" in report["data"]["report.md"]
    assert sum(len(v) for v in report["data"].values()) <= 6_000


def test_an_api_error_is_degraded_and_retried_with_backoff(world: World) -> None:
    world.policy("api-down", {"window": "5h"})
    reconciler = world.reconciler()
    assert reconciler.reconcile(world.body("api-down")).fault is None
    world.proxy.fail_next("GET", r"/deployments$", 500, count=2)
    first = reconciler.reconcile(world.body("api-down"))
    second = reconciler.reconcile(world.body("api-down"))
    assert (first.fault, second.fault) == ("ApiUnavailable", "ApiUnavailable")
    assert second.next_in_s == 2 * first.next_in_s  # backing off
    status = world.body("api-down")["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ApiUnavailable"
    assert len(status["workloads"]) == 12  # the last good ones
    assert reconciler.reconcile(world.body("api-down")).fault is None  # and it recovers


def test_a_policy_whose_body_is_garbage_never_raises(world: World) -> None:
    reconciler = world.reconciler()
    body = world.policy("garbage", {"window": "5h"})
    body["spec"] = ["not", "a", "mapping"]
    outcome = reconciler.reconcile(body)
    assert outcome.fault == "InvalidSpec"
    degraded = next(c for c in world.body("garbage")["status"]["conditions"]
                    if c["type"] == "Degraded")  # fmt: skip
    assert degraded["reason"] == "InvalidSpec" and "spec" in degraded["message"]


def test_gone_deployments_leave_the_status(world: World) -> None:
    world.policy("shrinking", {"window": "5h", "selector": {"matchLabels": {}}})
    reconciler = world.reconciler()
    reconciler.reconcile(world.body("shrinking"))
    gone = world.placed[0]
    world.kube.delete("apps/v1/deployments", gone.namespace, gone.name)
    try:
        reconciler.reconcile(world.body("shrinking"))  # its pods' series are still there
        names = {w["deployment"] for w in world.body("shrinking")["status"]["workloads"]}
        assert gone.name not in names and len(names) == 11
    finally:
        restore(world.kube, gone)


def test_a_policy_named_at_the_63_character_limit_gets_its_report_and_checkpoint(
    world: World,
) -> None:
    from unthrottle.scan.readers import CHECKPOINT_LABEL, IncrementalReader

    assert len(LONGEST) == 63
    clock = [float(int(time.time()) // 60 * 60 - 1800)]

    def restarted() -> tuple[Reconciler, IncrementalReader]:  # small pieces: several of them
        reconciler = world.reconciler()
        reader = IncrementalReader(world.source, reconciler.objects, max_bytes=512)
        reconciler.evidence, reconciler.clock = reader, lambda: clock[0]
        return reconciler, reader

    uid = world.policy(LONGEST, {"window": "5h"})["metadata"]["uid"]
    first, _ = restarted()
    assert first.reconcile(world.body(LONGEST)).fault is None
    status = world.body(LONGEST)["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and status["summary"]["deployments"] == 12
    # the report, labelled with the policy's name and owned by it
    report = world.configmap(f"{LONGEST}-report")
    assert report is not None
    assert report["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "unthrottle",
                                            "unthrottle.io/policy": LONGEST}  # fmt: skip
    assert [(o["kind"], o["name"], o["uid"]) for o in report["metadata"]["ownerReferences"]] == [
        ("ThrottlePolicy", LONGEST, uid)]  # fmt: skip
    assert len(json.loads(report["data"]["report.json"])["workloads"]) == 12
    # the checkpoint's pieces, found by their label as kubectl get -l finds them
    pieces = world.kube.list("v1/configmaps", world.namespace,
                             selector=f"{CHECKPOINT_LABEL}={LONGEST}")  # fmt: skip
    names = {p["metadata"]["name"] for p in pieces}
    assert len(names) > 1
    assert names == {f"{LONGEST}-evidence"} | {f"{LONGEST}-evidence-{i}"
                                               for i in range(1, len(names))}  # fmt: skip
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == uid for p in pieces)
    # its summary event (the server cuts a name generated from a long one to 63 characters)
    events = [e for e in world.kube.list("v1/events", world.namespace)
              if e["involvedObject"].get("uid") == uid]  # fmt: skip
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [
        ("Recommended", LONGEST)]  # fmt: skip
    # 15 minutes later (a 750 s slot has aged), a new operator process reads its pieces
    # back, and only the gap
    clock[0] += 900
    second, reader = restarted()
    assert second.reconcile(world.body(LONGEST)).fault is None
    assert [r.kind for r in reader.reads] == ["head", "tail"]


def test_the_reuse_settings_decide_when_the_engine_runs_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unthrottle.scan import ReuseSettings, pipeline

    world.policy("strict", {"window": "5h"})
    reconciler = world.reconciler(reuse=ReuseSettings(share_drift=-1.0, ratio_drift=-1.0))
    calls: list[int] = []
    real = pipeline.advise_all

    def counting(jobs: list[Any], workers: int | None = None) -> list[Any]:
        calls.append(len(jobs))
        return real(jobs, workers)

    monkeypatch.setattr(pipeline, "advise_all", counting)  # counts calls, changes nothing
    reconciler.reconcile(world.body("strict"))
    reconciler.reconcile(world.body("strict"))
    assert calls == [12, 12]  # no drift is small enough: nothing is reused


def test_a_configmap_of_the_reports_name_that_the_policy_does_not_own_is_left_untouched(
    world: World,
) -> None:
    """Whoever may write a policy must not have another's ConfigMap replaced (and then
    garbage-collected with the policy): one named like the policy's report or checkpoint
    is left as it is, and the policy says which and why, in a condition and an event."""
    from unthrottle.scan.readers import IncrementalReader

    def configmap(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"namespace": world.namespace, "name": name,
                             "labels": {"team": "pay"}},
                "data": {"settings.yaml": "feature: on\n"}}  # fmt: skip

    names = ("taken-report", "taken-evidence")
    theirs = {name: world.kube.create("v1/configmaps", configmap(name)) for name in names}
    uid = world.policy("taken", {"window": "5h"})["metadata"]["uid"]
    reconciler = world.reconciler()
    reconciler.evidence = IncrementalReader(world.source, reconciler.objects)
    for _ in range(2):
        assert reconciler.reconcile(world.body("taken")).fault is None
    for name, before in theirs.items():
        after = world.configmap(name)
        assert after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert after["data"] == {"settings.yaml": "feature: on\n"}
        assert "ownerReferences" not in after["metadata"]
    status = world.body("taken")["status"]
    assert status["summary"]["deployments"] == 12  # the recommendations are all there
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ConfigMapNotOwned")
    for name in theirs:
        said = f"ConfigMap {world.namespace}/{name} exists and is not this policy's"
        assert said in degraded["message"]
    events = [e for e in world.kube.list("v1/events", world.namespace)
              if e["involvedObject"].get("uid") == uid
              and e["reason"] == "ConfigMapNotOwned"]  # fmt: skip
    said_in_events = sorted(e["message"].split(" exists")[0] for e in events)
    assert said_in_events == [f"ConfigMap {world.namespace}/{n}" for n in sorted(theirs)]
    assert all(e["type"] == "Warning" for e in events)
    # their owner takes them away: the policy writes its own, and is no longer Degraded
    for name in theirs:
        world.kube.delete("v1/configmaps", world.namespace, name)
    assert reconciler.reconcile(world.body("taken")).fault is None
    for name in theirs:
        mine = world.configmap(name)
        assert mine is not None and mine["metadata"]["ownerReferences"][0]["uid"] == uid
    status = world.body("taken")["status"]
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["status"] == "False"
