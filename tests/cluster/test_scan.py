"""The scan pipeline that `recommend` and the operator share, over a real Prometheus and the
real Kubernetes API server (the shop's Deployments rolled out by its controllers; a fault
proxy in front of it for an API server that fails or hangs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kube_faults import FaultProxy
from prom import PrometheusServer, free_port, requires_prometheus
from shop import THROTTLED, openmetrics
from support.scan import (
    Shop,
    workload_store,
)
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.model.selector import parse_selector
from unthrottle.scan import ClusterError, ProblemKind, ScanRequest, scan

pytestmark = requires_prometheus


@pytest.fixture(scope="module")
def history(
    shop: Shop, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PrometheusSource, int]]:
    end = int(time.time()) // 60 * 60
    text = openmetrics(shop.workloads, end)
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=text) as prom:
        yield PrometheusSource(PrometheusConfig(prom.url)), end


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
    assert checkout.pods == THROTTLED.pods  # the window's pods, gone now, by their names
    assert checkout.recommendation is not None
    assert checkout.recommendation.limit_millicores is not None
    assert checkout.recommendation.limit_millicores > 500
    catalog = next(w for w in result.workloads if w.deployment == "catalog").containers[0]
    assert catalog.recommendation is not None
    assert (catalog.recommendation.limit_millicores or 0) <= 1000
    assert {w.namespace for w in result.workloads} == {shop.namespace}  # the namespace boundary


def test_the_clock_is_an_input_so_a_result_is_reproducible(
    shop: Shop, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    one = scan(shop.request(end - 600), source, shop.store).to_json("12h")
    two = scan(shop.request(end - 600), source, shop.store).to_json("12h")
    assert one == two
    assert one["generated_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end - 600))


def test_containers_the_request_leaves_out_are_listed_without_a_recommendation(
    shop: Shop, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    result = scan(shop.request(end, containers=frozenset({"sidecar"})), source, shop.store)
    containers = [c for w in result.workloads for c in w.containers]
    assert containers and all(not c.managed and c.recommendation is None for c in containers)


def test_skipped_deployments_are_listed_without_a_recommendation(
    shop: Shop, history: tuple[PrometheusSource, int]
) -> None:
    from unthrottle.scan import assess, gather, select

    source, end = history
    request = shop.request(end)
    selection = select(request, shop.store, source)
    found, problems = gather(request, source, selection)
    result = assess(request, selection, found, problems=problems,
                    skip=frozenset({(shop.namespace, "checkout")}))  # fmt: skip
    checkout = next(w for w in result.workloads if w.deployment == "checkout")
    assert checkout.containers[0].recommendation is None
    assert checkout.containers[0].throttle_ratio is not None  # still shown as it is


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        (lambda shop: {"selector": parse_selector("team=nobody")}, ProblemKind.NO_DEPLOYMENTS),
        (lambda shop: {"namespaces": (shop.empty,)}, ProblemKind.NO_DEPLOYMENTS),
    ],
    ids=["a selector that matches nothing", "a namespace with no Deployments"],
)
def test_problems_come_back_as_data_not_exits(
    shop: Shop, history: tuple[PrometheusSource, int],
    changes: Callable[[Shop], dict[str, object]], kind: ProblemKind,
) -> None:  # fmt: skip
    source, end = history
    result = scan(shop.request(end, **changes(shop)), source, shop.store)
    assert result.fatal is not None and result.fatal.kind == kind
    assert "no Deployments found" in result.fatal.message


def test_deployments_without_counters_are_a_problem_named_for_people(
    shop: Shop, tmp_path: Path
) -> None:
    with PrometheusServer(tmp_path) as prom:  # an empty Prometheus
        result = scan(shop.request(int(time.time())),
                      PrometheusSource(PrometheusConfig(prom.url)), shop.store)  # fmt: skip
    assert result.fatal is not None and result.fatal.kind == ProblemKind.NO_COUNTERS
    assert "container_cpu_cfs_periods_total" in result.fatal.message
    assert {w.deployment for w in result.workloads} == {"checkout", "catalog"}  # still listed


def test_counters_without_the_agent_are_noted(shop: Shop, tmp_path: Path) -> None:
    end = int(time.time()) // 60 * 60
    text = "\n".join(line for line in openmetrics(shop.workloads[:2], end, span=3600).splitlines()
                     if not line.startswith("unthrottle_")) + "\n"  # fmt: skip
    with PrometheusServer(tmp_path, openmetrics=text) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        result = scan(shop.request(end, window_s=3000), source, shop.store)
    assert [p.kind for p in result.problems] == [ProblemKind.COUNTERS_ONLY]
    assert all(c.evidence == "counters" for w in result.workloads for c in w.containers)


def test_an_unreachable_prometheus_raises_a_typed_error(shop: Shop) -> None:
    source = PrometheusSource(PrometheusConfig(f"http://127.0.0.1:{free_port()}", retries=0))
    with pytest.raises(MetricsError, match="unreachable"):
        scan(shop.request(int(time.time())), source, shop.store)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ({"status": 500}, "500"),
        ({"status": None, "delay": 5.0}, "timed out"),
        ({"status": None, "disconnect": True}, "Connection aborted"),
    ],
    ids=["an API server that answers 500", "one that answers too late",
         "one that drops the connection"],
)  # fmt: skip
def test_an_api_server_that_fails_raises_a_cluster_error_before_any_query(
    shop: Shop, tmp_path: Path, fault: dict[str, object], message: str
) -> None:
    source = PrometheusSource(PrometheusConfig(f"http://127.0.0.1:{free_port()}", retries=0))
    with FaultProxy(shop.kube) as proxy:
        store = workload_store(shop.kube.api_client(proxy.kubeconfig(tmp_path / "kubeconfig")),
                               timeout_s=1.0)  # fmt: skip
        proxy.fail_next("GET", r"/deployments$", count=10, **fault)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(ClusterError, match="cannot read Deployments") as error:
            scan(shop.request(int(time.time())), source, store)
        assert time.monotonic() - started < 30  # the store's timeout, not a hang
        assert proxy.requests("GET", rf"/namespaces/{shop.namespace}/deployments$")
    assert message in str(error.value)
    assert source.queries == 0  # Prometheus is not asked about Deployments it cannot name


@pytest.mark.parametrize(
    "fields",
    [{"window_s": 0, "now": 1.0}, {"window_s": 60, "now": 1.0, "concurrency": 0}],
    ids=["a window of 0 s", "no query in flight"],
)
def test_a_request_that_makes_no_sense_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ScanRequest(**fields)  # type: ignore[arg-type]
