"""Evidence per Deployment container from a real Prometheus holding an hour of history."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import QUERIES_WITH_OWNERS, fetch, queries
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.recommend import Current, Policy, Strategy, recommend
from unthrottle.recommend.engine import ORDER_UNKNOWN

pytestmark = requires_prometheus
HOUR = 3600
STEP = 15
GONE = "api-7d9f-q8wzt"
"""An api pod that lived the first half hour (a name as the ReplicaSet controller makes)."""


def series(lines: list[str], name: str, labels: str, rate: float, now: int,
           start: int = 0, stop: int = HOUR) -> None:  # fmt: skip
    """A counter growing at ``rate`` per second between ``start`` and ``stop`` (seconds ago)."""
    for ago in range(HOUR, -1, -STEP):
        if HOUR - start >= ago >= HOUR - stop:
            lines.append(f"{name}{{{labels}}} {rate * (HOUR - ago - start)} {now - ago}")


def gauge(lines: list[str], name: str, labels: str, value: float, now: int,
          stop: int = HOUR) -> None:  # fmt: skip
    """A gauge from an hour ago until ``stop`` seconds into the hour."""
    for ago in range(HOUR, HOUR - stop - 1, -STEP):
        lines.append(f"{name}{{{labels}}} {value} {now - ago}")


LEVELS = ("0.1", "0.25", "0.5", "1", "2", "4", "8")
OVERS = ("0", "0.25", "0.5", "1", "2")
API_BACKLOG = {(level, over): 0 for level in LEVELS for over in OVERS}
API_BACKLOG.update({(level, over): 10 for level in ("0.1", "0.25") for over in OVERS})
API_BACKLOG.update({("0.5", "0"): 4, ("0.5", "0.25"): 3, ("0.5", "0.5"): 2, ("0.5", "1"): 1})
API_BACKLOG[("1", "0")] = 1
"""Windows per second whose backlog above a level (cores) passed a threshold (quotas)."""


def history(now: int) -> str:
    lines: list[str] = []
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="api-7d9f",'
          'owner_kind="Deployment",owner_name="api"', 1, now)  # fmt: skip
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="batch-1",'
          'owner_kind="Deployment",owner_name="batch"', 1, now)  # fmt: skip
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="idle-1",'
          'owner_kind="Deployment",owner_name="idle"', 1, now)  # fmt: skip
    pods = {"api-7d9f-a": "api-7d9f", "api-7d9f-b": "api-7d9f", GONE: "api-7d9f",
            "batch-1-x": "batch-1", "idle-1-y": "idle-1"}  # fmt: skip
    for pod, rs in pods.items():  # GONE was deleted half-way: its series stop there
        gauge(lines, "kube_pod_owner", f'namespace="shop",pod="{pod}",owner_kind="ReplicaSet",'
              f'owner_name="{rs}"', 1, now, stop=HOUR // 2 if pod == GONE else HOUR)  # fmt: skip
    resources = [
        ("api-7d9f-a", "api", 0.5, 0.25),
        ("api-7d9f-b", "api", 0.5, 0.25),
        ("batch-1-x", "main", 2, 1),
        ("idle-1-y", "web", 1, 0.1),
    ]
    for pod, container, limit, request in resources:
        for metric, value in (("limits", limit), ("requests", request)):
            gauge(lines, f"kube_pod_container_resource_{metric}",
                  f'namespace="shop",pod="{pod}",container="{container}",resource="cpu"',
                  value, now)  # fmt: skip
    # api: three pods, "c" only in the first half hour (churn); 10 periods/s, half throttled
    for pod, stop in (("api-7d9f-a", HOUR), ("api-7d9f-b", HOUR), (GONE, HOUR // 2)):
        labels = f'namespace="shop",pod="{pod}",container="api"'
        series(lines, "container_cpu_usage_seconds_total", labels, 0.45, now, stop=stop)
        series(lines, "container_cpu_cfs_periods_total", labels, 10, now, stop=stop)
        series(lines, "container_cpu_cfs_throttled_periods_total", labels, 5, now, stop=stop)
        series(lines, "container_cpu_cfs_throttled_seconds_total", labels, 0.3, now, stop=stop)
        # the agent: per 10 windows/s, 7 under 0.25 core, 2 under 0.5, 1 around 1.1 cores
        cumulative = {"0.25": 7, "0.5": 9, "1.0": 9, "1.25": 10, "+Inf": 10}
        for le, per_s in cumulative.items():
            series(lines, "unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"', per_s, now,
                   stop=stop)  # fmt: skip
        # … and its backlog: the 1.1-core window stands apart, the bucket refills after it
        for (level, over), per_s in API_BACKLOG.items():
            series(lines, "unthrottle_cpu_demand_backlog_windows_total",
                   f'{labels},level="{level}",over="{over}"', per_s, now, stop=stop)  # fmt: skip
        series(lines, "unthrottle_cpu_active_windows_total", labels, 10, now, stop=stop)
    # batch: cAdvisor only, steady 1.8 cores, hardly throttled
    labels = 'namespace="shop",pod="batch-1-x",container="main"'
    series(lines, "container_cpu_usage_seconds_total", labels, 1.8, now)
    series(lines, "container_cpu_cfs_periods_total", labels, 10, now)
    series(lines, "container_cpu_cfs_throttled_periods_total", labels, 0.1, now)
    # a bare pod (no owner) and the pause container are not Deployment containers
    series(lines, "container_cpu_cfs_periods_total", 'namespace="shop",pod="bare",container="x"',
           10, now)  # fmt: skip
    series(lines, "container_cpu_cfs_periods_total",
           'namespace="shop",pod="api-7d9f-a",container="POD"', 10, now)  # fmt: skip
    return "\n".join(lines) + "\n"


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
