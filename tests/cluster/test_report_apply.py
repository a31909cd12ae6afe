"""What Apply did, in the operator's report: a Deployment whose CPU limit Apply raised two
hours ago (its record and its rollout real, on the real API server), its history in a
real Prometheus holding only cAdvisor's counters; one reconcile writes the report
ConfigMap, with the plots' series thinned to stay under its cap; ``unthrottle report``
renders it, pictures included, with Prometheus gone."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kube import JSON_PATCH, Kube
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deploy, rehash
from support.report_counters import (
    LINE,
    SVG,
    UNTHROTTLE,
    Pods,
    counters,
    plot_sections,
)
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.patching import ContainerChange, Record, Settings, apply_patch
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.report.thinning import CONFIGMAP_POINTS
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
CHECKOUT = Workload("applied", "checkout", 0.1, 0.10, 1.2, 0.5, 2)
"""Throttled in about 10 % of periods under 500m; the change raises the limit to 1."""
OTHERS = [Workload("applied", f"svc-{i}", 0.1, 0.08, 1.2, 0.5, 1) for i in range(3)]
SPAN, AGO = 6 * 3600, 2 * 3600


@dataclass
class Applied:
    namespace: str
    kubeconfig: Path
    configmap: dict[str, Any]
    max_bytes: int
    record: Record


def _record(at: float) -> Record:
    change = ContainerChange("app", before=Settings(500, 0, None), after=Settings(1000, 0, None),
                             ratio_before=0.1, expected_ratio=0.004)  # fmt: skip
    return Record(policy="pay", policy_uid="u-1", policy_generation=1, at=at,
                  containers=(change,), rollout_done_at=at + 60, verdict="Applied",
                  verdict_at=at + 1800, verdict_reason="throttling fell from 10.0 % to 0.9 %",
                  ratio_after={"app": 0.009})  # fmt: skip


@pytest.fixture(scope="module")
def applied(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[Applied]:  # fmt: skip
    folder = tmp_path_factory.mktemp("applied")
    kube = Kube(control_plane)
    placed = deploy(kube, [CHECKOUT, *OTHERS])
    before, ns = placed[0], placed[0].namespace
    end = int(time.time()) // 60 * 60
    record = _record(end - AGO)
    current = kube.get("apps/v1/deployments", ns, "checkout")
    assert current is not None
    kube.patch("apps/v1/deployments", ns, "checkout", apply_patch(current, record),
               content_type=JSON_PATCH)  # fmt: skip
    after = rehash(kube, before, limit=1.0)  # the real rollout's new ReplicaSet
    history = counters([
        Pods(before, tuple(before.pod_names()), end - SPAN, end - AGO),
        Pods(after, tuple(after.pod_names()), end - AGO, end, factor=0.1),
        *(Pods(w, tuple(w.pod_names()), end - SPAN, end) for w in placed[1:]),
    ])  # fmt: skip
    try:
        with PrometheusServer(folder, openmetrics=history) as prom:
            api = kube.api_client()
            from kubernetes import client

            settings = replace(OperatorSettings(PrometheusConfig(prom.url)),
                               report_max_bytes=60_000)  # fmt: skip
            reconciler = Reconciler(
                settings, metrics=PrometheusSource(PrometheusConfig(prom.url)),
                workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api)),
                objects=KubeObjects(api), clock=lambda: float(end),
            )  # fmt: skip
            kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                   "kind": "ThrottlePolicy",
                                   "metadata": {"namespace": ns, "name": "pay"},
                                   "spec": {"window": "6h"}})  # fmt: skip
            body = kube.get(POLICIES, ns, "pay")
            assert reconciler.reconcile(body).fault is None  # type: ignore[arg-type]
        # Prometheus is gone from here on: the report must not need it
        configmap = kube.get("v1/configmaps", ns, "pay-report")
        assert configmap is not None
        yield Applied(ns, kube.kubeconfig(folder / "kubeconfig", namespace=ns), configmap,
                      settings.report_max_bytes, record)  # fmt: skip
    finally:
        kube.delete("v1/namespaces", None, ns)


def report(a: Applied, fmt: str) -> str:
    out = subprocess.run([str(UNTHROTTLE), "report", "pay", "-n", a.namespace, "--format", fmt],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "KUBECONFIG": str(a.kubeconfig)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


class TestTheReportConfigMap:
    def test_carries_the_plotted_series_thinned_under_its_cap(self, applied: Applied) -> None:
        data = applied.configmap["data"]
        assert sum(len(v) for v in data.values()) <= applied.max_bytes
        doc = json.loads(data["report.json"])
        plotted = [c for w in doc["workloads"] for c in w["containers"] if c.get("usage_series")]
        assert len(plotted) == 4  # the three throttled, and the one Apply changed
        for c in plotted:
            assert 2 <= len(c["throttle_series"]) <= CONFIGMAP_POINTS
            assert len(c["usage_series"]) <= CONFIGMAP_POINTS

    def test_says_what_apply_changed_measured_before_and_after(self, applied: Applied) -> None:
        doc = json.loads(applied.configmap["data"]["report.json"])
        checkout = next(w for w in doc["workloads"] if w["deployment"] == "checkout")
        change = checkout["applied"]["containers"][0]
        assert checkout["applied"]["verdict"] == "kept"
        assert change["span_s"] >= 3600  # as long before as after, inside the window
        assert change["ratio_before"] > 0.05 and change["ratio_after"] < 0.02


class TestTheReportCommand:
    def test_markdown_has_a_table_a_reviewer_can_paste(self, applied: Applied) -> None:
        md = report(applied, "markdown")
        assert "## What Apply changed" in md
        header = next(line for line in md.splitlines() if line.startswith("| Deployment | cont")
                      and "throttled before" in line)  # fmt: skip
        assert header.count("|") == 10
        row = next(line for line in md.splitlines()
                   if line.startswith(f"| {applied.namespace}/checkout | app | limit"))  # fmt: skip
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "limit 500m → 1"
        assert cells[3] == time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(applied.record.at))
        before, after = (float(c.split(" %")[0]) for c in cells[5:7])
        assert before > 5 and after < 2
        spans = {c.split(" over ")[1] for c in cells[5:7]}
        assert spans == {"119 m"}  # as long on each side: the change to now, less the rollout
        assert cells[7].startswith("kept")
        assert "throttling fell" in cells[8]

    def test_html_draws_before_and_after_with_the_change_marked(self, applied: Applied) -> None:
        html = report(applied, "html")
        section = html[html.index('id="applied"') :]
        svgs = SVG.findall(section)
        assert len(svgs) == 1
        assert "before" in svgs[0] and "after" in svgs[0] and "the change" in svgs[0]
        assert len(LINE.findall(svgs[0])) >= 2
        for name, drawn in plot_sections(html).items():  # the ConfigMap's series, no query
            assert drawn and all(LINE.search(s) for s in drawn), name
