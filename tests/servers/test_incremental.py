"""Evidence span by span from a real Prometheus: the same batch of queries as a full-window
read, sent as range queries, and the spans add up to the window."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.incremental import (
    API,
    BATCH,
    COUNTERS,
    DAY,
    GONE,
    HOUR,
    IDLE,
    WEB,
    assert_same_evidence,
    counter,
    gauge,
    history,
    owners_known,
    summed,
)
from support.recording_rules import (
    rules,
)
from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import QUERIES_WITH_OWNERS, fetch
from unthrottle.evidence.incremental import fetch_slots, range_queries, steps
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource


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
