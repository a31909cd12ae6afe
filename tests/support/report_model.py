"""What test_report_model.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from kube import Kube
from prom import PrometheusServer
from shop import HEALTHY, THROTTLED, Workload, deploy, openmetrics
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.scan import ScanRequest, ScanResult, scan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

DAY = 86_400
XSS = "<script>window.__xss = 1; console.error('xss')</script>"
GOLANG = Workload("shop", "api", 0.2, 0.08, 1.6, 0.8, 2, {"team": "web"},
                  env=(("GOMAXPROCS", "4"), ("GREETING", XSS)))  # fmt: skip
"""A Go service (GOMAXPROCS set by hand) bursting past 800m; an environment value that
the report never shows (only GOMAXPROCS, as a number, reaches it)."""
IDLE = Workload("shop", "cron", 0.0, 0.0, 0.0, 0.25, 1, {"team": "data"})
"""No CPU series at all: listed apart, without evidence."""
SHOP = [THROTTLED, HEALTHY, GOLANG, IDLE]


@contextmanager
def shop_scan(folder: Path, kube: Kube) -> Iterator[ScanResult]:
    """A real scan of the shop: its Deployments on the real control plane (``kube``, in a
    fresh namespace, deleted after), read through the kubernetes client, and their history
    in a real Prometheus. The result names that namespace, not ``shop``."""
    from kubernetes import client

    placed = deploy(kube, SHOP)
    namespace = placed[0].namespace
    end = int(time.time()) // 60 * 60
    try:
        with PrometheusServer(folder, openmetrics=openmetrics(placed, end)) as prom:
            api = kube.api_client()
            store = KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api))
            request = ScanRequest(window_s=DAY // 2, now=end, namespaces=(namespace,))
            yield scan(request, PrometheusSource(PrometheusConfig(prom.url)), store)
    finally:
        kube.delete("v1/namespaces", None, namespace)


def with_xss(result: ScanResult) -> ScanResult:
    """The scan with script in what comes from the cluster: a reason, a container name."""
    w = result.workloads[0]
    c = w.containers[0]
    assert c.recommendation is not None
    rec = replace(c.recommendation, reasons=[*c.recommendation.reasons, f"odd: {XSS}"])
    odd = replace(c, recommendation=rec)
    stranger = replace(c, name=f"side{XSS}")
    first = replace(w, containers=(odd, stranger))
    return replace(result, workloads=(first, *result.workloads[1:]))


def _containers(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(w["deployment"], c["name"], c) for w in doc["workloads"] for c in w["containers"]]
