"""The operator in Recommend mode: the real `unthrottle operator` (Kopf) in a subprocess,
against the real kube-apiserver (tests/kube.py: the Deployments rolled out by the real
controller onto kwok's fake nodes; the operator's requests pass a recording proxy) and a
real Prometheus serving a day of backfilled history."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kube import Kube, api_requests
from kube_faults import FaultProxy
from operator_proc import OperatorProcess
from prom import PrometheusServer, free_port, requires_prometheus
from shop import deploy, openmetrics
from support.operator import (  # noqa: F401 (autouse fixtures; its tests)
    POLICIES,
    SHOP,
    Running,
    _workload,
    test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched,
    test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status,
    test_the_operator_serves_its_metrics_and_liveness,
)
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane, throttlepolicy_crd: None
) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("operator")
    kube = Kube(control_plane)
    placed = deploy(kube, SHOP)
    ns = {w.namespace: p.namespace for w, p in zip(SHOP, placed, strict=True)}
    end = int(time.time()) // 60 * 60
    with (
        FaultProxy(kube) as proxy,
        PrometheusServer(folder, openmetrics=openmetrics(placed, end)) as prom,
    ):
        kubeconfig = proxy.kubeconfig(folder / "kubeconfig")
        metrics, liveness = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        log = folder / "operator.log"
        watched = [arg for n in sorted(set(ns.values())) for arg in ("--namespace", n)]
        with OperatorProcess(kubeconfig, prom.url, log, "--metrics", metrics,
                             "--liveness", liveness, *watched):  # fmt: skip
            yield Running(kube, proxy, prom, metrics, log, liveness, ns)
    for namespace in set(ns.values()):
        kube.delete("v1/namespaces", None, namespace)


def test_a_second_policy_over_the_same_deployments_gets_a_conflict(running: Running) -> None:
    shop = running.ns["shop"]
    running.status_when(shop, "pay", lambda s: s["summary"]["deployments"] == 3)
    time.sleep(1.1)  # a creation time after the first policy's (seconds, as the API keeps them)
    running.policy(shop, "everything", {"window": "12h"})
    status = running.status_when(shop, "everything", lambda s: bool(s["summary"]))
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Conflict")
    assert "pay" in degraded["message"]
    checkout = _workload(status, "checkout")
    assert checkout["state"] == "Skipped" and "pay" in checkout["message"]
    assert _workload(status, "batch")["state"] == "Recommended"  # only the newer one has it
    running.events_when(shop, "everything", lambda events: any(
        e["reason"] == "Conflict" and e["type"] == "Warning" for e in events))  # fmt: skip
    # the older policy keeps its Deployments
    pay = running.kube.get(POLICIES, shop, "pay")
    assert pay is not None
    assert _workload(pay["status"], "checkout")["state"] == "Recommended"
    assert next(c for c in pay["status"]["conditions"] if c["type"] == "Degraded")["status"] == (
        "False")  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"window": "²d"}, "spec.window"),
        ({"limits": {"min": "2", "max": "1"}}, "spec.limits"),
        ({"targetThrottleRatio": 1.5}, "spec.targetThrottleRatio"),
        ({"prometheus": "http://evil.example"}, "prometheus"),
        ({"containers": ["api", "api"]}, "spec.containers[1]"),
    ],
    ids=[
        "a window with non-ASCII digits",
        "limits.min above limits.max",
        "a ratio above 1",
        "a field the spec does not have",
        "a container listed twice",
    ],
)
def test_the_server_refuses_a_malformed_policy_naming_the_field(
    running: Running, spec: dict[str, Any], field: str
) -> None:
    """The CRD's schema (generated from the model) is the first line: kubectl apply fails
    with the field named, and no policy is stored. Unknown fields are refused as kubectl
    refuses them (strict field validation, its default)."""
    web = running.ns["web"]
    body = {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": web, "name": "malformed"}, "spec": spec}  # fmt: skip
    status, reply = running.kube.try_call(
        "POST", f"/apis/unthrottle.io/v1alpha1/namespaces/{web}/throttlepolicies"
        "?fieldValidation=Strict", body)  # fmt: skip
    assert status in (400, 422), reply
    assert field in json.dumps(reply)
    assert running.kube.get(POLICIES, web, "malformed") is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"window": "1m"}, "window"),
        ({"interval": "10s"}, "interval"),
        ({"apply": {"verifyFor": "30s"}}, "verifyFor"),
    ],
    ids=[
        "a window shorter than 5 minutes",
        "an interval shorter than 30 seconds",
        "a verification shorter than a minute",
    ],
)  # fmt: skip
def test_an_invalid_spec_is_degraded_naming_the_field_and_others_keep_working(
    running: Running, spec: dict[str, Any], field: str
) -> None:
    """What the schema admits but the model refuses reaches the operator: a condition and
    an event name the field, and other policies keep working."""
    name = f"broken-{abs(hash(field)) % 10_000}"
    web = running.ns["web"]
    running.policy(web, name, spec)
    status = running.status_when(web, name, lambda s: any(
        c["type"] == "Degraded" and c["status"] == "True" for c in s["conditions"]))  # fmt: skip
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert field in degraded["message"]
    running.events_when(web, name, lambda events: any(
        e["reason"] == "InvalidSpec" and field in e["message"] for e in events))  # fmt: skip
    running.policy(web, f"good-{name}", {"window": "12h"})
    good = running.status_when(web, f"good-{name}", lambda s: bool(s["summary"]))
    assert [w["deployment"] for w in good["workloads"]] == ["frontend"]


def test_a_policy_named_with_63_characters_gets_its_report_and_checkpoint(
    running: Running,
) -> None:
    """The longest name the CRD admits: it names the report and checkpoint ConfigMaps and
    is the value of their labels (which stop at 63 characters)."""
    web = running.ns["web"]
    name = "a" * 55 + "-longest"
    assert len(name) == 63
    running.policy(web, name, {"window": "12h"})
    running.status_when(web, name, lambda s: bool(s["summary"]))
    report = running.kube.get("v1/configmaps", web, f"{name}-report")
    assert report is not None and report["metadata"]["labels"]["unthrottle.io/policy"] == name
    checkpoints = [c for c in running.kube.list("v1/configmaps", web)
                   if c["metadata"]["name"].startswith(f"{name}-evidence")]  # fmt: skip
    assert checkpoints and all(name in c["metadata"]["labels"].values() for c in checkpoints)


LISTED = ("deployments", "replicasets", "pods")


def _namespaced_lists(running: Running) -> dict[str, int]:
    """The namespace-scoped LISTs of Deployments, ReplicaSets and pods the API server has
    served so far, any client's (its own ``apiserver_request_total``)."""
    out = dict.fromkeys(LISTED, 0)
    for labels, value in api_requests(running.kube.plane):
        if (labels.get("verb"), labels.get("scope")) == ("LIST", "namespace") and (
            labels.get("resource") in out and not labels.get("subresource")):  # fmt: skip
            out[labels["resource"]] += value
    return out


def observed(generation: int) -> Callable[[dict[str, Any]], bool]:
    return lambda status: bool(status["observedGeneration"] == generation)


def test_a_steady_reconcile_lists_no_deployments_replicasets_or_pods(running: Running) -> None:
    """The workloads, ReplicaSets and pods come from watches: after the first reconcile, the
    next ones send the API server no LIST of them (counted on its own request counter and
    on the operator's requests), and what changes in the namespace still reaches the
    status: a Deployment created later is in the next one."""
    web = running.ns["web"]
    running.policy(web, "steady", {"window": "12h", "interval": "30s"})
    running.status_when(web, "steady", lambda s: bool(s["summary"]))
    operator_lists = f"^/apis?/(apps/)?v1/namespaces/{web}/({'|'.join(LISTED)})$"

    def lists() -> tuple[dict[str, int], int]:
        seen = running.proxy.requests("GET", operator_lists)
        return _namespaced_lists(running), sum(1 for r in seen if not r.params.get("watch"))

    before = lists()
    for seconds in (31, 32, 33):  # a spec change reconciles at once: three reconciles
        generation = running.kube.patch(POLICIES, web, "steady",
                                        {"spec": {"interval": f"{seconds}s"}}
                                        )["metadata"]["generation"]  # fmt: skip
        done = running.status_when(web, "steady", observed(generation))
        degraded = next(c for c in done["conditions"] if c["type"] == "Degraded")
        # (a Conflict with the module's older policies over frontend is not this test's)
        assert done["lastGoodRun"] and degraded["reason"] != "ApiUnavailable", degraded
    assert lists() == before  # not one LIST, by anyone, of what the operator reads
    watches = [r.path for r in running.proxy.requests("GET", operator_lists)
               if r.params.get("watch")]  # fmt: skip
    assert {p.rsplit("/", 1)[1] for p in watches} == {"deployments", "replicasets", "pods"}
    frontend = running.kube.get("apps/v1/deployments", web, "frontend")
    assert frontend is not None
    spec = frontend["spec"]  # its pods' own labels: no selector shared with frontend
    spec["selector"] = {"matchLabels": {"app": "late"}}
    spec["template"]["metadata"]["labels"] = {"app": "late"}
    late = {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"namespace": web, "name": "late"}, "spec": spec}  # fmt: skip
    running.kube.create("apps/v1/deployments", late)
    try:
        generation = running.kube.patch(POLICIES, web, "steady", {"spec": {"interval": "34s"}}
                                        )["metadata"]["generation"]  # fmt: skip
        status = running.status_when(web, "steady", observed(generation))
        assert "late" in [w["deployment"] for w in status["workloads"]]
        assert lists()[1] == before[1]
    finally:
        running.kube.delete("apps/v1/deployments", web, "late")
        running.kube.delete(POLICIES, web, "steady")
