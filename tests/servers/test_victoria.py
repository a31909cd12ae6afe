"""VictoriaMetrics as the metrics backend: the launcher, each difference from Prometheus
that was found and how unthrottle handles it, and how closely the two agree on the same
history (docs/metrics.md, "Compatible backends")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from prom import PrometheusServer, requires_prometheus
from support.metrics_evidence import (
    gauge,
    history,
    series,
)
from support.metrics_source import (
    HOSTILE,
)
from support.metrics_source import (
    history as hostile_history,
)
from support.victoria_shared import (
    API,
    HOUR,
    RATIO_SLACK,
    _recommended,
    _same,
    assert_close,
    counter,
    source,
)
from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.evidence.fetching import fetch, queries
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.metrics.promql import counter_queries, equals
from unthrottle.metrics.source import MetricsError
from victoria import VictoriaMetricsServer, prometheus_text, requires_victoria

pytestmark = requires_victoria


class TestTheLauncher:
    def test_openmetrics_becomes_prometheus_text_with_millisecond_timestamps(self) -> None:
        text = ('a_total{pod="x y",le="+Inf"} 3 1700000000\n# TYPE b gauge\n'
                "b 1.5 1700000000.25\nc{x=\"}\"} 2\n# EOF\n")  # fmt: skip
        assert list(prometheus_text(text)) == [
            'a_total{pod="x y",le="+Inf"} 3 1700000000000',
            "b 1.5 1700000000250",
            'c{x="}"} 2',
        ]

    def test_the_history_is_imported_whole_and_answers_at_once(self, tmp_path: Path) -> None:
        now = int(time.time())
        text = history(now)
        with VictoriaMetricsServer(tmp_path, openmetrics=text) as vm:
            assert vm.samples() == len(text.splitlines())
            (sample,) = source(vm.url).instant("timestamp(kube_replicaset_owner"
                                               '{owner_name="api"})', now)  # fmt: skip
        assert sample.value == now  # the last sample, imported a moment ago

    def test_it_is_ended_by_pid(self, tmp_path: Path) -> None:
        with VictoriaMetricsServer(tmp_path) as vm:
            assert vm.proc is not None
        assert vm.proc.poll() is not None
        with pytest.raises(MetricsError, match="unreachable"):
            source(vm.url).instant("vector(1)")


class TestTheDifferencesFound:
    def test_an_instant_query_near_now_is_evaluated_when_asked(self, tmp_path: Path) -> None:
        # VictoriaMetrics moves a query asked for within -search.latencyOffset (30 s) of its
        # clock 30 s back, unless it carries nocache=1, which PrometheusSource always sends
        now = int(time.time())
        text = counter("c_total", now, list(range(9)))
        with VictoriaMetricsServer(tmp_path, openmetrics=text) as vm:
            asked = {"query": "timestamp(c_total)", "time": now}
            plain = requests.get(f"{vm.url}/api/v1/query", params=asked, timeout=10)
            sent = source(vm.url).instant("timestamp(c_total)", now)
        assert float(plain.json()["data"]["result"][0]["value"][1]) == now - 30
        assert [s.value for s in sent] == [now]

    def test_a_range_query_of_many_steps_keeps_the_steps_asked(self, tmp_path: Path) -> None:
        # from 50 points on, VictoriaMetrics aligns start and end to multiples of the step
        # (for its response cache) unless nocache=1: the spans would not be those asked
        now = int(time.time()) // 60 * 60
        values = [k * k for k in range(481)]  # two hours, the rate growing all along
        start = now - 7000.5
        with VictoriaMetricsServer(tmp_path, openmetrics=counter("c_total", now, values)) as vm:
            (got,) = source(vm.url).range("increase(c_total[100000ms])", start + 100,
                                          start + 60 * 100, 100)  # fmt: skip
            plain = requests.get(f"{vm.url}/api/v1/query_range", timeout=10, params={
                "query": "increase(c_total[100000ms])", "start": f"{start + 100:.3f}",
                "end": f"{start + 6000:.3f}", "step": "100"}).json()  # fmt: skip
        assert got.times == [start + 100 * k for k in range(1, 61)]
        aligned = [t for t, _ in plain["data"]["result"][0]["values"]]
        assert aligned[0] % 100 == 0 and aligned[0] != start + 100

    @requires_prometheus
    def test_increase_is_exact_where_prometheus_extrapolates(self, tmp_path: Path) -> None:
        # a counter sampled every 15 s, its rate growing, read over an hour that does not
        # start on a sample: VictoriaMetrics takes the last sample before the range as its
        # base (the exact difference); Prometheus extrapolates what it sees in the range
        now = int(time.time()) // 60 * 60
        values = [k * k for k in range(481)]
        text = counter("c_total", now, values)
        (tmp_path / "p").mkdir()
        with (VictoriaMetricsServer(tmp_path, openmetrics=text) as vm,
              PrometheusServer(tmp_path / "p", openmetrics=text) as prom):  # fmt: skip
            at = now - 7
            (exact,) = source(vm.url).instant("increase(c_total[1h])", at)
            (extrapolated,) = source(prom.url).instant("increase(c_total[1h])", at)
        assert exact.value == values[-2] - values[-2 - 240]
        assert extrapolated.value != exact.value
        assert extrapolated.value == pytest.approx(exact.value, rel=0.01)

    def test_a_short_read_is_one_span_not_two_victoria_metrics_would_rewrite(
        self, tmp_path: Path
    ) -> None:
        # 90 s read on 60 s slots: two spans of 45 s would be a range query with a step
        # under a minute, whose last point VictoriaMetrics replaces by the one before it when
        # it is within -search.latencyOffset of its clock; the burst is in that last point
        now = int(time.time())
        values = [10.0 * k for k in range(20)] + [190.0 + 100 * k for k in range(1, 4)]
        lines = counter("container_cpu_cfs_periods_total", now, values).replace(
            'a="1"', 'namespace="ns",pod="p-1-x",container="c"')  # fmt: skip
        for ago in range(0, 330, 15):
            lines += (f'kube_pod_owner{{namespace="ns",pod="p-1-x",owner_kind="ReplicaSet",'
                      f'owner_name="p-1"}} 1 {now - ago}\n'
                      f'kube_replicaset_owner{{namespace="ns",replicaset="p-1",'
                      f'owner_kind="Deployment",owner_name="p"}} 1 {now - ago}\n')  # fmt: skip
        key = WorkloadKey("ns", "p", "c")
        with VictoriaMetricsServer(tmp_path, openmetrics=lines) as vm:
            slots = fetch_slots(source(vm.url), ["ns"], now - 90, now, slot_s=60)
            whole = fetch(source(vm.url), ["ns"], 90, at=now)
        read = sum(s.evidence.get(key, ContainerEvidence(key)).periods for s in slots)
        assert read == whole[key].periods == 330
        assert len(slots) == 1

    def test_a_refusal_for_size_is_split_per_namespace(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        # VictoriaMetrics' limits are in series, not samples: 100 series per query here,
        # 60 containers per namespace: one namespace's queries pass, both at once do not
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
        flags = ("-search.maxUniqueTimeseries=100",)
        with VictoriaMetricsServer(tmp_path, openmetrics="\n".join(lines) + "\n",
                                   flags=flags) as vm:  # fmt: skip
            with pytest.raises(MetricsError) as refused:
                source(vm.url).instant(queries(["n1", "n2"], 3600, with_owners=True)["periods"],
                                       now)  # fmt: skip
            found = fetch(source(vm.url), ["n1", "n2"], 3600, at=now)
        assert refused.value.too_big
        assert "-search.max" in str(refused.value) and "--namespace" in str(refused.value)
        assert len(found) == 120
        item = found[WorkloadKey("n1", "app30", "c")]
        assert item.throttle_ratio() == pytest.approx(0.3, abs=1e-9)  # no extrapolation
        assert "sending it once per namespace instead (2 queries)" in caplog.text

    def test_hostile_names_select_only_their_own_series_there_too(self, tmp_path: Path) -> None:
        # the same escaping (Go string literals, RE2 patterns) holds in MetricsQL
        now = int(time.time())
        with VictoriaMetricsServer(tmp_path, openmetrics=hostile_history(now)) as vm:
            found = source(vm.url)
            for ns in HOSTILE:
                samples = found.instant(counter_queries([ns], 3600)["periods"], at=now)
                assert [(s.labels["namespace"], s.labels["container"]) for s in samples] == [
                    (ns, "c")], ns  # fmt: skip
            both = found.instant(counter_queries(["shop", "a|b"], 3600)["periods"], at=now)
            literal = found.instant(f"count({{{equals('namespace', '.*')}}})", at=now)
        assert sorted(s.labels["namespace"] for s in both) == ["a|b", "shop"]
        assert [s.value for s in literal] == [2.0]  # ".*" is a name, not a pattern

    def test_a_bad_query_is_not_taken_for_a_big_one(self, tmp_path: Path) -> None:
        # VictoriaMetrics repeats the query in its error: "…_limits" must not read as a limit
        with VictoriaMetricsServer(tmp_path) as vm, pytest.raises(MetricsError) as caught:
            source(vm.url).instant('kube_pod_container_resource_limits{resource=~"("}')
        assert not caught.value.too_big
        assert "error parsing regexp" in str(caught.value)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """Prometheus and VictoriaMetrics holding the same hour (test_metrics_evidence's)."""
    now = int(time.time())
    text = history(now)
    folder = tmp_path_factory.mktemp("both")
    with (PrometheusServer(folder, openmetrics=text) as prom,
          VictoriaMetricsServer(folder, openmetrics=text) as vm):  # fmt: skip
        yield prom.url, vm.url, now


@requires_prometheus
@pytest.mark.parametrize("ago", [0, 600], ids=["ending-now", "ten-minutes-ago"])
def test_both_give_the_same_evidence_and_the_same_recommendations(
    both: tuple[str, str, int], ago: int
) -> None:
    prom_url, vm_url, now = both
    from_prom = fetch(source(prom_url), ["shop"], HOUR, at=now - ago)
    from_vm = fetch(source(vm_url), ["shop"], HOUR, at=now - ago)
    assert set(from_prom) == set(from_vm)
    for key, item in from_vm.items():
        # Prometheus extrapolates the increases of the pod that left mid-window by half a
        # scrape interval (+0.08 %); VictoriaMetrics' are the exact differences
        _same(item, from_prom[key], rel=0.002)
    vm_api = from_vm[API]
    # two pods all along (10 periods/s from an hour ago), the gone one its first half hour
    assert vm_api.periods == {0: 90_000, 600: 78_000}[ago]
    for ours, theirs in zip(_recommended(vm_api), _recommended(from_prom[API]), strict=True):
        assert_close((ours.limit_millicores, ours.burst_us),
                     (theirs.limit_millicores, theirs.burst_us))  # fmt: skip
        assert ours.expected_throttle_ratio == pytest.approx(
            theirs.expected_throttle_ratio, abs=RATIO_SLACK)  # fmt: skip
