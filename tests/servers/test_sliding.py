"""The operator's sliding window over a real Prometheus: the first read is `recommend`'s
own handful of queries, later reads only what is new (and the tail that left the window),
and the evidence stays what a fresh read of the whole window says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from shop import openmetrics
from support.sliding import (
    BURSTY,
    CALM,
    END,
    HOUR,
    KEY,
    OWNERS,
    T0,
    WINDOW,
    _limit,
    _read,
)
from unthrottle.evidence.aggregates import CheckpointError
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.sliding import SlidingEvidence
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource

pytestmark = requires_prometheus


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusSource]:
    history = openmetrics([BURSTY], END - 3 * HOUR, span=HOUR) + openmetrics(
        [CALM], END, span=3 * HOUR - 60)  # fmt: skip
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=history) as prom:
        yield PrometheusSource(PrometheusConfig(prom.url, retries=0))


def test_the_first_read_is_recommends_own_batch(source: PrometheusSource) -> None:
    state = SlidingEvidence(WINDOW)
    before = source.queries
    assert _read(state, source, T0) == ["full"]
    assert source.queries - before == 9  # what fetch sends with owners from the API
    fresh = fetch(source, ["ns"], WINDOW, at=T0, owners=OWNERS)[KEY]
    item = state.evidence(T0)[KEY]
    assert item.periods == pytest.approx(fresh.periods, rel=1e-6)
    assert _limit(item) == _limit(fresh)


def test_later_reads_are_the_head_and_the_tail_and_agree_with_a_fresh_read(
    source: PrometheusSource,
) -> None:
    state = SlidingEvidence(WINDOW)
    _read(state, source, T0)
    kinds = []
    for step in range(1, 17):  # every 5 minutes for 80 minutes: the first read ages out
        now = T0 + step * 300
        before = source.queries
        kinds.append(_read(state, source, now))
        assert source.queries - before <= 18  # at most two reads of 9
        fresh = fetch(source, ["ns"], WINDOW, at=now, owners=OWNERS).get(KEY)
        item = state.evidence(now).get(KEY)
        assert item is not None and fresh is not None
        assert item.throttle_ratio() == pytest.approx(fresh.throttle_ratio(), abs=0.01), now - T0
        assert _limit(item) == _limit(fresh), now - T0
    assert kinds[0] == ["head", "tail"]
    assert kinds[-1] == ["head"]  # the first read has left the window: no tail to subtract
    assert state.first is None
    # the bursts are out of the window: the calm pods alone, never throttled
    assert state.evidence(T0 + 16 * 300)[KEY].throttle_ratio() == pytest.approx(0, abs=0.005)


def test_the_tail_is_read_once_a_slot_of_it_has_left_the_window(
    source: PrometheusSource,
) -> None:
    """A reconcile a minute over a 1 h window (150 s slots): the first read's tail is read
    and subtracted once a slot of it has left the window, not every minute (that doubled
    a steady reconcile's queries). Until then the evidence is a fresh read of the window
    and what of the tail is still to leave, less than a slot more, as the head's slots
    once they leave the window."""
    state = SlidingEvidence(WINDOW)
    _read(state, source, T0)
    kinds = []
    for step in range(1, 11):
        now = T0 + step * 60
        before = source.queries
        kinds.append(_read(state, source, now))
        assert source.queries - before == 9 * len(kinds[-1])
        assert state.aged_until is not None
        covered = round(now - state.aged_until)
        assert WINDOW <= covered < WINDOW + state.slot_s
        fresh = fetch(source, ["ns"], covered, at=now, owners=OWNERS).get(KEY)
        item = state.evidence(now).get(KEY)
        assert item is not None and fresh is not None
        assert item.throttle_ratio() == pytest.approx(fresh.throttle_ratio(), abs=0.01), now - T0
        assert _limit(item) == _limit(fresh), now - T0
    tails = [step for step, read in enumerate(kinds, start=1) if "tail" in read]
    assert tails == [3, 6, 9]  # 180 s of it left at each: a slot and some
    assert all(read[0] == "head" for read in kinds)


def test_a_restart_from_the_checkpoint_reads_only_the_gap(source: PrometheusSource) -> None:
    state = SlidingEvidence(WINDOW)
    _read(state, source, T0)
    _read(state, source, T0 + 300)
    restored = SlidingEvidence.from_bytes(state.to_bytes())
    now = T0 + 300 + 20 * 60  # down for 20 minutes
    assert _read(restored, source, now) == ["head", "tail"]
    fresh = fetch(source, ["ns"], WINDOW, at=now, owners=OWNERS)[KEY]
    assert _limit(restored.evidence(now)[KEY]) == _limit(fresh)
    # a gap longer than the window: the whole window again
    assert [r.kind for r in restored.plan(now + 2 * WINDOW)] == ["full"]


@pytest.mark.parametrize(
    "blob",
    [b"", b"UNTHSLID\x00\x01\x00\x00\x00\x00garbage", b"not a checkpoint at all"],
    ids=["empty", "corrupt", "foreign"],
)
def test_a_bad_checkpoint_is_refused_not_misread(blob: bytes) -> None:
    with pytest.raises(CheckpointError):
        SlidingEvidence.from_bytes(blob)


def test_the_checkpoint_round_trips(source: PrometheusSource, tmp_path: Path) -> None:
    state = SlidingEvidence(WINDOW)
    _read(state, source, T0)
    _read(state, source, T0 + 600)
    again = SlidingEvidence.from_bytes(state.to_bytes())
    assert again.evidence(T0 + 600) == state.evidence(T0 + 600)
    assert again.to_bytes() == state.to_bytes()
