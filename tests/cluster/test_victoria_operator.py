"""The real `unthrottle operator` (Kopf, in a subprocess) in Recommend mode against the
real Kubernetes API server (through a recording proxy, as in test_operator) and
VictoriaMetrics serving the day test_operator backfills into Prometheus: test_operator's
tests of the status, the served metrics and a metrics backend that goes away, run here
with their ``running`` fixture holding VictoriaMetrics."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kube import Kube
from kube_faults import FaultProxy
from operator_proc import OperatorProcess
from prom import free_port
from shop import deploy, openmetrics
from support.operator import (
    SHOP,
    Running,
    test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched,
    test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status,
    test_the_operator_serves_its_metrics_and_liveness,
)
from unthrottle_lab.kube import ControlPlane
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
REUSED = (
    test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched,
    test_the_operator_serves_its_metrics_and_liveness,
    test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status,
)
"""test_operator's tests, in its order, each run here against VictoriaMetrics."""


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
        VictoriaMetricsServer(folder, openmetrics=openmetrics(placed, end)) as vm,
    ):
        kubeconfig = proxy.kubeconfig(folder / "kubeconfig")
        metrics, liveness = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        log = folder / "operator.log"
        watched = [arg for n in sorted(set(ns.values())) for arg in ("--namespace", n)]
        with OperatorProcess(kubeconfig, vm.url, log, "--metrics", metrics,
                             "--liveness", liveness, *watched):  # fmt: skip
            # VictoriaMetrics stands in for PrometheusServer: the same url, port, stop and start
            yield Running(kube, proxy, vm, metrics, log, liveness, ns)  # type: ignore[arg-type]
    for namespace in set(ns.values()):
        kube.delete("v1/namespaces", None, namespace)
