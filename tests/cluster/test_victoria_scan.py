"""The scan pipeline that `recommend` and the operator share, over Prometheus and over
VictoriaMetrics holding the same day of a shop's history, and the real Kubernetes API
server holding its Deployments: the same assertions hold on both, and their results
agree."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prom import PrometheusServer, requires_prometheus
from shop import THROTTLED, openmetrics
from support import scan as scan_tests
from support.scan import (
    Shop,
)
from support.victoria_shared import (
    RATIO_SLACK,
    assert_close,
)
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.selector import parse_selector
from unthrottle.scan import ProblemKind, ScanResult, scan
from victoria import BACKENDS, VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
DAY = 86_400
shop = scan_tests.shop
"""The shop's Deployments on the real control plane (test_scan's fixture)."""


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Any:
    """The server class: Prometheus, then VictoriaMetrics."""
    return request.param


@pytest.fixture(scope="module")
def history(
    backend: Any, shop: Shop, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PrometheusSource, int]]:
    end = int(time.time()) // 60 * 60
    text = openmetrics(shop.workloads, end)
    with backend(tmp_path_factory.mktemp("history"), openmetrics=text) as server:
        yield PrometheusSource(PrometheusConfig(server.url)), end


def test_a_throttled_deployment_gets_a_higher_limit_and_a_healthy_one_none(
    shop: Shop, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    result = scan(shop.request(end), source, shop.store)
    assert result.fatal is None and not result.problems
    first = result.workloads[0]
    assert first.deployment == "checkout"  # the most harmful first
    checkout = first.containers[0]
    assert checkout.evidence == "period"
    assert checkout.throttle_ratio == pytest.approx(THROTTLED.throttled_share(), abs=0.02)
    assert checkout.recommendation is not None
    assert (checkout.recommendation.limit_millicores or 0) > 500
    catalog = next(w for w in result.workloads if w.deployment == "catalog").containers[0]
    assert catalog.recommendation is not None
    assert (catalog.recommendation.limit_millicores or 0) <= 1000
    assert {w.namespace for w in result.workloads} == {shop.namespace}


@pytest.mark.parametrize(
    "changes",
    [lambda shop: {"selector": parse_selector("team=nobody")},
     lambda shop: {"namespaces": (shop.empty,)}],
    ids=["a selector that matches nothing", "a namespace with no Deployments"],
)  # fmt: skip
def test_problems_come_back_as_data_not_exits(
    shop: Shop, history: tuple[PrometheusSource, int], changes: Callable[[Shop], dict[str, Any]]
) -> None:
    source, end = history
    result = scan(shop.request(end, **changes(shop)), source, shop.store)
    assert result.fatal is not None and result.fatal.kind == ProblemKind.NO_DEPLOYMENTS


def test_deployments_without_counters_are_a_problem_named_for_people(
    backend: Any, shop: Shop, tmp_path: Path
) -> None:
    with backend(tmp_path) as server:  # holding nothing
        result = scan(shop.request(int(time.time())),
                      PrometheusSource(PrometheusConfig(server.url)), shop.store)  # fmt: skip
    assert result.fatal is not None and result.fatal.kind == ProblemKind.NO_COUNTERS
    assert "container_cpu_cfs_periods_total" in result.fatal.message
    assert {w.deployment for w in result.workloads} == {"checkout", "catalog"}


def test_counters_without_the_agent_are_noted(backend: Any, shop: Shop, tmp_path: Path) -> None:
    end = int(time.time()) // 60 * 60
    text = "\n".join(line for line in openmetrics(shop.workloads[:2], end, span=3600).splitlines()
                     if not line.startswith("unthrottle_")) + "\n"  # fmt: skip
    with backend(tmp_path, openmetrics=text) as server:
        source = PrometheusSource(PrometheusConfig(server.url))
        result = scan(shop.request(end, window_s=3000), source, shop.store)
    assert [p.kind for p in result.problems] == [ProblemKind.COUNTERS_ONLY]
    assert all(c.evidence == "counters" for w in result.workloads for c in w.containers)


@pytest.fixture(scope="module")
def both(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """Prometheus and VictoriaMetrics holding the same day."""
    end = int(time.time()) // 60 * 60
    text = openmetrics(shop.workloads, end)
    folder = tmp_path_factory.mktemp("both")
    with (PrometheusServer(folder, openmetrics=text) as prom,
          VictoriaMetricsServer(folder, openmetrics=text) as vm):  # fmt: skip
        yield prom.url, vm.url, end


def _limits(result: ScanResult) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (w.deployment, c.name): (
            c.evidence, c.managed, None if c.recommendation is None else (
                c.recommendation.limit_millicores, c.recommendation.burst_us))
        for w in result.workloads for c in w.containers
    }  # fmt: skip


@requires_prometheus
@pytest.mark.parametrize("window_s", [DAY // 2, DAY - 60], ids=["12h", "a day"])
def test_both_backends_recommend_the_same_within_a_bucket(
    shop: Shop, both: tuple[str, str, int], window_s: int
) -> None:
    prom_url, vm_url, end = both
    request = shop.request(end, window_s=window_s)
    ours = scan(request, PrometheusSource(PrometheusConfig(vm_url)), shop.store)
    theirs = scan(request, PrometheusSource(PrometheusConfig(prom_url)), shop.store)
    # The same workloads, in order of harm, which each backend computes from its own buckets:
    # two of nearly equal harm (0.005 and 0) came out in either order, so the throttle ratios
    # the order comes from are compared instead.
    assert sorted(w.deployment for w in ours.workloads) == sorted(
        w.deployment for w in theirs.workloads
    )
    ratios = {(w.deployment, c.name): c.throttle_ratio for w in theirs.workloads
              for c in w.containers}  # fmt: skip
    for workload in ours.workloads:
        for c in workload.containers:
            other = ratios[workload.deployment, c.name]
            assert (c.throttle_ratio is None) == (other is None), c.name
            assert c.throttle_ratio == pytest.approx(other, abs=0.02), c.name
    assert [p.kind for p in ours.problems] == [p.kind for p in theirs.problems]
    a, b = _limits(ours), _limits(theirs)
    assert a.keys() == b.keys()
    for key, (evidence, managed, rec) in a.items():
        assert (evidence, managed) == b[key][:2]
        other = b[key][2]
        assert (rec is None) == (other is None), key
        if rec is not None and other is not None:
            assert_close(rec, other)
    for w, v in zip(ours.workloads, theirs.workloads, strict=True):
        for c, d in zip(w.containers, v.containers, strict=True):
            assert c.throttle_ratio == pytest.approx(d.throttle_ratio, abs=RATIO_SLACK)
