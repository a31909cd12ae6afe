"""A pod-level CPU limit (``spec.resources``) as a row of its own: read from the template,
fed by the pod cgroup's series, patched at the template spec, rolled back only when it is
still as unthrottle left it (pure parts; tests/cluster/test_pod_level.py runs them on the
real API server)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from unthrottle.evidence.gathering import gather
from unthrottle.kube.patching import (
    ContainerChange,
    PatchPlanError,
    Settings,
    apply_patch,
    plan,
    rollback_patch,
    template_fingerprint,
)
from unthrottle.kube.workloads import template_rows
from unthrottle.model.owners import Owners
from unthrottle.model.podlevel import POD_ROW


def deployment(pod_limit: str | None = "800m", app_limit: str | None = None) -> dict[str, Any]:
    app: dict[str, Any] = {"name": "app", "image": "shop:1"}
    if app_limit is not None:
        app["resources"] = {"limits": {"cpu": app_limit}}
    spec: dict[str, Any] = {
        "containers": [
            app,
            {"name": "sidecar", "image": "proxy:1", "resources": {"limits": {"cpu": "200m"}}},
        ]
    }
    if pod_limit is not None:
        spec["resources"] = {"limits": {"cpu": pod_limit}, "requests": {"cpu": "400m"}}
    return {"metadata": {"namespace": "shop", "name": "api", "resourceVersion": "7",
                         "generation": 3},
            "spec": {"template": {"metadata": {}, "spec": spec}}}  # fmt: skip


def test_a_pod_level_limit_is_a_row_in_place_of_its_unlimited_containers() -> None:
    rows = {r.name: r for r in template_rows(deployment()["spec"]["template"]["spec"], {}, {})}
    assert set(rows) == {"sidecar", POD_ROW}  # app has no limit: the pod's row sizes it
    assert (rows[POD_ROW].limit_millicores, rows[POD_ROW].request_millicores) == (800, 400)
    plain = template_rows(deployment(pod_limit=None)["spec"]["template"]["spec"], {}, {})
    assert [r.name for r in plain] == ["app", "sidecar"]


def _record(raw: dict[str, Any], after: int) -> Any:
    change = ContainerChange(POD_ROW, Settings(800, 0, None), Settings(after, 0, None),
                             0.3, 0.01)  # fmt: skip
    return plan(raw, [change], policy="p", policy_uid="u", policy_generation=1, now=1.0)


def test_the_patch_sets_the_template_specs_own_limit_and_no_container() -> None:
    raw = deployment()
    ops = apply_patch(raw, _record(raw, 1200))
    limits = [op for op in ops if op["path"].endswith("/limits/cpu")]
    assert limits == [{"op": "add", "path": "/spec/template/spec/resources/limits/cpu",
                       "value": "1200m"}]  # fmt: skip
    assert not any("/containers/" in op["path"] for op in ops)
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "7"} in ops


def test_a_rollback_restores_the_pod_limit_only_while_it_is_as_left() -> None:
    raw = deployment()
    record = _record(raw, 1200)
    changed = copy.deepcopy(raw)
    changed["spec"]["template"]["spec"]["resources"]["limits"]["cpu"] = "1200m"
    ops, done = rollback_patch(changed, record, now=2.0, reason="worse")
    assert {"op": "add", "path": "/spec/template/spec/resources/limits/cpu",
            "value": "800m"} in ops and done.verdict == "RolledBack"  # fmt: skip
    changed["spec"]["template"]["spec"]["resources"]["limits"]["cpu"] = "2"  # someone else's
    with pytest.raises(PatchPlanError, match="the pod's CPU limit changed"):
        rollback_patch(changed, record, now=2.0, reason="worse")


def test_the_template_fingerprint_ignores_the_pod_limit_unthrottle_sets() -> None:
    raw = deployment()
    other = deployment(pod_limit="1200m")
    assert template_fingerprint(raw) == template_fingerprint(other)
    edited = deployment()
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "shop:2"  # the team's
    assert template_fingerprint(raw) != template_fingerprint(edited)


def _answer(rows: dict[str, list[tuple[dict[str, str], float]]]) -> Any:
    def answer(name: str) -> list[tuple[dict[str, str], list[int], list[float]]]:
        return [(labels, [0], [value]) for labels, value in rows.get(name, [])]

    return answer


def test_the_pod_cgroups_series_feed_the_pod_row_only_under_a_pod_level_limit() -> None:
    pod = {"namespace": "shop", "pod": "api-7c9d8f-b2x4k", "container": ""}
    app = {**pod, "container": "app"}
    series = {
        "periods": [(pod, 1000.0)],
        "throttled_periods": [(pod, 300.0)],
        "usage_seconds": [(pod, 50.0), (app, 50.0)],
        "histogram": [({**pod, "le": "+Inf"}, 1000.0)],
    }
    owners = Owners(replicasets={("shop", "api-7c9d8f"): "api"})
    (plain,) = gather(owners, _answer(series))
    assert {k.container for k in plain} == {"app"}
    owners.pod_level.add(("shop", "api"))
    (found,) = gather(owners, _answer(series))
    row = next(v for k, v in found.items() if k.container == POD_ROW)
    assert (row.periods, row.throttled_periods, row.usage_s) == (1000.0, 300.0, 50.0)
    assert row.buckets == {float("inf"): 1000.0}
