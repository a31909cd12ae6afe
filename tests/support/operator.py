"""What test_operator.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kube import Kube
from kube_faults import FaultProxy
from prom import PrometheusServer
from shop import HEALTHY, THROTTLED, Workload
from unthrottle.units import parse_cpu

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
IGNORED = Workload("shop", "legacy", 0.1, 0.10, 1.2, 0.5, 1, {"team": "pay"},
                   {"unthrottle.io/ignore": "true"})  # fmt: skip
BATCH = Workload("shop", "batch", 0.1, 0.10, 1.2, 0.5, 1, {"team": "data"})
FRONTEND = Workload("web", "frontend", 0.1, 0.10, 1.2, 0.5, 1, {"team": "web"})
SHOP = [THROTTLED, HEALTHY, IGNORED, BATCH, FRONTEND]
DEADLINE = 60.0
T = TypeVar("T")


class Running:
    """The control plane, Prometheus and the operator, as the tests see them; ``ns`` maps
    the shop's namespaces (``shop``, ``web``) to the fresh ones they landed in."""

    def __init__(self, kube: Kube, proxy: FaultProxy, prom: PrometheusServer, metrics: str,
                 log: Path, liveness: str, ns: dict[str, str]) -> None:  # fmt: skip
        self.kube, self.proxy, self.prom, self.metrics, self.log, self.liveness = (
            kube, proxy, prom, metrics, log, liveness)  # fmt: skip
        self.ns = ns

    def policy(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                    "kind": "ThrottlePolicy",
                                    "metadata": {"namespace": namespace, "name": name},
                                    "spec": spec})  # fmt: skip

    def _until(self, what: str, read: Callable[[], T], check: Callable[[T], bool]) -> T:
        deadline = time.monotonic() + DEADLINE
        found = read()
        while time.monotonic() < deadline:
            found = read()
            try:
                if check(found):
                    return found
            except (KeyError, TypeError, StopIteration):
                pass
            time.sleep(0.2)
        raise AssertionError(f"{what} never matched: {found}\n"
                             f"operator log:\n{self.log.read_text()[-4000:]}")  # fmt: skip

    def status_when(self, namespace: str, name: str,
                    check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:  # fmt: skip
        def status() -> dict[str, Any]:
            return (self.kube.get(POLICIES, namespace, name) or {}).get("status") or {}

        return self._until(f"status of {namespace}/{name}", status, check)

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1/events", namespace)
                if e.get("involvedObject", {}).get("name") == name]  # fmt: skip

    def events_when(
        self, namespace: str, name: str, check: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        """The policy's events once ``check`` holds: the operator posts them after the
        status it writes, so a reader that saw the status may be early for them."""
        return self._until(f"events of {namespace}/{name}",
                           lambda: self.events(namespace, name), check)  # fmt: skip


def _undeclared(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Paths in ``value`` that the CRD's structural schema does not declare (a real API
    server would prune them)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is None:
            return [] if schema.get("additionalProperties") else [path]
        out = []
        for key, item in value.items():
            if key not in props:
                out.append(f"{path}.{key}")
            else:
                out += _undeclared(item, props[key], f"{path}.{key}")
        return out
    if isinstance(value, list):
        return [p for i, item in enumerate(value)
                for p in _undeclared(item, schema.get("items", {}), f"{path}[{i}]")]  # fmt: skip
    return []


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def _workload(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in status["workloads"] if w["deployment"] == name)


def test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched(
    running: Running,
) -> None:
    shop = running.ns["shop"]
    before = {w.name: running.kube.get("apps/v1/deployments", running.ns[w.namespace], w.name)
              for w in SHOP}  # fmt: skip
    running.policy(shop, "pay", {"selector": {"matchLabels": {"team": "pay"}}, "window": "12h"})
    status = running.status_when(shop, "pay", lambda s: s["summary"]["deployments"] == 3)
    # the selector and the namespace boundary hold
    assert {w["deployment"] for w in status["workloads"]} == {"checkout", "catalog", "legacy"}
    checkout = _workload(status, "checkout")
    assert checkout["state"] == "Recommended"
    (api,) = checkout["containers"]
    assert api["evidence"] == "period"
    assert api["current"]["cpuLimit"] == "500m"
    assert api["throttleRatio"] > 0.05
    assert parse_cpu(api["recommended"]["cpuLimit"]) > 500
    assert api["expectedThrottleRatio"] <= 0.05
    # made from throttled data: the limit is the top of a range, and the status says so
    assert (
        0
        < parse_cpu(api["recommended"]["cpuLimitLowerBound"])
        < parse_cpu(api["recommended"]["cpuLimit"])
    )
    # the healthy one gets no higher limit
    catalog = _workload(status, "catalog")
    assert catalog["state"] in {"UpToDate", "Recommended"}
    assert parse_cpu(catalog["containers"][0]["recommended"]["cpuLimit"]) <= 1000
    # not throttled: no range (a null in a merge patch removes the key on a real server)
    assert "cpuLimitLowerBound" not in catalog["containers"][0]["recommended"]
    # the opt-out annotation: listed, skipped, with the reason
    legacy = _workload(status, "legacy")
    assert legacy["state"] == "Skipped" and "unthrottle.io/ignore" in legacy["message"]
    assert legacy["containers"][0].get("recommended") is None  # the server drops a null
    assert status["summary"]["overTarget"] == 1  # checkout; legacy is skipped
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert status["observedGeneration"] == 1
    # every field written is declared in the CRD (a structural schema prunes the others)
    from unthrottle.model.crd import crd

    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert _undeclared(status, schema) == []
    # a summary event on the policy
    running.events_when(shop, "pay", lambda events: any(
        e["reason"] == "Recommended" and e["type"] == "Normal" for e in events))  # fmt: skip
    # the report ConfigMap, owned by the policy
    report = running.kube.get("v1/configmaps", shop, "pay-report")
    assert report is not None
    policy = running.kube.get(POLICIES, shop, "pay")
    assert policy is not None
    (owner,) = report["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ThrottlePolicy", "pay", policy["metadata"]["uid"])  # fmt: skip
    assert "checkout" in report["data"]["report.md"]
    doc = json.loads(report["data"]["report.json"])
    assert {w["deployment"] for w in doc["workloads"]} == {"checkout", "catalog", "legacy"}
    # nothing was patched: Deployments byte for byte as before, and no write reached them
    after = {w.name: running.kube.get("apps/v1/deployments", running.ns[w.namespace], w.name)
             for w in SHOP}  # fmt: skip
    assert after == before
    writes = [r for r in running.proxy.requests(path="/deployments")
              if r.method in {"PATCH", "PUT", "POST", "DELETE"}]  # fmt: skip
    assert writes == []


def test_the_operator_serves_its_metrics_and_liveness(running: Running) -> None:
    running.status_when(running.ns["shop"], "pay", lambda s: bool(s["summary"]))
    with urllib.request.urlopen(f"http://{running.metrics}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert "unthrottle_operator_reconcile_duration_seconds_count" in text
    assert 'unthrottle_operator_policies{condition="Reconciled"}' in text
    assert 'unthrottle_operator_recommendations{state="Recommended"}' in text
    assert "unthrottle_operator_prometheus_queries_total" in text
    with urllib.request.urlopen(f"http://{running.liveness}/healthz", timeout=10) as reply:
        assert reply.status == 200
        assert "api" in json.loads(reply.read())  # the API server's version, as it answered
    # The API server stops answering (its connections lost): the probe fails, so the pod is
    # not Ready (the webhook's Service skips it) and then restarted; it passes once back.
    lost = running.proxy.fail_next("GET", "^/version", status=None, count=10**6, disconnect=True)
    deadline = time.monotonic() + 40  # Kopf keeps a probe's answer 10 s
    while _healthz(running.liveness) == 200:
        assert time.monotonic() < deadline, "/healthz stayed 200 without the API server"
        time.sleep(1)
    lost.count = lost.hits  # back
    deadline = time.monotonic() + 40
    while _healthz(running.liveness) != 200:
        assert time.monotonic() < deadline, "/healthz stayed failing with the API server back"
        time.sleep(1)


def _healthz(liveness: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{liveness}/healthz", timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status(
    running: Running,
) -> None:
    shop = running.ns["shop"]
    good = running.status_when(shop, "pay", lambda s: bool(s["summary"]))
    port = running.prom.port
    running.prom.__exit__(None, None, None)  # Prometheus goes away mid-run
    running.kube.patch(POLICIES, shop, "pay", {"spec": {"headroom": 0.15}})  # reconcile now
    status = running.status_when(shop, "pay", lambda s: _condition(s, "Degraded")["reason"]
                                 == "PrometheusUnavailable")  # fmt: skip
    assert status["workloads"] == good["workloads"]  # the last good recommendations stay
    assert status["lastGoodRun"] == good["lastGoodRun"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and good["lastGoodRun"] in ready["message"]
    running.events_when(shop, "pay", lambda events: any(
        e["reason"] == "PrometheusUnavailable" and e["type"] == "Warning"
        for e in events))  # fmt: skip
    # Prometheus back on the same address: the policy recovers on its next retry
    running.prom.port, running.prom.url = port, f"http://127.0.0.1:{port}"
    running.prom.__enter__()
    recovered = running.status_when(shop, "pay", lambda s: next(
        c for c in s["conditions"] if c["type"] == "Ready")["status"] == "True")  # fmt: skip
    assert recovered["lastGoodRun"] >= good["lastGoodRun"]
