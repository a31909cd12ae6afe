"""The scan pipeline that `recommend` and the operator share, over a real Prometheus and the
Kubernetes API served by the emulator over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from kmock_thread import KmockThread
from prom import PrometheusServer, free_port, requires_prometheus
from shop import HEALTHY, THROTTLED, Workload, objects, openmetrics
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.model.selector import parse_selector
from unthrottle.scan import ProblemKind, ScanRequest, scan

pytestmark = requires_prometheus
DAY = 86_400
OTHER = Workload("web", "frontend", 0.1, 0.10, 1.2, 0.5, 1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorkloadStore]:
    with KmockThread() as kmock:
        for w in (THROTTLED, HEALTHY, OTHER):
            for resource, obj in objects(w):
                kmock.put(resource, obj)
        cfg = client.Configuration()
        path = kmock.kubeconfig(tmp_path_factory.mktemp("kube") / "config")
        config.load_kube_config(config_file=str(path), client_configuration=cfg)
        api = client.ApiClient(cfg)
        yield KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusSource, int]]:
    end = int(time.time()) // 60 * 60
    text = openmetrics([THROTTLED, HEALTHY, OTHER], end)
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=text) as prom:
        yield PrometheusSource(PrometheusConfig(prom.url)), end


def _request(end: int, **changes: object) -> ScanRequest:
    fields: dict[str, object] = {"window_s": DAY // 2, "now": end, "namespaces": ("shop",)}
    fields.update(changes)
    return ScanRequest(**fields)  # type: ignore[arg-type]


def test_a_throttled_deployment_gets_a_higher_limit_and_a_healthy_one_none(
    cluster: KubeWorkloadStore, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    result = scan(_request(end), source, cluster)
    assert result.fatal is None and not result.problems
    first = result.workloads[0]
    assert first.deployment == "checkout"  # the most harmful first
    checkout = first.containers[0]
    assert checkout.evidence == "period"
    assert checkout.throttle_ratio == pytest.approx(THROTTLED.throttled_share(), abs=0.02)
    assert checkout.recommendation is not None
    assert checkout.recommendation.limit_millicores is not None
    assert checkout.recommendation.limit_millicores > 500
    catalog = next(w for w in result.workloads if w.deployment == "catalog").containers[0]
    assert catalog.recommendation is not None
    assert (catalog.recommendation.limit_millicores or 0) <= 1000
    assert {w.namespace for w in result.workloads} == {"shop"}  # the namespace boundary


def test_the_clock_is_an_input_so_a_result_is_reproducible(
    cluster: KubeWorkloadStore, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    one = scan(_request(end - 600), source, cluster).to_json("12h")
    two = scan(_request(end - 600), source, cluster).to_json("12h")
    assert one == two
    assert one["generated_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end - 600))


def test_containers_the_request_leaves_out_are_listed_without_a_recommendation(
    cluster: KubeWorkloadStore, history: tuple[PrometheusSource, int]
) -> None:
    source, end = history
    result = scan(_request(end, containers=frozenset({"sidecar"})), source, cluster)
    containers = [c for w in result.workloads for c in w.containers]
    assert containers and all(not c.managed and c.recommendation is None for c in containers)


def test_skipped_deployments_are_listed_without_a_recommendation(
    cluster: KubeWorkloadStore, history: tuple[PrometheusSource, int]
) -> None:
    from unthrottle.scan import assess, gather, select

    source, end = history
    request = _request(end)
    selection = select(request, cluster, source)
    found, problems = gather(request, source, selection)
    result = assess(request, selection, found, problems=problems,
                    skip=frozenset({("shop", "checkout")}))  # fmt: skip
    checkout = next(w for w in result.workloads if w.deployment == "checkout")
    assert checkout.containers[0].recommendation is None
    assert checkout.containers[0].throttle_ratio is not None  # still shown as it is


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"selector": parse_selector("team=nobody")}, ProblemKind.NO_DEPLOYMENTS),
        ({"namespaces": ("empty",)}, ProblemKind.NO_DEPLOYMENTS),
    ],
    ids=["a selector that matches nothing", "a namespace with no Deployments"],
)
def test_problems_come_back_as_data_not_exits(
    cluster: KubeWorkloadStore, history: tuple[PrometheusSource, int],
    changes: dict[str, object], kind: ProblemKind,
) -> None:  # fmt: skip
    source, end = history
    result = scan(_request(end, **changes), source, cluster)
    assert result.fatal is not None and result.fatal.kind == kind
    assert "no Deployments found" in result.fatal.message


def test_deployments_without_counters_are_a_problem_named_for_people(
    cluster: KubeWorkloadStore, tmp_path: Path
) -> None:
    with PrometheusServer(tmp_path) as prom:  # an empty Prometheus
        result = scan(_request(int(time.time())), PrometheusSource(PrometheusConfig(prom.url)),
                      cluster)  # fmt: skip
    assert result.fatal is not None and result.fatal.kind == ProblemKind.NO_COUNTERS
    assert "container_cpu_cfs_periods_total" in result.fatal.message
    assert {w.deployment for w in result.workloads} == {"checkout", "catalog"}  # still listed


def test_counters_without_the_agent_are_noted(cluster: KubeWorkloadStore, tmp_path: Path) -> None:
    end = int(time.time()) // 60 * 60
    text = "\n".join(line for line in openmetrics([THROTTLED, HEALTHY], end, span=3600).splitlines()
                     if not line.startswith("unthrottle_")) + "\n"  # fmt: skip
    with PrometheusServer(tmp_path, openmetrics=text) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        result = scan(_request(end, window_s=3000), source, cluster)
    assert [p.kind for p in result.problems] == [ProblemKind.COUNTERS_ONLY]
    assert all(c.evidence == "counters" for w in result.workloads for c in w.containers)


def test_an_unreachable_prometheus_raises_a_typed_error(cluster: KubeWorkloadStore) -> None:
    source = PrometheusSource(PrometheusConfig(f"http://127.0.0.1:{free_port()}", retries=0))
    with pytest.raises(MetricsError, match="unreachable"):
        scan(_request(int(time.time())), source, cluster)


@pytest.mark.parametrize(
    "fields",
    [{"window_s": 0, "now": 1.0}, {"window_s": 60, "now": 1.0, "concurrency": 0}],
    ids=["a window of 0 s", "no query in flight"],
)
def test_a_request_that_makes_no_sense_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ScanRequest(**fields)  # type: ignore[arg-type]
