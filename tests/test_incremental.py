"""Evidence span by span from a real Prometheus: the same batch of queries as a full-window
read, sent as range queries, and the spans add up to the window."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from test_recording_rules import rules
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import QUERIES_WITH_OWNERS, fetch
from unthrottle.evidence.incremental import fetch_slots, range_queries, steps
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.model.owners import Owners

HOUR = 3600
DAY = 86_400
COUNTERS = ("usage_s", "periods", "throttled_periods", "throttled_s")
API = WorkloadKey("shop", "api", "api")
BATCH = WorkloadKey("shop", "batch", "main")
WEB = WorkloadKey("ops", "web", "web")
IDLE = WorkloadKey("ops", "idle", "web")
EARLY = WorkloadKey("ops", "early", "job")
GONE = "api-7d9f-q8wzt"
"""An api pod that lived the first third of the history."""


def counter(lines: list[str], name: str, labels: str, rate: float, times: range) -> None:
    """A counter growing at ``rate`` per second from the first of ``times``."""
    lines.extend(f"{name}{{{labels}}} {rate * (t - times[0]):.6f} {t}" for t in times)


def gauge(lines: list[str], name: str, labels: str, value: float, times: range) -> None:
    lines.extend(f"{name}{{{labels}}} {value} {t}" for t in times)


def container(lines: list[str], labels: str, times: range, *, usage: float, throttled: float,
              histogram: Mapping[str, float] | None, agent_only: bool = False) -> None:  # fmt: skip
    """A container's four counters (10 periods/s) and, if given, the agent's histogram
    (windows per second at or under each ``le``)."""
    prefix = "unthrottle" if agent_only else "container"
    counter(lines, f"{prefix}_cpu_usage_seconds_total", labels, usage, times)
    counter(lines, f"{prefix}_cpu_cfs_periods_total", labels, 10, times)
    counter(lines, f"{prefix}_cpu_cfs_throttled_periods_total", labels, 10 * throttled, times)
    counter(lines, f"{prefix}_cpu_cfs_throttled_seconds_total", labels, throttled / 2, times)
    for le, per_s in (histogram or {}).items():
        counter(lines, "unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"', per_s, times)


def history(start: int, end: int, step: int, early: tuple[int, int] | None = None) -> str:
    """Deployments in two namespaces from ``start`` to ``end``, a sample every ``step`` s:

    - shop/api: two pods all along, a third (GONE) for the first third; throttled half
      the time under 500m, the histogram says one window in ten wants ~1.1 cores;
    - shop/batch: cAdvisor only, steady 1.8 cores under 2;
    - ops/web: the agent only, mostly 0.2 core, one window in ten up to 0.75 core;
    - ops/idle: limits and requests, no CPU at all;
    - ops/early: a job whose one pod ran during ``early`` (start, end) only.
    """
    lines: list[str] = []
    every = range(start, end + 1, step)
    pods = {
        "shop": {"api-7d9f-a": ("api-7d9f", "api"), "api-7d9f-b": ("api-7d9f", "api"),
                 GONE: ("api-7d9f", "api"), "batch-1-xk9z2": ("batch-1", "batch")},
        "ops": {"web-5c-m2x7q": ("web-5c", "web"), "idle-1-h4b8n": ("idle-1", "idle")},
    }  # fmt: skip
    third = range(start, start + (end - start) // 3 + 1, step)
    for ns, owned in pods.items():
        for pod, (rs, deploy) in owned.items():
            gauge(lines, "kube_replicaset_owner", f'namespace="{ns}",replicaset="{rs}",'
                  f'owner_kind="Deployment",owner_name="{deploy}"', 1, every)  # fmt: skip
            gauge(lines, "kube_pod_owner", f'namespace="{ns}",pod="{pod}",owner_kind="ReplicaSet",'
                  f'owner_name="{rs}"', 1, third if pod == GONE else every)  # fmt: skip
    settings = [("shop", "api-7d9f-a", "api", 0.5, 0.25), ("shop", "api-7d9f-b", "api", 0.5, 0.25),
                ("shop", "batch-1-xk9z2", "main", 2, 1), ("ops", "web-5c-m2x7q", "web", 1, 0.5),
                ("ops", "idle-1-h4b8n", "web", 1, 0.1)]  # fmt: skip
    for ns, pod, name, limit, request in settings:
        for metric, value in (("limits", limit), ("requests", request)):
            gauge(lines, f"kube_pod_container_resource_{metric}",
                  f'namespace="{ns}",pod="{pod}",container="{name}",resource="cpu"', value,
                  every)  # fmt: skip
    api = {"0.25": 7, "0.5": 9, "1.0": 9, "1.25": 10, "+Inf": 10}
    for pod in ("api-7d9f-a", "api-7d9f-b", GONE):
        lived = third if pod == GONE else every
        container(lines, f'namespace="shop",pod="{pod}",container="api"', lived, usage=0.45,
                  throttled=0.5, histogram=api)  # fmt: skip
    container(lines, 'namespace="shop",pod="batch-1-xk9z2",container="main"', every,
              usage=1.8, throttled=0.01, histogram=None)  # fmt: skip
    web = {"0.1": 2, "0.2": 9, "0.5": 9.5, "0.75": 10, "1.0": 10, "+Inf": 10}
    container(lines, 'namespace="ops",pod="web-5c-m2x7q",container="web"', every, usage=0.2,
              throttled=0.0, histogram=web, agent_only=True)  # fmt: skip
    if early is not None:
        ran = range(early[0], early[1] + 1, step)
        gauge(lines, "kube_replicaset_owner", 'namespace="ops",replicaset="early-1",'
              'owner_kind="Deployment",owner_name="early"', 1, ran)  # fmt: skip
        gauge(lines, "kube_pod_owner", 'namespace="ops",pod="early-1-q7z2k",'
              'owner_kind="ReplicaSet",owner_name="early-1"', 1, ran)  # fmt: skip
        job = 'namespace="ops",pod="early-1-q7z2k",container="job"'
        gauge(lines, "kube_pod_container_resource_limits", f'{job},resource="cpu"', 1, ran)
        container(lines, job, ran, usage=0.9, throttled=0.2,
                  histogram={"0.5": 2, "1.0": 8, "+Inf": 10})  # fmt: skip
    return "\n".join(lines) + "\n"


def summed(slots: list[Slot]) -> dict[WorkloadKey, ContainerEvidence]:
    """The slots' increases added up per container (settings from the last slot)."""
    out: dict[WorkloadKey, ContainerEvidence] = {}
    for slot in slots:
        for key, item in slot.evidence.items():
            total = out.setdefault(key, ContainerEvidence(key))
            total.pods |= item.pods
            for name in COUNTERS:
                setattr(total, name, getattr(total, name) + getattr(item, name))
            for le, count in item.buckets.items():
                total.buckets[le] = total.buckets.get(le, 0.0) + count
            total.limit_millicores = item.limit_millicores
            total.request_millicores = item.request_millicores
    return out


Found = dict[WorkloadKey, ContainerEvidence]


def assert_same_evidence(got: Found, want: Found, rel: float = 0.01) -> None:
    """Counters and buckets within ``rel`` (``increase`` extrapolates at range edges)."""
    assert set(got) == set(want)
    for key, item in want.items():
        other = got[key]
        assert other.pods == item.pods, key
        assert (other.limit_millicores, other.request_millicores) == (
            item.limit_millicores, item.request_millicores), key  # fmt: skip
        for name in COUNTERS:
            assert getattr(other, name) == pytest.approx(getattr(item, name), rel=rel), (key, name)
        assert set(other.buckets) == set(item.buckets), key
        for le, count in item.buckets.items():
            assert other.buckets[le] == pytest.approx(count, rel=rel), (key, le)


def owners_known() -> Owners:
    """What the Kubernetes API would say of the pods (GONE is known by its name)."""
    owners = Owners(pods={("shop", "api-7d9f-a"): "api", ("shop", "api-7d9f-b"): "api"})
    owners.replicasets.update({("shop", "api-7d9f"): "api", ("shop", "batch-1"): "batch",
                               ("ops", "web-5c"): "web", ("ops", "idle-1"): "idle"})  # fmt: skip
    return owners


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusSource, int]]:
    """A Prometheus holding a day and an hour of history, a sample a minute, ending now."""
    now = int(time.time()) // 60 * 60
    folder = tmp_path_factory.mktemp("day")
    with PrometheusServer(folder, openmetrics=history(now - DAY - HOUR, now, 60)) as prom:
        yield PrometheusSource(PrometheusConfig(prom.url)), now


pytestmark = requires_prometheus


class TestTheFirstRead:
    @pytest.mark.parametrize("with_owners", [False, True], ids=["owners-known", "owners-asked"])
    def test_is_fetchs_batch_sent_as_range_queries_of_24_steps(
        self, day: tuple[PrometheusSource, int], with_owners: bool
    ) -> None:
        source, now = day
        owners = None if with_owners else owners_known()
        heard: list[str] = []
        before = source.queries
        whole = fetch(source, [], DAY, at=now, owners=owners, on_query=heard.append)
        sent_by_fetch = source.queries - before
        heard_by_slots: list[str] = []
        slots = fetch_slots(source, [], now - DAY, now, slot_s=HOUR, owners=owners,
                            on_query=heard_by_slots.append)  # fmt: skip
        assert sent_by_fetch == source.queries - before - sent_by_fetch
        assert sent_by_fetch == (QUERIES_WITH_OWNERS if with_owners else 9)
        assert heard_by_slots == heard
        assert [(s.start, s.end) for s in slots] == [
            (now - DAY + k * HOUR, now - DAY + (k + 1) * HOUR) for k in range(24)
        ]
        assert_same_evidence(summed(slots), whole)

    def test_each_slot_holds_its_own_hour(self, day: tuple[PrometheusSource, int]) -> None:
        source, now = day
        slots = fetch_slots(source, ["shop"], now - DAY, now, slot_s=HOUR, owners=owners_known())
        # GONE lived the first third of 25 hours (until 16 h 40 min ago): 8 slots of the day
        with_gone = [k for k, s in enumerate(slots) if GONE in s.evidence[API].pods]
        assert with_gone == list(range(8))
        for s in slots[8:]:
            assert s.evidence[API].periods == pytest.approx(2 * 10 * HOUR, rel=0.01)
            assert s.evidence[BATCH].usage_s == pytest.approx(1.8 * HOUR, rel=0.01)
            assert s.evidence[API].limit_millicores == 500


class TestGapReads:
    def test_a_gap_is_cut_into_equal_spans_that_tile_it(self) -> None:
        plan = steps(1000.0, 1000.0 + 3 * HOUR + 20 * 60, HOUR)
        assert (plan.n, plan.step_ms) == (4, 50 * 60 * 1000)
        assert plan.spans() == [(1000.0 + k * 3000, 1000.0 + (k + 1) * 3000) for k in range(4)]
        assert steps(0, 300, HOUR).spans() == [(0.0, 300.0)]
        assert steps(50, 50, HOUR).n == 0

    def test_spans_that_cannot_be_whole_milliseconds_stop_short_and_never_overlap(self) -> None:
        plan = steps(0.0, 25_200.003, HOUR)  # 25,200,003 ms in 8 spans
        spans = plan.spans()
        assert len(spans) == 8 and spans[0][0] == 0.0
        assert all(a[1] == b[0] for a, b in pairwise(spans))
        assert 0 <= 25_200.003 - spans[-1][1] < 0.008  # the rest is read next time

    def test_a_gap_read_adds_up_to_a_full_read_of_the_gap(
        self, day: tuple[PrometheusSource, int]
    ) -> None:
        source, now = day
        gap = 3 * HOUR + 20 * 60
        slots = fetch_slots(source, [], now - gap, now, slot_s=HOUR, owners=owners_known())
        assert [(s.start, s.end) for s in slots] == steps(now - gap, now, HOUR).spans()
        assert_same_evidence(summed(slots), fetch(source, [], gap, at=now, owners=owners_known()))

    def test_five_minutes_are_one_span(self, day: tuple[PrometheusSource, int]) -> None:
        source, now = day
        (slot,) = fetch_slots(source, ["ops"], now - 300, now, slot_s=HOUR, owners=owners_known())
        assert (slot.start, slot.end) == (now - 300, now)
        assert slot.evidence[WEB].periods == pytest.approx(10 * 300, rel=0.01)
        assert slot.evidence[IDLE].kind == "none" and slot.evidence[IDLE].limit_millicores == 1000

    def test_an_empty_span_sends_nothing(self, day: tuple[PrometheusSource, int]) -> None:
        source, now = day
        before = source.queries
        assert fetch_slots(source, [], now, now, slot_s=HOUR) == []
        assert source.queries == before


def test_a_range_query_too_big_for_prometheus_is_sent_again_per_namespace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 60 containers in each of two namespaces, an hour at 15 s, read as four 15-minute steps.
    # Prometheus may hold 850 samples per query: one namespace's answers fit (the counters'
    # are refused from 500 to 700), both namespaces' do not (from 1,000 to 1,200).
    now = int(time.time())
    lines: list[str] = []
    every = range(now - HOUR, now + 1, 15)
    for ns in ("n1", "n2"):
        for i in range(60):
            rs, pod = f"app{i}-6b7d", f"app{i}-6b7d-z{i % 10}x4k"
            gauge(lines, "kube_replicaset_owner", f'namespace="{ns}",replicaset="{rs}",'
                  f'owner_kind="Deployment",owner_name="app{i}"', 1, every)  # fmt: skip
            gauge(lines, "kube_pod_owner", f'namespace="{ns}",pod="{pod}",'
                  f'owner_kind="ReplicaSet",owner_name="{rs}"', 1, every)  # fmt: skip
            labels = f'namespace="{ns}",pod="{pod}",container="c"'
            counter(lines, "container_cpu_cfs_periods_total", labels, 10, every)
            counter(lines, "container_cpu_cfs_throttled_periods_total", labels, i / 10, every)
    flags = ("--query.max-samples=850",)
    with PrometheusServer(tmp_path, openmetrics="\n".join(lines) + "\n", flags=flags) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        plan = steps(now - HOUR, now, 900)
        periods = range_queries(["n1", "n2"], plan, with_owners=True)["periods"]
        with pytest.raises(MetricsError) as refused:  # the whole thing at once is refused
            source.range(periods, now - HOUR + 900, now, 900)
        assert refused.value.too_big
        slots = fetch_slots(source, ["n1", "n2"], now - HOUR, now, slot_s=900)
    assert len(slots) == 4
    for slot in slots:
        assert len(slot.evidence) == 120
        for ns in ("n1", "n2"):
            item = slot.evidence[WorkloadKey(ns, "app30", "c")]
            assert item.throttle_ratio() == pytest.approx(0.3, abs=0.01)
            assert item.periods == pytest.approx(9000, rel=0.02)
    assert "sending it once per namespace instead (2 queries)" in caplog.text


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusSource, int]]:
    """Two hours of history, and the recording rules evaluated over it by promtool."""
    folder = tmp_path_factory.mktemp("recorded")
    now = int(time.time()) // 60 * 60
    with PrometheusServer(folder, openmetrics=history(now - 2 * HOUR, now, 15)) as prom:
        blocks = prom.record(rules(folder), now - 2 * HOUR, now)
    for block in blocks:
        shutil.move(str(block), folder / "tsdb" / block.name)
    with PrometheusServer(folder, tsdb=folder / "tsdb") as prom:
        yield PrometheusSource(PrometheusConfig(prom.url)), now


def test_recorded_series_are_read_span_by_span_each_sample_once(
    recorded: tuple[PrometheusSource, int],
) -> None:
    source, now = recorded
    owners = owners_known()
    slots = fetch_slots(source, [], now - HOUR, now, slot_s=900, owners=owners, recorded=True)
    assert len(slots) == 4
    # a rule sample on a boundary belongs to the span it ends: (t − 15m, t]
    whole = fetch(source, [], HOUR - 1, at=now, owners=owners, recorded=True)
    got, want = summed(slots), whole
    for key in (API, BATCH, WEB):
        for name in COUNTERS:
            assert getattr(got[key], name) == pytest.approx(getattr(want[key], name), rel=1e-6)
    raw = fetch(source, [], HOUR, at=now, owners=owners)
    assert got[API].periods == pytest.approx(raw[API].periods, rel=0.02)
