"""StatefulSets and DaemonSets beside Deployments: `recommend` (with and without cluster
access) and a policy's reconcile, against the real Kubernetes API server (its controllers
make the StatefulSet's and DaemonSet's pods on kwok's nodes) and a real Prometheus holding
the three workloads' history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import requires_prometheus
from shop import Workload, deploy, openmetrics
from support.history import History as World
from support.history import history, recommend
from support.policies import POLICIES, create_policy, drop_policies, reconciler
from support.report_counters import http_queries
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


WEB = Workload("kinds", "web", 0.1, 0.10, 1.2, 0.5, 2)
DB = Workload("kinds", "db", 0.1, 0.15, 1.4, 0.8, 3, kind="StatefulSet")
"""A database throttled in 15 % of periods under 800m: bursts to 1.4 cores."""
LOGS = Workload("kinds", "logs", 0.05, 0.20, 0.6, 0.4, 2, kind="DaemonSet")
"""A log shipper throttled in 20 % of periods under 400m (bursts to 0.6 core), on every
node."""
KINDS = [WEB, DB, LOGS]


def gone(w: Workload) -> Workload:
    """Its pods as they were before: a StatefulSet scaled down from five (ordinals 3 and 4
    are gone now), a DaemonSet's pods of nodes gone (names no node's pod has today)."""
    if w.kind == "StatefulSet":
        return replace(w, names=(f"{w.name}-3", f"{w.name}-4"))
    return replace(w, names=(f"{w.name}-q8wzt", f"{w.name}-x2b4k"))


def owner_series(workloads: list[Workload], end: int, span: int) -> str:
    """kube-state-metrics' ``kube_pod_owner`` (and ``kube_replicaset_owner``) for their pods,
    one sample a minute."""
    lines = []
    for t in range(end - span, end + 1, 60):
        for w in workloads:
            owner = (w.kind, w.name) if w.kind != "Deployment" else ("ReplicaSet", w.replicaset)
            for pod in w.pod_names():
                labels = f'namespace="{w.namespace}",pod="{pod}"'
                lines.append(f'kube_pod_owner{{{labels},owner_kind="{owner[0]}",'
                             f'owner_name="{owner[1]}"}} 1 {t}')  # fmt: skip
            if w.kind == "Deployment":
                lines.append(f'kube_replicaset_owner{{namespace="{w.namespace}",'
                             f'replicaset="{w.replicaset}",owner_kind="Deployment",'
                             f'owner_name="{w.name}"}} 1 {t}')  # fmt: skip
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[World]:  # fmt: skip
    kube = Kube(control_plane)
    placed = deploy(kube, KINDS)  # with the pods their controllers made
    end = int(time.time()) // 60 * 60
    gone_too = [*placed, *(gone(w) for w in placed if w.kind != "Deployment")]
    text = openmetrics(gone_too, end, span=6 * 3600) + owner_series(gone_too, end, 6 * 3600)
    with history(kube, control_plane, tmp_path_factory.mktemp("kinds"), placed, text) as world:
        yield world


def by_kind(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["kind"]: w for w in doc["workloads"]}


@pytest.mark.parametrize("cluster", [True, False], ids=["api", "kube-state-metrics"])
def test_recommend_lists_every_kind_with_its_kind_and_counts_the_pods_that_are_gone(
    world: World, cluster: bool
) -> None:
    access = ["--kubeconfig", str(world.kubeconfig)] if cluster else ["--no-cluster"]
    out = recommend(world, *access, "--format", "json")
    assert out.returncode == 0, out.stderr
    found = by_kind(json.loads(out.stdout))
    assert set(found) == {"Deployment", "StatefulSet", "DaemonSet"}
    assert found["Deployment"]["name"] == found["Deployment"]["deployment"] == "web"
    for kind, w in (("StatefulSet", DB), ("DaemonSet", LOGS)):
        doc = found[kind]
        assert doc["name"] == w.name and "deployment" not in doc  # no Deployment of that name
        (container,) = doc["containers"]
        live = next(p for p in world.placed if p.name == w.name)
        assert container["pods"] == len(live.pod_names()) + 2  # the two gone ones count
        rec = container["recommendation"]
        assert container["throttle_ratio"] == pytest.approx(w.throttled_share(), abs=0.02)
        assert rec["limit_millicores"] > round(w.limit * 1000)  # throttled: raised
        assert rec["expected_throttle_ratio"] <= 0.05, rec["reasons"]


def test_kind_selects_and_a_kind_without_pods_to_size_is_refused(world: World) -> None:
    out = recommend(world, "--no-cluster", "--kind", "sts", "--kind", "DaemonSet",
                    "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert set(by_kind(json.loads(out.stdout))) == {"StatefulSet", "DaemonSet"}
    refused = recommend(world, "--no-cluster", "--kind", "CronJob")
    assert refused.returncode == 2
    assert "--kind: 'CronJob' is not one of Deployment, StatefulSet, DaemonSet" in refused.stderr


def test_the_query_count_is_the_same_for_one_kind_or_three(world: World) -> None:
    sent = []
    for kinds in (["--kind", "Deployment"], []):
        before = sum(http_queries(world.prometheus).values())
        out = recommend(world, "--no-cluster", *kinds, "--format", "json")
        assert out.returncode == 0, out.stderr
        sent.append(sum(http_queries(world.prometheus).values()) - before)
    assert sent[0] == sent[1] == 12  # 11 of the evidence, 1 for the recording rules


def test_csv_markdown_and_kustomize_name_each_kind(world: World, tmp_path: Path) -> None:
    access = ("--kubeconfig", str(world.kubeconfig))
    csv_out = recommend(world, *access, "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    header, *rows = csv_out.stdout.splitlines()
    assert header.startswith("namespace,kind,name,deployment,container,")
    kinds = {tuple(r.split(",")[1:4]) for r in rows}
    assert kinds == {("Deployment", "web", "web"), ("StatefulSet", "db", ""),
                     ("DaemonSet", "logs", "")}  # fmt: skip
    page = recommend(world, *access, "--format", "markdown")
    assert page.returncode == 0, page.stderr
    assert "**3 workloads**" in page.stdout and "| Workload | container |" in page.stdout
    assert f"{world.namespace}/statefulset/db" in page.stdout
    assert f"{world.namespace}/daemonset/logs" in page.stdout
    out = recommend(world, *access, "--format", "kustomize", "--output", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr
    kustomization = (tmp_path / "k" / "kustomization.yaml").read_text()
    for w in (DB, LOGS):
        patch = (tmp_path / "k" / f"{world.namespace}--{w.kind.lower()}-{w.name}.yaml").read_text()
        assert f"kind: {w.kind}\n" in patch and f"name: {w.name}\n" in patch
        assert f"kind: {w.kind}\n    name: ^{w.name}$" in kustomization


def _reconciler(world: World, apply: bool) -> Any:
    return reconciler(world.kube, world.prometheus, apply=apply)


def _policy(world: World, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return create_policy(world.kube, world.namespace, name, spec)


@pytest.fixture
def policies(world: World) -> Iterator[None]:
    """The test's policies go with it (the recommend tests have none)."""
    yield
    drop_policies(world.kube, world.namespace)


def _templates(world: World) -> dict[str, Any]:
    out = {}
    for w in world.placed:
        obj = world.kube.get(f"apps/v1/{w.kind.lower()}s", world.namespace, w.name)
        assert obj is not None
        out[w.name] = obj["spec"]["template"]
    return out


def test_a_policy_covers_deployments_only_until_it_names_more_kinds(
    world: World, policies: None
) -> None:
    reconciler = _reconciler(world, apply=False)
    reconciler.reconcile(_policy(world, "default-kinds", {"window": "5h"}))
    status = world.kube.get(POLICIES, world.namespace, "default-kinds")["status"]  # type: ignore[index]
    assert [(w["kind"], w["name"]) for w in status["workloads"]] == [("Deployment", "web")]
    world.kube.delete(POLICIES, world.namespace, "default-kinds")
    every = ["Deployment", "StatefulSet", "DaemonSet"]
    reconciler.reconcile(_policy(world, "every-kind", {"window": "5h", "kinds": every}))
    status = world.kube.get(POLICIES, world.namespace, "every-kind")["status"]  # type: ignore[index]
    shown = {(w["kind"], w["name"], w["deployment"]): w for w in status["workloads"]}
    assert set(shown) == {("Deployment", "web", "web"), ("StatefulSet", "db", "statefulset/db"),
                          ("DaemonSet", "logs", "daemonset/logs")}  # fmt: skip
    assert all(w["state"] == "Recommended" for w in shown.values())
    assert status["summary"]["deployments"] == 3
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("3 workloads, 3 over target")


def test_a_deployment_only_apply_policy_leaves_the_statefulset_and_daemonset_alone(
    world: World, policies: None
) -> None:
    before = _templates(world)
    reconciler = _reconciler(world, apply=True)
    spec = {"window": "5h", "mode": "Apply", "apply": {"cooldown": "1m"}}
    reconciler.reconcile(_policy(world, "apply-deployments", spec))
    status = world.kube.get(POLICIES, world.namespace, "apply-deployments")["status"]  # type: ignore[index]
    assert [(w["kind"], w["state"]) for w in status["workloads"]] == [("Deployment", "Verifying")]
    after = _templates(world)
    assert after["db"] == before["db"] and after["logs"] == before["logs"]  # untouched
    limit = after["web"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    assert limit != before["web"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
