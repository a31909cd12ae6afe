"""Evidence span by span (``fetch_slots``) and the operator's sliding window, over
Prometheus and over VictoriaMetrics holding the same history: the spans add up to the
window on both, and the window that slides recommends what a fresh read does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from prom import PrometheusServer, requires_prometheus
from shop import openmetrics
from support.incremental import (
    API,
    BATCH,
    COUNTERS,
    DAY,
    EARLY,
    HOUR,
    WEB,
    assert_same_evidence,
    owners_known,
    summed,
)
from support.incremental import (
    history as day_history,
)
from support.recording_rules import (
    rules,
)
from support.sliding import (
    BURSTY,
    CALM,
    END,
    KEY,
    OWNERS,
    T0,
    WINDOW,
    _limit,
    _read,
)
from support.victoria_shared import (
    LEAVING_SLACK_M,
    LIMIT_SLACK_M,
    RATIO_SLACK,
    assert_close,
)
from unthrottle.evidence.fetching import fetch, recorded_covers
from unthrottle.evidence.incremental import fetch_slots, steps
from unthrottle.evidence.sliding import SlidingEvidence
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from victoria import BACKENDS, VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Any:
    """The server class: Prometheus, then VictoriaMetrics."""
    return request.param


@pytest.fixture(scope="module")
def day(backend: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int]]:
    """A day and an hour of test_incremental's history, a sample a minute, ending now."""
    now = int(time.time()) // 60 * 60
    # and a job that ran for four hours of the last twelve
    text = day_history(
        now - DAY - HOUR, now, 60, early=(now - 9 * HOUR - 1260, now - 5 * HOUR - 300)
    )
    with backend(tmp_path_factory.mktemp("day"), openmetrics=text) as server:
        yield PrometheusSource(PrometheusConfig(server.url)), now


def _sliding_history() -> str:
    """test_sliding's: bursty pods until END − 3 h, then a rollout to calm ones."""
    return openmetrics([BURSTY], END - 3 * HOUR, span=HOUR) + openmetrics(
        [CALM], END, span=3 * HOUR - 60)  # fmt: skip


@pytest.fixture(scope="module")
def rollout(backend: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with backend(tmp_path_factory.mktemp("rollout"), openmetrics=_sliding_history()) as server:
        yield PrometheusSource(PrometheusConfig(server.url, retries=0))


class TestSpanBySpan:
    def test_the_first_read_is_24_spans_that_add_up_to_the_window(
        self, day: tuple[PrometheusSource, int]
    ) -> None:
        source, now = day
        whole = fetch(source, [], DAY, at=now, owners=owners_known())
        slots = fetch_slots(source, [], now - DAY, now, slot_s=HOUR, owners=owners_known())
        assert [(s.start, s.end) for s in slots] == steps(now - DAY, now, HOUR).spans()
        assert len(slots) == 24
        assert_same_evidence(summed(slots), whole)

    def test_a_gap_read_adds_up_to_a_full_read_of_the_gap(
        self, day: tuple[PrometheusSource, int]
    ) -> None:
        source, now = day
        gap = 3 * HOUR + 20 * 60
        slots = fetch_slots(source, [], now - gap, now, slot_s=HOUR)  # owners asked too
        assert [(s.start, s.end) for s in slots] == steps(now - gap, now, HOUR).spans()
        assert_same_evidence(summed(slots), fetch(source, [], gap, at=now))

    def test_a_read_of_many_spans_keeps_the_spans_asked(
        self, day: tuple[PrometheusSource, int]
    ) -> None:
        # 72 spans of 599 s (whole seconds, so that an instant read can say the same span)
        # from a start that is not a multiple of the step: VictoriaMetrics aligns a range
        # query of 50 points or more unless told not to, which moves every span; the job
        # that started and ended in the read shows it
        source, now = day
        start = now - 72 * 599
        slots = fetch_slots(source, [], start, now, slot_s=600)
        assert len(slots) == 72
        assert [(s.start, s.end) for s in slots] == steps(start, now, 600).spans()
        ran = [k for k, s in enumerate(slots) if EARLY in s.evidence]
        assert ran
        for k in (0, ran[0], ran[-1], 71):  # each span as an instant read of that span says
            a, b = slots[k].start, slots[k].end
            alone = fetch(source, [], int(b - a), at=b)
            for key in (API, EARLY):
                want = alone[key].periods if key in alone else 0.0
                got = slots[k].evidence[key].periods if key in slots[k].evidence else 0.0
                assert got == pytest.approx(want, rel=0.01, abs=1), (k, key)
        whole = fetch(source, [], int(now - start), at=now)
        assert summed(slots)[API].periods == pytest.approx(whole[API].periods, rel=0.01)


@requires_victoria
def test_recorded_series_are_the_raw_evidence_exactly_span_by_span_too(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # unthrottle's recording rules evaluated by vmalert over two hours: VictoriaMetrics'
    # 5-minute increases tile the raw counters exactly, so their sums are the raw evidence
    # (on Prometheus they differ by the extrapolation at each 5-minute edge, up to 10 %)
    folder = tmp_path_factory.mktemp("recorded")
    now = int(time.time()) // 60 * 60
    with VictoriaMetricsServer(folder, openmetrics=day_history(now - 2 * HOUR, now, 15)) as vm:
        vm.record(rules(folder), now - 2 * HOUR, now)
        source = PrometheusSource(PrometheusConfig(vm.url))
        assert recorded_covers(source, [], HOUR, at=now)
        owners = owners_known()
        slots = fetch_slots(source, [], now - HOUR, now, slot_s=900, owners=owners,
                            recorded=True)  # fmt: skip
        recorded = fetch(source, [], HOUR - 1, at=now, owners=owners, recorded=True)
        raw = fetch(source, [], HOUR, at=now, owners=owners)
    assert len(slots) == 4
    for key in (API, BATCH, WEB):
        for name in COUNTERS:
            assert getattr(summed(slots)[key], name) == getattr(recorded[key], name), (key, name)
            assert getattr(recorded[key], name) == getattr(raw[key], name), (key, name)


class TestTheSlidingWindow:
    def test_later_reads_agree_with_a_fresh_read_of_the_window(self, rollout: Any) -> None:
        state = SlidingEvidence(WINDOW)
        assert _read(state, rollout, T0) == ["full"]
        for step in range(1, 17):  # every 5 minutes for 80 minutes: the first read ages out
            now = T0 + step * 300
            _read(state, rollout, now)
            fresh = fetch(rollout, ["ns"], WINDOW, at=now, owners=OWNERS).get(KEY)
            item = state.evidence(now).get(KEY)
            assert item is not None and fresh is not None
            assert item.throttle_ratio() == pytest.approx(fresh.throttle_ratio(), abs=0.01)
            assert _limit(item) == _limit(fresh), now - T0
        assert state.first is None
        assert state.evidence(T0 + 16 * 300)[KEY].throttle_ratio() == pytest.approx(0, abs=0.005)

    def test_a_restart_from_the_checkpoint_reads_only_the_gap(self, rollout: Any) -> None:
        state = SlidingEvidence(WINDOW)
        _read(state, rollout, T0)
        _read(state, rollout, T0 + 300)
        restored = SlidingEvidence.from_bytes(state.to_bytes())
        now = T0 + 300 + 20 * 60
        assert _read(restored, rollout, now) == ["head", "tail"]
        fresh = fetch(rollout, ["ns"], WINDOW, at=now, owners=OWNERS)[KEY]
        assert _limit(restored.evidence(now)[KEY]) == _limit(fresh)


@requires_prometheus
def test_the_window_slid_over_victoria_metrics_recommends_what_prometheus_does(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("both")
    text = _sliding_history()
    with (PrometheusServer(folder, openmetrics=text) as prom,
          VictoriaMetricsServer(folder, openmetrics=text) as vm):  # fmt: skip
        ours = PrometheusSource(PrometheusConfig(vm.url))
        theirs = PrometheusSource(PrometheusConfig(prom.url))
        state = SlidingEvidence(WINDOW)
        for step in range(17):  # every 5 minutes, as the rollout leaves the window
            now = T0 + step * 300
            _read(state, ours, now)
            slid = state.evidence(now)[KEY]
            fresh = fetch(theirs, ["ns"], WINDOW, at=now, owners=OWNERS)[KEY]
            assert slid.throttle_ratio() == pytest.approx(fresh.throttle_ratio(), abs=RATIO_SLACK)
            mine, other = _limit(slid), _limit(fresh)
            assert mine is not None and other is not None
            # the read as the last bursty pods leave (step 5) is the one that needs more
            assert_close(mine, other, limit_slack_m=LEAVING_SLACK_M if step == 5 else LIMIT_SLACK_M)
