"""The pod's own quota and the kubelet's PSI, read from a real Prometheus holding an hour of
series labelled as a real kubelet's cAdvisor exports them (issue 28 §1 and §3).

On a real kubelet (cgroupfs driver, containerd: tests/cluster/test_agent_real_node.py) a pod's
``container=""`` series are two cgroups told apart only by ``id``: the pod cgroup's (with
the pod's quota, the sum of its containers' limits) and the pause container's below it,
which has no quota, so cAdvisor gives it usage but no CFS counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from prom import PrometheusServer, requires_prometheus
from support.metrics_evidence import (
    gauge,
    series,
)
from support.recommend_cli import (
    cli,
)
from unthrottle.evidence.aggregates import WindowAggregates
from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.evidence.pods import canary_ratios
from unthrottle.metrics.promql import pod_counter_queries
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.podlevel import POD_ROW
from unthrottle.recommend import CounterEvidence, Current, Policy, Runtime, recommend
from unthrottle.report import Report, render_html, render_markdown
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult

pytestmark = requires_prometheus
NS = "shop"
HOUR = 3600
PAUSE = "registry.k8s.io/pause:3.10"


def _owned(lines: list[str], deploy: str, pod: str, now: int) -> None:
    gauge(lines, "kube_replicaset_owner", f'namespace="{NS}",replicaset="{deploy}-1",'
          f'owner_kind="Deployment",owner_name="{deploy}"', 1, now)  # fmt: skip
    gauge(lines, "kube_pod_owner", f'namespace="{NS}",pod="{pod}",owner_kind="ReplicaSet",'
          f'owner_name="{deploy}-1"', 1, now)  # fmt: skip


def _pod(lines: list[str], deploy: str, now: int, containers: dict[str, dict[str, float]],
         pod_level: dict[str, float] | None) -> None:  # fmt: skip
    """One pod's series as cAdvisor exports them: each container's (``id``, ``image``,
    ``name``), the pause container's ``container=""`` (usage only: no quota), and, when
    ``pod_level`` is given, the pod cgroup's ``container=""`` CFS counters (its own quota)."""
    pod = f"{deploy}-1-a"
    uid = f"0f0e{len(deploy):04d}-{deploy[:4]:x<4}-4000-8000-000000000001"
    cgroup = f"/kubepods/burstable/pod{uid}"
    _owned(lines, deploy, pod, now)
    for n, (container, rates) in enumerate(sorted(containers.items())):
        cid = f"{n + 1:064x}"
        labels = (f'container="{container}",id="{cgroup}/{cid}",image="docker.io/library/'
                  f'{container}:1",name="{cid}",namespace="{NS}",pod="{pod}"')  # fmt: skip
        for metric, rate in rates.items():
            if metric == "limit":
                gauge(lines, "kube_pod_container_resource_limits", f'namespace="{NS}",pod="{pod}",'
                      f'container="{container}",resource="cpu"', rate, now)  # fmt: skip
            else:
                series(lines, metric, labels, rate, now)
    pause = f"{99:064x}"
    series(lines, "container_cpu_usage_seconds_total", f'id="{cgroup}/{pause}",image="{PAUSE}",'
           f'name="{pause}",namespace="{NS}",pod="{pod}"', 0.0001, now)  # fmt: skip
    if pod_level is not None:
        own = f'id="{cgroup}",namespace="{NS}",pod="{pod}"'
        series(
            lines,
            "container_cpu_usage_seconds_total",
            own,
            sum(r["container_cpu_usage_seconds_total"] for r in containers.values()),
            now,
        )
        for metric, rate in pod_level.items():
            series(lines, metric, own, rate, now)


ONE = {  # one container at 500m, a fifth of its periods throttled by its own quota
    "limit": 0.5,
    "container_cpu_usage_seconds_total": 0.45,
    "container_cpu_cfs_periods_total": 10,
    "container_cpu_cfs_throttled_periods_total": 2,
    "container_cpu_cfs_throttled_seconds_total": 0.1,
}
NO_BURST_USED = {  # cAdvisor #3795 exports them for every cgroup with a quota
    "container_cpu_cfs_burst_periods_total": 0,
    "container_cpu_cfs_burst_seconds_total": 0,
}
BURST_USED = {  # the agent's copies, where cAdvisor has none
    "unthrottle_cpu_cfs_bursts_total": 0.5,
    "unthrottle_cpu_cfs_burst_seconds_total": 0.01,
}
POD_QUOTA = {  # its pod's own quota (500m, the same) throttled it in three more periods a second
    "container_cpu_cfs_periods_total": 10,
    "container_cpu_cfs_throttled_periods_total": 3,
    "container_cpu_cfs_throttled_seconds_total": 0.2,
}


def _container(usage: float) -> dict[str, float]:
    return {"limit": 0.5, "container_cpu_usage_seconds_total": usage,
            "container_cpu_cfs_periods_total": 10,
            "container_cpu_cfs_throttled_periods_total": 0.1}  # fmt: skip


def history(now: int) -> str:
    lines: list[str] = []
    _pod(lines, "quota", now, {"app": {**ONE, **NO_BURST_USED}}, POD_QUOTA)
    _pod(lines, "free", now, {"app": ONE}, None)  # the same container, no pod quota
    # two containers under a 1-CPU pod quota, using 3:1, each active in every period
    _pod(lines, "duo", now, {"main": {**_container(0.3), **BURST_USED}, "side": _container(0.1)},
         {"container_cpu_cfs_periods_total": 10,
          "container_cpu_cfs_throttled_periods_total": 4,
          "container_cpu_cfs_throttled_seconds_total": 0.4})  # fmt: skip
    # a busy cgroup v2 node: hardly throttled, but its thread waited half of the time
    busy = {**_container(0.45), "container_pressure_cpu_waiting_seconds_total": 0.5}
    _pod(lines, "busy", now, {"app": busy}, None)
    # throttled past the target, and waiting behind other processes besides
    hot = {**ONE, "container_pressure_cpu_waiting_seconds_total": 0.6}
    _pod(lines, "hot", now, {"app": hot}, None)
    _agent_only(lines, now)
    return "\n".join(lines) + "\n"


def _agent_only(lines: list[str], now: int) -> None:
    """A cluster that scrapes only the agent: its series carry ``namespace``, ``pod`` and
    ``container`` alone, the pod cgroup as ``container=""``; its wait holds the pod's
    throttled time (bench/pod_wait.py) besides 0.2 s/s behind other processes."""
    pod = "agent-1-a"
    _owned(lines, "agent", pod, now)
    gauge(lines, "kube_pod_container_resource_limits", f'namespace="{NS}",pod="{pod}",'
          'container="app",resource="cpu"', 0.5, now)  # fmt: skip
    app, own = f'namespace="{NS}",pod="{pod}",container="app"', f'namespace="{NS}",pod="{pod}"'
    for name, rate in (("usage_seconds", 0.45), ("cfs_periods", 10),
                       ("cfs_throttled_periods", 1), ("cfs_throttled_seconds", 0.05),
                       ("wait_seconds", 0.5)):  # fmt: skip
        series(lines, f"unthrottle_cpu_{name}_total", app, rate, now)
    for name, rate in (("usage_seconds", 0.45), ("cfs_periods", 10),
                       ("cfs_throttled_periods", 4), ("cfs_throttled_seconds", 0.25)):  # fmt: skip
        series(lines, f"unthrottle_cpu_{name}_total", f'{own},container=""', rate, now)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    now = int(time.time())
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=history(now)) as prom:
        yield prom.url, now


@pytest.fixture(scope="module")
def found(prometheus: tuple[str, int]) -> dict[WorkloadKey, ContainerEvidence]:
    url, now = prometheus
    source = PrometheusSource(PrometheusConfig(url))
    out = fetch(source, [NS], HOUR, at=now)
    # the pod level and PSI ride along: no query of their own (the 11th is the backlog's)
    assert source.queries == 11
    return out


def _key(deploy: str, container: str = "app") -> WorkloadKey:
    return WorkloadKey(NS, deploy, container)


class TestThePodsOwnQuota:
    def test_a_container_whose_pod_was_throttled_reads_more_throttled(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        quota, free = found[_key("quota")], found[_key("free")]
        assert free.throttle_ratio() == pytest.approx(0.2, abs=0.01)
        assert quota.throttle_ratio() == pytest.approx(0.5, abs=0.02)  # 2 + 3 in 10
        assert quota.pod_throttled_s == pytest.approx(0.2 * HOUR, rel=0.03)
        assert free.pod_throttled_s == 0  # the pause container's container="" adds nothing
        assert quota.counters(HOUR).throttled_s == pytest.approx(0.3 * HOUR, rel=0.03)

    def test_and_is_recommended_a_higher_limit_with_the_reason(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        today, policy = Current(500), Policy(max_step_up=4)
        quota = recommend(found[_key("quota")].counters(HOUR), today, policy)
        free = recommend(found[_key("free")].counters(HOUR), today, policy)
        assert quota.limit_millicores is not None and free.limit_millicores is not None
        assert quota.limit_millicores > free.limit_millicores
        assert any("pod's own quota" in r for r in quota.reasons), quota.reasons
        assert not any("pod's own quota" in r for r in free.reasons)

    def test_the_agents_pod_series_count_too_and_its_wait_holds_them(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        agent = found[_key("agent")]
        assert agent.throttle_ratio() == pytest.approx(0.5, abs=0.02)  # 1 + 4 in 10
        assert agent.pod_throttled_s == pytest.approx(0.25 * HOUR, rel=0.03)
        waits = agent.waits()
        assert waits is not None and not waits.from_pressure
        # the wait (0.5 s/s) holds the throttled time, the pod's too (0.3 s/s): the rest
        # (0.2 s/s) was behind other processes
        assert waits.throttled_s == pytest.approx(0.3 * HOUR, rel=0.03)
        assert waits.contention_s == pytest.approx(0.2 * HOUR, rel=0.05)

    def test_a_multi_container_pod_shares_its_throttled_time_by_usage(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        main, side = found[_key("duo", "main")], found[_key("duo", "side")]
        # 0.4 s/s of pod throttled time, used 3:1
        assert main.pod_throttled_s == pytest.approx(0.3 * HOUR, rel=0.03)
        assert side.pod_throttled_s == pytest.approx(0.1 * HOUR, rel=0.03)
        # a throttled period of the pod stalls both, each active in every period
        for item in (main, side):
            assert item.throttle_ratio() == pytest.approx(0.41, abs=0.02)

    def test_the_operators_sliding_window_reads_the_same(
        self, prometheus: tuple[str, int], found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        url, now = prometheus
        slots = fetch_slots(PrometheusSource(PrometheusConfig(url)), [NS], now - HOUR, now,
                            slot_s=600)  # fmt: skip
        agg = WindowAggregates(HOUR, 600)
        for slot in slots:
            agg.fold(slot)
        back = WindowAggregates.from_bytes(agg.to_bytes()).evidence(now)
        for key in (_key("quota"), _key("duo", "main"), _key("duo", "side")):
            assert back[key].pod_throttled_s == pytest.approx(found[key].pod_throttled_s, rel=0.05)
            ratio = found[key].throttle_ratio()
            assert back[key].throttle_ratio() == pytest.approx(ratio, abs=0.02)
        assert back[_key("busy")].pressure_s == pytest.approx(0.5 * HOUR, rel=0.05)
        # a burst never used (0) stays apart from burst counters not exported (None)
        assert back[_key("quota")].burst_periods == 0 and back[_key("free")].burst_periods is None

    def test_an_inplace_canary_is_verified_by_the_same_measure(
        self, prometheus: tuple[str, int], found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        """The canary's queries (one pod's containers and its own cgroup) give each
        container the ratio its recommendation was made from, pod share included: a
        canary whose new pod quota throttles it does not pass on its own counters."""
        url, now = prometheus
        source = PrometheusSource(PrometheusConfig(url))
        for deploy, containers in (("quota", ["app"]), ("free", ["app"]),
                                   ("agent", ["app"]), ("duo", ["main", "side"])):  # fmt: skip
            queries = pod_counter_queries(NS, f"{deploy}-1-a", HOUR)

            def per(name: str, queries: dict[str, str] = queries) -> dict[str, float]:
                return {str(s.labels.get("container", "")): s.value
                        for s in source.instant(queries[name], at=now)}  # fmt: skip

            ratios = canary_ratios(per("usage_seconds"), per("periods"),
                                   per("throttled_periods"))  # fmt: skip
            assert sorted(c for c in ratios if c != POD_ROW) == containers, (deploy, ratios)
            for container in containers:
                ratio, periods = ratios[container]
                assert periods > 0
                expected = found[_key(deploy, container)].throttle_ratio()
                assert ratio == pytest.approx(expected, abs=0.02), (deploy, container)
        # the pod cgroup's own ratio is the row of a pod-level limit
        assert canary_ratios({}, {"app": 10.0, "": 10.0}, {"app": 2.0, "": 3.0}) == {
            "app": (0.5, 10.0),
            POD_ROW: (0.3, 10.0),
        }


class TestTheKubeletsPressure:
    def test_psi_is_read_beside_the_counters(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        busy = found[_key("busy")]
        assert busy.wait_s is None and busy.pressure_s == pytest.approx(0.5 * HOUR, rel=0.03)
        waits = busy.waits()
        assert waits is not None and waits.from_pressure and waits.mostly_contention
        assert found[_key("free")].pressure_s is None  # a cgroup v1 node: no series

    def test_waiting_behind_others_under_the_target_is_an_oversubscribed_node(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        rec = recommend(found[_key("busy")].counters(HOUR), Current(500), Policy())
        assert rec.limit_millicores == 500
        assert any("oversubscribed" in r and "PSI" in r for r in rec.reasons), rec.reasons
        assert not any("contention can hide demand" in r for r in rec.reasons)

    def test_throttled_past_the_target_the_demand_counts_the_wait(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        today, policy = Current(500), Policy(max_step_up=4)
        hot = recommend(found[_key("hot")].counters(HOUR), today, policy)
        same = recommend(found[_key("free")].counters(HOUR), today, policy)  # no PSI
        # PSI 0.6 s/s less 0.1 s/s throttled: at least 0.5 core waited behind others
        assert hot.limit_millicores is not None and same.limit_millicores is not None
        assert hot.limit_millicores >= (450 + 500) * 1.1 > same.limit_millicores
        assert any("PSI" in r and "lower bound" in r for r in hot.reasons), hot.reasons


class TestTheBurstCounters:
    def test_are_read_where_exported_and_a_zero_is_a_burst_never_used(
        self, found: dict[WorkloadKey, ContainerEvidence]
    ) -> None:
        assert found[_key("quota")].burst_periods == 0  # cAdvisor's, exported, never used
        main = found[_key("duo", "main")]  # the agent's copies
        assert main.burst_periods == pytest.approx(0.5 * HOUR, rel=0.03)
        assert main.burst_s == pytest.approx(0.01 * HOUR, rel=0.03)
        assert found[_key("free")].burst_periods is None  # an older cAdvisor: not there

    def test_a_burst_never_used_under_the_target_is_dropped(self) -> None:
        unused = CounterEvidence(HOUR, 0.3, 36_000, 360, 10.0, burst_periods=0)
        used = CounterEvidence(HOUR, 0.3, 36_000, 360, 10.0, burst_periods=900)
        today = Current(500, burst_us=20_000)
        dropped = recommend(unused, today, Policy())
        assert dropped.burst_us == 0
        assert any("never used" in r for r in dropped.reasons), dropped.reasons
        assert recommend(used, today, Policy()).burst_us == 20_000
        unknown = CounterEvidence(HOUR, 0.3, 36_000, 360, 10.0)  # no burst counters
        assert recommend(unknown, today, Policy()).burst_us == 20_000

    def test_the_report_says_a_burst_never_used_was_not_needed(self) -> None:
        rec = recommend(CounterEvidence(HOUR, 0.3, 36_000, 360, 10.0), Current(500, 0, 100_000,
                        20_000), Policy())  # fmt: skip

        def container(used: tuple[float, float] | None) -> ContainerResult:
            return ContainerResult("app", 500, 250, 20_000, None, Runtime.OTHER, "counters", 1,
                                   0.01, None, rec, burst_used=used)  # fmt: skip

        scan = ScanResult(1_796_000_000, HOUR, 0.05, (
            WorkloadResult(NS, "idle-burst", (container((0, 0)),)),
            WorkloadResult(NS, "busy-burst", (container((1200, 3.5)),)),
            WorkloadResult(NS, "old-cadvisor", (container(None),)),
        ))  # fmt: skip
        report = Report.from_scan(scan)
        markdown, html = render_markdown(report), render_html(report)
        for out in (markdown, html):
            assert out.count("was never used in the window") == 1
            assert "a burst that is never used was not needed" in out
            assert "was used in 1200 periods, 3.5 s of CPU above the quota" in out
        doc = scan.to_json("1h")
        by_name = {w["deployment"]: w["containers"][0] for w in doc["workloads"]}
        assert by_name["idle-burst"]["burst_used"] == {"periods": 0, "seconds": 0}
        assert "burst_used" not in by_name["old-cadvisor"]


def test_the_recommend_cli_gets_both(prometheus: tuple[str, int]) -> None:
    url, _ = prometheus
    out = cli("--prometheus", url, "--no-cluster", "--namespace", NS, "--window", "1h",
              "--format", "json", "--max-step-up", "4")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    by_name = {w["deployment"]: w["containers"][0] for w in doc["workloads"]}
    quota, free = by_name["quota"], by_name["free"]
    assert quota["throttle_ratio"] == pytest.approx(0.5, abs=0.02)
    assert quota["recommendation"]["limit_millicores"] > free["recommendation"]["limit_millicores"]
    assert any("pod's own quota" in r for r in quota["recommendation"]["reasons"])
    assert any("PSI" in r for r in by_name["busy"]["recommendation"]["reasons"])
    assert quota["burst_used"] == {"periods": 0, "seconds": 0}
    assert "burst_used" not in free
