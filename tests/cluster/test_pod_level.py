"""A CPU limit set for the pod (``spec.resources``, Kubernetes 1.34+), its container
unlimited: `recommend` and a policy size the pod's limit from the pod cgroup's series, and
Apply changes the template's pod-level limit by Rollout. Against the real API server (which
admits pod-level resources, beta and on since 1.34) and a real Prometheus holding the
history: the pod cgroup (``container=""``) throttled, and its container as much (the
kubelet gives a container without a limit its pod's quota: test_agent_real_node)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import requires_prometheus
from shop import Workload, deploy, openmetrics
from support.history import History as World
from support.history import history
from support.history import recommend as recommend_in
from support.policies import POLICIES, create_policy, drop_policies, reconciler
from unthrottle.kube.patching import RECORD_ANNOTATION, record_of
from unthrottle.model.podlevel import POD_ROW
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


API = Workload("podlevel", "api", 0.1, 0.15, 1.4, 0.8, 2, {"tier": "api"}, pod_level=True)
"""Its pod's limit 800m, bursting to 1.4 cores in 15 % of windows: the pod cgroup is
throttled, and its container (no limit of its own, the pod's quota) with it."""
WEB = Workload("podlevel", "web", 0.1, 0.10, 1.2, 0.5, 2)
"""Beside it, the usual: a container limit of 500m."""


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[World]:  # fmt: skip
    kube = Kube(control_plane)
    placed = deploy(kube, [API, WEB])
    text = openmetrics(placed, int(time.time()) // 60 * 60, span=6 * 3600)
    with history(kube, control_plane, tmp_path_factory.mktemp("podlevel"), placed,
                 text) as world:  # fmt: skip
        yield world


@pytest.fixture
def policies(world: World) -> Iterator[None]:
    yield
    drop_policies(world.kube, world.namespace)


def recommend(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return recommend_in(world, "--kubeconfig", str(world.kubeconfig), *args)


def _template(world: World, name: str) -> dict[str, Any]:
    obj = world.kube.get("apps/v1/deployments", world.namespace, name)
    assert obj is not None
    return dict(obj["spec"]["template"])


def test_recommend_sizes_the_pods_own_limit_from_the_pod_cgroup(world: World) -> None:
    out = recommend(world, "--format", "json")
    assert out.returncode == 0, out.stderr
    workloads = {w["name"]: w for w in json.loads(out.stdout)["workloads"]}
    (pod,) = workloads["api"]["containers"]  # the pod's row alone: "app" has no limit
    assert pod["name"] == POD_ROW
    assert pod["current"]["limit_millicores"] == 800
    assert pod["throttle_ratio"] > 0.05  # the pod cgroup's, read from container=""
    rec = pod["recommendation"]
    assert rec["limit_millicores"] > 800 and rec["burst_us"] == 0  # limit only
    assert any("pod's own CPU limit" in r for r in rec["reasons"])
    (app,) = workloads["web"]["containers"]  # a container's limit: as before
    assert app["name"] == "app" and app["current"]["limit_millicores"] == 500


def test_the_kustomize_patch_sets_the_pod_level_limit(world: World, tmp_path: Path) -> None:
    out = recommend(world, "--format", "kustomize", "--output", str(tmp_path / "k"))
    assert out.returncode == 0, out.stderr
    import yaml

    text = (tmp_path / "k" / f"{world.namespace}--api.yaml").read_text()
    patch = yaml.safe_load(text)
    spec = patch["spec"]["template"]["spec"]
    assert set(spec) == {"resources"}, spec  # the pod's limit, no container entry
    assert spec["resources"]["limits"]["cpu"] not in ("800m", None)


@pytest.mark.parametrize("method", ["InPlace", "InPlaceOrRollout"])
def test_where_the_node_cannot_resize_in_place_the_pod_level_change_is_given_up_or_rolled_out(
    world: World, policies: None, method: str
) -> None:
    """The pods are kwok's, whose nodes declare no in-place resize: the API server refuses
    the canary's resize of its pod-level limit, as of any container's (the real node's
    kubelet takes it: tests/cluster/test_inplace_real_node.py). InPlace gives it up in the
    server's words, nothing changed; InPlaceOrRollout rolls the pod's limit out."""
    before = _template(world, "web")
    spec = {"window": "5h", "mode": "Apply", "apply": {"method": method},
            "selector": {"matchLabels": {"tier": "api"}}}  # fmt: skip
    api_before = _template(world, "api")
    name = method.lower()
    try:
        reconciler(world.kube, world.prometheus, apply=True, pods=True).reconcile(
            create_policy(world.kube, world.namespace, name, spec))  # fmt: skip
        status = world.kube.get(POLICIES, world.namespace, name)["status"]  # type: ignore[index]
        (api,) = status["workloads"]
        assert api["name"] == "api" and "without support for resize" in api["message"], api
        record = record_of(world.kube.get("apps/v1/deployments", world.namespace, "api") or {})
        assert record is not None and [c.name for c in record.containers] == [POD_ROW]
        if method == "InPlace":
            assert api["state"] == "RolledBack", api
            assert "in-place resize given up" in api["message"], api
            assert _template(world, "api") == api_before
        else:
            assert api["state"] == "Verifying" and record.method == "Rollout", api
            limit = _template(world, "api")["spec"]["resources"]["limits"]["cpu"]
            assert parse_cpu(limit) == record.containers[0].after.cpu_limit != 800
        assert _template(world, "web") == before
    finally:  # the next test starts from the template and no record
        drop_policies(world.kube, world.namespace)
        world.kube.patch("apps/v1/deployments", world.namespace, "api",
                         [{"op": "replace", "path": "/spec/template", "value": api_before}],
                         content_type="application/json-patch+json")  # fmt: skip
        world.kube.patch("apps/v1/deployments", world.namespace, "api",
                         {"metadata": {"annotations": {RECORD_ANNOTATION: None}}})  # fmt: skip
        world.kube.rolled_out(world.namespace, "api", timeout_s=60)


def test_apply_by_rollout_patches_the_templates_pod_level_limit(
    world: World, policies: None
) -> None:
    before = _template(world, "api")
    spec = {"window": "5h", "mode": "Apply", "apply": {"cooldown": "1m"}}
    reconciler(world.kube, world.prometheus, apply=True).reconcile(
        create_policy(world.kube, world.namespace, "rollout", spec))  # fmt: skip
    status = world.kube.get(POLICIES, world.namespace, "rollout")["status"]  # type: ignore[index]
    states = {w["name"]: w["state"] for w in status["workloads"]}
    assert states["api"] == "Verifying", status["workloads"]
    after = _template(world, "api")
    limit = after["spec"]["resources"]["limits"]["cpu"]
    assert limit != before["spec"]["resources"]["limits"]["cpu"]
    assert after["spec"]["containers"][0].get("resources") in ({}, None)  # untouched
    record = record_of(world.kube.get("apps/v1/deployments", world.namespace, "api") or {})
    assert record is not None and [c.name for c in record.containers] == [POD_ROW]
    assert record.containers[0].before.cpu_limit == 800
