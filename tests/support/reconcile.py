"""What test_reconcile.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from kube import Kube
from kube_faults import FaultProxy
from shop import Workload, deployment
from support.policies import POLICIES, drop_policies
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusSource
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings

MANY = [Workload("big", f"svc-{i:02d}", 0.1, 0.02 * (i % 5), 1.2, 0.5, 1) for i in range(12)]
LONGEST = "checkout-payments-eu-west-1-production-cpu-throttling-policy-v2"
"""A policy name at the CRD's limit: 63 characters, the longest label value."""


class World:
    """The twelve Deployments as they landed (``placed``, in ``namespace``), Prometheus
    holding their history, and the API server behind ``proxy``, which the reconcilers'
    client goes through."""

    def __init__(self, kube: Kube, proxy: FaultProxy, source: PrometheusSource, api: Any,
                 placed: list[Workload]) -> None:  # fmt: skip
        self.kube, self.proxy, self.source, self.api = kube, proxy, source, api
        self.placed = placed
        self.namespace = placed[0].namespace

    def reconciler(self, **settings: Any) -> Reconciler:
        from kubernetes import client

        config = replace(OperatorSettings(self.source.config), **settings)
        return Reconciler(
            config, metrics=self.source,
            workloads=KubeWorkloadStore(client.CoreV1Api(self.api), client.AppsV1Api(self.api)),
            objects=KubeObjects(self.api),
        )  # fmt: skip

    def policy(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.kube.create(POLICIES, {
            "apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": self.namespace, "name": name}, "spec": spec,
        })  # fmt: skip

    def body(self, name: str) -> dict[str, Any]:
        found = self.kube.get(POLICIES, self.namespace, name)
        assert found is not None
        return found

    def configmap(self, name: str) -> dict[str, Any] | None:
        return self.kube.get("v1/configmaps", self.namespace, name)


@pytest.fixture(autouse=True)
def one_policy_at_a_time(world: World) -> Iterator[None]:
    """Each test's policies go with it: two at once would conflict over the Deployments."""
    yield
    drop_policies(world.kube, world.namespace)


def test_status_keeps_the_most_harmful_and_says_how_many_were_left_out(world: World) -> None:
    world.policy("capped", {"window": "5h"})
    outcome = world.reconciler(status_max_workloads=5).reconcile(world.body("capped"))
    assert outcome.fault is None
    status = world.body("capped")["status"]
    assert len(status["workloads"]) == 5
    assert status["summary"]["deployments"] == 12
    assert status["summary"]["leftOut"] == 7
    ratios = [max(c["throttleRatio"] or 0 for c in w["containers"]) for w in status["workloads"]]
    assert ratios == sorted(ratios, reverse=True)  # most harmful first
    report = world.configmap("capped-report")
    assert report is not None
    assert len(json.loads(report["data"]["report.json"])["workloads"]) == 12  # the rest


def test_a_second_reconcile_over_the_same_evidence_runs_no_engine(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unthrottle.scan import pipeline

    world.policy("steady", {"window": "5h"})
    reconciler = world.reconciler()
    calls: list[int] = []
    real = pipeline.advise_all

    def counting(jobs: list[Any], workers: int | None = None) -> list[Any]:
        calls.append(len(jobs))
        return real(jobs, workers)

    monkeypatch.setattr(pipeline, "advise_all", counting)  # counts calls, changes nothing
    reconciler.reconcile(world.body("steady"))
    first = world.body("steady")["status"]["workloads"]
    reconciler.reconcile(world.body("steady"))
    assert calls == [12, 0]
    assert world.body("steady")["status"]["workloads"] == first
    # a change of policy is a change of inputs: the engine runs again
    world.kube.patch(POLICIES, world.namespace, "steady", {"spec": {"targetThrottleRatio": 0.02}})
    reconciler.reconcile(world.body("steady"))
    assert calls[-1] == 12


def restore(kube: Kube, w: Workload) -> None:
    """``w``'s Deployment made again, once the garbage collector removed its ReplicaSet: the
    same template hashes to the same ReplicaSet name, so its history is its own again."""
    kube.until(f"{w.name}'s ReplicaSet gone",
               lambda: kube.get("apps/v1/replicasets", w.namespace, w.replicaset),
               lambda rs: rs is None)  # fmt: skip
    kube.create("apps/v1/deployments", deployment(w))
    rs = kube.replicaset_of(kube.rolled_out(w.namespace, w.name))
    assert rs["metadata"]["name"] == w.replicaset


def test_a_restarted_operator_reads_only_the_gap_from_its_checkpoint(world: World) -> None:
    from unthrottle.scan.readers import IncrementalReader

    clock = [float(int(time.time()) // 60 * 60 - 1800)]

    def restarted() -> tuple[Reconciler, IncrementalReader]:
        reconciler = world.reconciler()
        reader = IncrementalReader(world.source, reconciler.objects)
        reconciler.evidence, reconciler.clock = reader, lambda: clock[0]
        return reconciler, reader

    world.policy("kept", {"window": "5h"})
    first, reader = restarted()
    assert first.reconcile(world.body("kept")).fault is None
    assert [r.kind for r in reader.reads] == ["full"]
    checkpoint = world.configmap("kept-evidence")
    assert checkpoint is not None and checkpoint["binaryData"]["checkpoint"]
    assert checkpoint["metadata"]["ownerReferences"][0]["name"] == "kept"
    before = {w["deployment"]: w["containers"] for w in world.body("kept")["status"]["workloads"]}
    clock[0] += 900  # a quarter of an hour later (a 750 s slot has aged), a new process
    second, reader = restarted()
    assert second.reconcile(world.body("kept")).fault is None
    assert [r.kind for r in reader.reads] == ["head", "tail"]
    after = {w["deployment"]: w["containers"] for w in world.body("kept")["status"]["workloads"]}
    assert {d: [c["recommended"] for c in cs] for d, cs in after.items()} == {
        d: [c["recommended"] for c in cs] for d, cs in before.items()}  # fmt: skip
