"""A pod-level CPU limit (``spec.resources``) as a row of its own: read from the template,
fed by the pod cgroup's series, patched at the template spec, rolled back only when it is
still as unthrottle left it (pure parts; tests/cluster/test_pod_level.py runs them on the
real API server)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from unthrottle.evidence.gathering import gather
from unthrottle.evidence.pods import canary_ratios
from unthrottle.kube.inplace import (
    InPlaceError,
    admission_patch,
    resize_body,
    resize_state,
    targets,
)
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


# -- in place ---------------------------------------------------------------------------------


def running_pod(pod_limit: str = "800m", request: str = "400m", qos: str = "Burstable",
                reported: str | None = "800m") -> dict[str, Any]:  # fmt: skip
    """A running pod of the ReplicaSet ``api-7c9d8f`` with its limit at the pod level, its
    ``app`` container unlimited, and what its kubelet reports from the pod cgroup."""
    status: dict[str, Any] = {"qosClass": qos, "containerStatuses": [{"name": "app"}]}
    if reported is not None:
        status["resources"] = {"limits": {"cpu": reported}, "requests": {"cpu": "399m"}}
    return {
        "metadata": {"namespace": "shop", "name": "api-7c9d8f-b2x4k", "generation": 1,
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "api-7c9d8f",
                                          "controller": True}]},
        "spec": {"containers": [{"name": "app", "image": "shop:1"}],
                 "resources": {"limits": {"cpu": pod_limit, "memory": "1Gi"},
                               "requests": {"cpu": request, "memory": "1Gi"}}},
        "status": status,
    }  # fmt: skip


def in_place(after: int, before: int = 800) -> Any:
    change = ContainerChange(POD_ROW, Settings(before, 0, None), Settings(after, 0, None),
                             0.3, 0.01)  # fmt: skip
    record = plan(deployment(), [change], policy="p", policy_uid="u", policy_generation=1,
                  now=1.0)  # fmt: skip
    return dataclasses.replace(record, method="InPlace", replicaset="api-7c9d8f",
                               canary_verified_at=2.0)  # fmt: skip


def test_a_pod_level_limit_is_resized_through_the_pods_own_resources() -> None:
    pod = running_pod()
    want = targets(pod, in_place(1200))
    assert want == {POD_ROW: {"limits": {"cpu": "1200m"}}}  # Burstable: its request stays
    assert resize_body(pod, want) == {"spec": {"resources": {"limits": {"cpu": "1200m"}}}}
    assert resize_state(pod, want).state == "asked"
    assert targets(pod, in_place(800, 1200), undo=True) == want  # the rollback's way back


def test_the_kubelets_report_from_the_pod_cgroup_says_when_it_is_done() -> None:
    pod = running_pod(pod_limit="1200m", reported="800m")
    pod["metadata"]["generation"] = 2
    want = targets(pod, in_place(1200))
    assert resize_body(pod, want) is None
    assert resize_state(pod, want).state == "resizing"  # the cgroup still has 800m
    pod["status"]["resources"]["limits"]["cpu"] = "1200m"
    assert resize_state(pod, want).state == "done"
    guaranteed = running_pod(pod_limit="1200m", request="1200m", qos="Guaranteed",
                             reported="1200m")  # fmt: skip
    guaranteed["status"]["resources"]["requests"]["cpu"] = "1199m"  # read from its shares
    want = targets(guaranteed, in_place(1200))
    assert want == {POD_ROW: {"limits": {"cpu": "1200m"}, "requests": {"cpu": "1200m"}}}
    assert resize_state(guaranteed, want).state == "done"
    guaranteed["status"]["resources"]["requests"]["cpu"] = "1100m"
    assert resize_state(guaranteed, want).state == "resizing"


def test_a_burstable_pod_keeps_its_class_at_the_pod_level_too() -> None:
    """Its pod-level resources decide its QoS class: a new limit equal to its request, its
    memory limit already so, would make it Guaranteed, which a resize may not."""
    pod = running_pod(request="1200m")
    assert targets(pod, in_place(1200)) == {POD_ROW: {"limits": {"cpu": "1201m"}}}
    with pytest.raises(InPlaceError, match=r"the pod-level limit .* requests 1200m"):
        targets(pod, in_place(1000))
    plain = running_pod()
    del plain["spec"]["resources"]
    with pytest.raises(InPlaceError, match="has no pod-level resources"):
        targets(plain, in_place(1200))


def test_a_new_pod_is_admitted_with_the_pod_level_limit_and_its_request_kept() -> None:
    patch = admission_patch(running_pod(), in_place(1200))
    assert patch is not None
    assert patch["spec"]["resources"] == {"limits": {"cpu": "1200m", "memory": "1Gi"},
                                          "requests": {"cpu": "400m", "memory": "1Gi"}}  # fmt: skip
    assert patch["spec"]["containers"] == running_pod()["spec"]["containers"]


def test_a_canary_is_judged_on_its_pod_cgroups_own_counters() -> None:
    ratios = canary_ratios({"": 30.0, "app": 30.0}, {"": 600.0, "app": 600.0},
                           {"": 60.0, "app": 60.0})  # fmt: skip
    assert ratios[POD_ROW] == (0.1, 600.0)
    assert POD_ROW not in canary_ratios({"app": 30.0}, {"app": 600.0}, {"app": 0.0})
