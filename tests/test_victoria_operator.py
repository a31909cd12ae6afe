"""The real `unthrottle operator` (Kopf, in a subprocess) in Recommend mode against the
Kubernetes emulator and VictoriaMetrics serving the day test_operator backfills into
Prometheus: test_operator's tests of the status, the served metrics and a metrics backend
that goes away, run here with their ``running`` fixture holding VictoriaMetrics."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kube_emulator import KubeEmulator
from operator_proc import OperatorProcess
from prom import free_port
from shop import objects, openmetrics
from test_operator import (  # collected here too, against this module's fixture
    SHOP,
    Running,
    test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched,
    test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status,
    test_the_operator_serves_its_metrics_and_liveness,
)
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
REUSED = (
    test_a_policy_gets_status_events_and_a_report_and_nothing_is_patched,
    test_the_operator_serves_its_metrics_and_liveness,
    test_prometheus_stopped_gives_degraded_and_keeps_the_last_good_status,
)
"""test_operator's tests, in its order, each run here against VictoriaMetrics."""


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("operator")
    end = int(time.time()) // 60 * 60
    with (
        KubeEmulator() as kube,
        VictoriaMetricsServer(folder, openmetrics=openmetrics(SHOP, end)) as vm,
    ):
        for w in SHOP:
            for resource, obj in objects(w):
                kube.put(resource, obj)
        kubeconfig = kube.kubeconfig(folder / "kubeconfig")
        metrics, liveness = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        log = folder / "operator.log"
        with OperatorProcess(kubeconfig, vm.url, log, "--metrics", metrics,
                             "--liveness", liveness):  # fmt: skip
            yield Running(kube, vm, metrics, log, liveness)  # type: ignore[arg-type]  # stands in
