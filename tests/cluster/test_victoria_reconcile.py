"""One policy's reconcile, called directly, against the real Kubernetes API server and
VictoriaMetrics: test_reconcile's tests of the status, of engine reuse and of the
checkpointed sliding window, run here with their ``world`` holding VictoriaMetrics, and
the statuses compared with a reconcile over Prometheus."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kube import Kube
from kube_faults import FaultProxy
from prom import PrometheusServer, requires_prometheus
from shop import Workload, deploy, openmetrics
from support import reconcile as reconcile_tests
from support.reconcile import (
    MANY,
    POLICIES,
    World,
    test_a_restarted_operator_reads_only_the_gap_from_its_checkpoint,
    test_a_second_reconcile_over_the_same_evidence_runs_no_engine,
    test_status_keeps_the_most_harmful_and_says_how_many_were_left_out,
)
from support.victoria_shared import (
    RATIO_SLACK,
    assert_close,
)
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
REUSED = (
    test_status_keeps_the_most_harmful_and_says_how_many_were_left_out,
    test_a_second_reconcile_over_the_same_evidence_runs_no_engine,
    test_a_restarted_operator_reads_only_the_gap_from_its_checkpoint,
)
"""test_reconcile's tests, each run here against VictoriaMetrics."""
one_policy_at_a_time = reconcile_tests.one_policy_at_a_time
"""test_reconcile's autouse fixture: each test's policies go with it."""


@pytest.fixture(scope="module")
def shop(
    control_plane: ControlPlane, throttlepolicy_crd: None
) -> Iterator[tuple[Kube, list[Workload]]]:
    """test_reconcile's twelve small Deployments on the control plane, as they landed."""
    kube = Kube(control_plane)
    placed = deploy(kube, MANY)
    yield kube, placed
    kube.delete("v1/namespaces", None, placed[0].namespace)


@pytest.fixture(scope="module")
def history(shop: tuple[Kube, list[Workload]]) -> str:
    """test_reconcile's six hours of them."""
    return openmetrics(shop[1], int(time.time()) // 60 * 60, span=6 * 3600)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, shop: tuple[Kube, list[Workload]], history: str
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("reconcile")
    kube, placed = shop
    with FaultProxy(kube) as proxy, VictoriaMetricsServer(folder, openmetrics=history) as vm:
        api = kube.api_client(proxy.kubeconfig(folder / "kubeconfig"))
        source = PrometheusSource(PrometheusConfig(vm.url, retries=0))
        yield World(kube, proxy, source, api, placed)


def _recommended(world: World, name: str) -> dict[str, tuple[str, tuple[int, int], float]]:
    """Deployment → its state, recommended (limit, burst µs) and throttle ratio."""
    status = world.body(name)["status"]
    return {
        w["deployment"]: (w["state"], (parse_cpu(c["recommended"]["cpuLimit"]),
                                       round(float(c["recommended"]["burst"][:-2]) * 1000)),
                          c["throttleRatio"])
        for w in status["workloads"] for c in w["containers"]
    }  # fmt: skip


@requires_prometheus
def test_the_status_over_victoria_metrics_is_the_one_over_prometheus_within_a_bucket(
    world: World, history: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    world.policy("compared", {"window": "5h"})
    assert world.reconciler().reconcile(world.body("compared")).fault is None
    ours = _recommended(world, "compared")
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=history) as prom:
        over_prometheus = World(world.kube, world.proxy, PrometheusSource(
            PrometheusConfig(prom.url)), world.api, world.placed)  # fmt: skip
        world.kube.delete(POLICIES, world.namespace, "compared")  # one policy at a time
        world.policy("compared-again", {"window": "5h"})
        again = world.body("compared-again")
        assert over_prometheus.reconciler().reconcile(again).fault is None
    theirs = _recommended(world, "compared-again")
    assert ours.keys() == theirs.keys() and len(ours) == 12
    for name, (state, recommended, ratio) in ours.items():
        other_state, other_recommended, other_ratio = theirs[name]
        assert state == other_state, name
        assert_close(recommended, other_recommended)
        assert ratio == pytest.approx(other_ratio, abs=RATIO_SLACK), name
