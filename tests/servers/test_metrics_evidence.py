"""Evidence per Deployment container from a real Prometheus holding an hour of history."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.metrics_evidence import (
    GONE,
    HOUR,
    gauge,
    history,
    series,
)
from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import QUERIES_WITH_OWNERS, fetch, queries
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.recommend import Current, Policy, Strategy, recommend
from unthrottle.recommend.engine import ORDER_UNKNOWN

pytestmark = requires_prometheus


def test_deployments_get_their_evidence_in_eleven_queries(tmp_path: Path) -> None:
    now = int(time.time())
    with PrometheusServer(tmp_path, openmetrics=history(now)) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        announced: list[str] = []
        found = fetch(source, ["shop"], 3600, at=now, on_query=announced.append)
    assert source.queries == 11 == len(announced)
    assert "container_cpu_cfs_periods_total" in announced
    assert set(found) == {WorkloadKey("shop", "api", "api"), WorkloadKey("shop", "batch", "main"),
                          WorkloadKey("shop", "idle", "web")}  # fmt: skip
    api = found[WorkloadKey("shop", "api", "api")]
    assert api.pods == {"api-7d9f-a", "api-7d9f-b", GONE}  # the gone pod counts too
    assert api.kind == "period"
    assert api.throttle_ratio() == pytest.approx(0.5, abs=0.02)
    # usage per active period, whatever the churn: 0.45 core-seconds per second of periods
    assert api.counters(3600).usage_cores == pytest.approx(0.45, rel=0.05)
    assert (api.limit_millicores, api.request_millicores) == (500, 250)
    batch, idle = (
        found[WorkloadKey("shop", "batch", "main")],
        found[WorkloadKey("shop", "idle", "web")],
    )
    assert batch.kind == "counters" and batch.counters(3600).usage_cores == pytest.approx(
        1.8, rel=0.05
    )
    assert idle.kind == "none" and idle.limit_millicores == 1000

    # The agent's histogram says one window in ten wants ~1.1 cores: 0.5 CPU will not do.
    # A limit alone must cover those windows; Auto lets a burst absorb them instead.
    evidence = api.period_evidence()
    today = Current(500, 250)
    alone = recommend(evidence, today, Policy(strategy=Strategy.LIMIT_ONLY, max_step_up=4))
    auto = recommend(evidence, today, Policy(max_step_up=4))
    assert alone.limit_millicores is not None and alone.limit_millicores > 1000
    assert auto.limit_millicores is not None and 500 < auto.limit_millicores < 1000
    assert auto.burst_us > 0
    for rec in (alone, auto):
        assert rec.expected_throttle_ratio is not None and rec.expected_throttle_ratio <= 0.05
        assert rec.current_throttle_ratio == pytest.approx(0.5, abs=0.02)

    # The backlog series came back through Prometheus, summed over the pods (two for the
    # hour, one for half of it), and the burst stands: they say the peak stands apart.
    assert api.active_windows == pytest.approx(10 * 2.5 * HOUR, rel=0.02)
    assert api.backlog[(500, 1.0)] == pytest.approx(2.5 * HOUR, rel=0.02)
    assert api.backlog[(8000, 0.0)] == 0 and len(api.backlog) == 35
    assert evidence.backlog is not None
    assert ORDER_UNKNOWN not in auto.reasons and auto.burst_us > 0
    assert batch.backlog == {} and batch.active_windows is None


def test_agent_counters_fill_in_where_cadvisor_has_none(tmp_path: Path) -> None:
    now = int(time.time())
    lines: list[str] = []
    for deploy in ("both", "agent"):
        gauge(lines, "kube_replicaset_owner", f'namespace="ops",replicaset="{deploy}-1",'
              f'owner_kind="Deployment",owner_name="{deploy}"', 1, now)  # fmt: skip
        gauge(lines, "kube_pod_owner", f'namespace="ops",pod="{deploy}-1-a",'
              f'owner_kind="ReplicaSet",owner_name="{deploy}-1"', 1, now)  # fmt: skip
    both = 'namespace="ops",pod="both-1-a",container="c"'
    series(lines, "container_cpu_cfs_periods_total", both, 10, now)
    series(lines, "container_cpu_cfs_throttled_periods_total", both, 2, now)
    series(lines, "unthrottle_cpu_cfs_periods_total", both, 10, now)  # the same cgroup, twice
    series(lines, "unthrottle_cpu_cfs_throttled_periods_total", both, 2, now)
    agent = 'namespace="ops",pod="agent-1-a",container="c"'
    series(lines, "unthrottle_cpu_cfs_periods_total", agent, 10, now)
    series(lines, "unthrottle_cpu_cfs_throttled_periods_total", agent, 7, now)
    with PrometheusServer(tmp_path, openmetrics="\n".join(lines) + "\n") as prom:
        found = fetch(PrometheusSource(PrometheusConfig(prom.url)), ["ops"], 3600, at=now)
    counted = found[WorkloadKey("ops", "both", "c")]
    assert counted.periods == pytest.approx(36_000, rel=0.02)  # cAdvisor's, not summed twice
    assert counted.throttle_ratio() == pytest.approx(0.2, abs=0.01)
    assert found[WorkloadKey("ops", "agent", "c")].throttle_ratio() == pytest.approx(0.7, abs=0.01)


def test_a_query_prometheus_refuses_is_an_error_naming_its_reason(tmp_path: Path) -> None:
    # a server that may load only 100 samples per query: an hour at 15 s is 241 per series
    now = int(time.time())
    flags = ("--query.max-samples=100",)
    with PrometheusServer(tmp_path, openmetrics=history(now), flags=flags) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        began = time.monotonic()
        with pytest.raises(MetricsError) as caught:
            fetch(source, ["shop"], 3600, at=now)
        took = time.monotonic() - began
    assert "too many samples" in str(caught.value)
    assert "narrow it with --namespace or a shorter --window" in str(caught.value)
    assert source.queries <= QUERIES_WITH_OWNERS and took < 30


def test_a_query_too_big_for_prometheus_is_sent_again_per_namespace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 60 containers in each of two namespaces. Prometheus may hold 330 samples per query:
    # an hour of one series (241) and one namespace's answers fit, both namespaces' do not.
    now = int(time.time())
    lines: list[str] = []
    for ns in ("n1", "n2"):
        for i in range(60):
            rs, pod = f"app{i}-6b7d", f"app{i}-6b7d-z{i % 10}x4k"
            gauge(lines, "kube_replicaset_owner", f'namespace="{ns}",replicaset="{rs}",'
                  f'owner_kind="Deployment",owner_name="app{i}"', 1, now)  # fmt: skip
            gauge(lines, "kube_pod_owner", f'namespace="{ns}",pod="{pod}",'
                  f'owner_kind="ReplicaSet",owner_name="{rs}"', 1, now)  # fmt: skip
            labels = f'namespace="{ns}",pod="{pod}",container="c"'
            series(lines, "container_cpu_cfs_periods_total", labels, 10, now)
            series(lines, "container_cpu_cfs_throttled_periods_total", labels, i / 10, now)
    flags = ("--query.max-samples=330",)
    with PrometheusServer(tmp_path, openmetrics="\n".join(lines) + "\n", flags=flags) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        with pytest.raises(MetricsError):  # the whole thing at once is refused
            source.instant(queries(["n1", "n2"], 3600, with_owners=True)["periods"], now)
        found = fetch(source, ["n1", "n2"], 3600, at=now)
    assert len(found) == 120
    for ns in ("n1", "n2"):
        item = found[WorkloadKey(ns, "app30", "c")]
        assert item.throttle_ratio() == pytest.approx(0.3, abs=0.01)
        assert item.periods == pytest.approx(36_000, rel=0.02)
    assert "sending it once per namespace instead (2 queries)" in caplog.text
