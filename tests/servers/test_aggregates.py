"""Evidence folded slot by slot: the window slides exactly, survives a restart as a small
checkpoint, and gives the recommendations a fresh full-window read gives."""

from __future__ import annotations

import random
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.incremental import (
    API,
    BATCH,
    EARLY,
    HOUR,
    IDLE,
    WEB,
    history,
    owners_known,
)
from unthrottle.evidence.aggregates import CheckpointError, WindowAggregates, slot_seconds
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.recommend import Current, Policy
from unthrottle.scan.advise import advise

T0 = 1_700_000_000
WINDOW = 6 * HOUR
SLOT = 900
A = WorkloadKey("shop", "api", "api")
B = WorkloadKey("shop", "batch", "main")
LAYOUT = (0.25, 0.5, 1.0, float("inf"))


def item(key: WorkloadKey, periods: float = 0.0, *, pods: tuple[str, ...] = ("p-1",),
         windows: tuple[float, ...] = (), limit: int | None = 500,
         ) -> ContainerEvidence:  # fmt: skip
    """Evidence with ``periods`` (a tenth of them throttled) and, given ``windows`` per bucket
    of LAYOUT (not cumulative), a histogram."""
    cumulative, running = {}, 0.0
    for bound, count in zip(LAYOUT, windows, strict=False):
        running += count
        cumulative[bound] = running
    return ContainerEvidence(key, pods=set(pods), usage_s=periods / 20, periods=periods,
                             throttled_periods=periods / 10, buckets=cumulative,
                             limit_millicores=limit, request_millicores=250)  # fmt: skip


def span(start: float, end: float, *items: ContainerEvidence) -> Slot:
    return Slot(start, end, {i.key: i for i in items})


def first_read(agg: WindowAggregates, periods: float = 100.0) -> None:
    """The window read as 24 slots of ``periods`` each for A, ending at T0 + WINDOW."""
    for k in range(24):
        agg.fold(span(T0 + k * SLOT, T0 + (k + 1) * SLOT, item(A, periods, windows=(6, 3, 1))))


class TestSlots:
    @pytest.mark.parametrize(
        ("window_s", "slot_s"),
        [(86_400, 3600), (7 * 86_400, 25_200), (WINDOW, SLOT), (600, 60), (1000, 60)],
        ids=["24h", "7d", "6h", "10m-at-least-a-minute", "odd"],
    )
    def test_a_slot_is_a_24th_of_the_window_in_whole_seconds(
        self, window_s: int, slot_s: int
    ) -> None:
        assert slot_seconds(window_s) == slot_s
        assert WindowAggregates(window_s).slot_s == slot_s

    def test_slots_shorter_than_a_minute_are_refused(self) -> None:
        with pytest.raises(ValueError, match="at least 60 s"):
            WindowAggregates(600, slot_s=30)


class TestFolding:
    def test_right_after_the_first_read_the_evidence_is_the_window(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        evidence = agg.evidence(T0 + WINDOW)
        assert evidence[A].periods == pytest.approx(2400)
        assert evidence[A].buckets == {0.25: 144, 0.5: 216, 1.0: 240}
        assert evidence[A].kind == "period" and evidence[A].limit_millicores == 500
        assert (agg.origin, agg.read_until) == (T0, T0 + WINDOW)

    def test_a_span_inside_a_slot_is_added_to_it_whole(self) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + 300, item(A, 30)))
        agg.fold(span(T0 + 300, T0 + 600, item(A, 30)))
        assert agg.evidence(T0 + 600)[A].periods == pytest.approx(60)
        # the slot [T0, T0 + 15 min) leaves the window whole, 6 h after it ended
        assert agg.evidence(T0 + WINDOW + SLOT - 1)[A].periods == pytest.approx(60)
        assert A not in agg.evidence(T0 + WINDOW + SLOT)

    def test_a_span_across_a_boundary_is_split_by_time_share_nothing_lost_or_doubled(
        self,
    ) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + SLOT, item(A, 900, windows=(9, 0, 0))))
        # 20 minutes: 15 in the second slot, 5 in the third
        agg.fold(span(T0 + SLOT, T0 + SLOT + 1200, item(A, 1200, windows=(12, 0, 0))))
        assert agg.evidence(T0 + 2100)[A].periods == pytest.approx(2100)
        assert agg.evidence(T0 + 2100)[A].buckets[0.25] == pytest.approx(21)
        second = agg.evidence(T0 + WINDOW + SLOT)[A]  # the first slot left
        assert second.periods == pytest.approx(1200)
        third = agg.evidence(T0 + WINDOW + 2 * SLOT)[A]  # the second too
        assert third.periods == pytest.approx(300)
        assert third.buckets[0.25] == pytest.approx(3)

    def test_a_span_starting_before_the_last_one_ended_is_refused(self) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + 300, item(A, 30)))
        with pytest.raises(ValueError, match="counted twice"):
            agg.fold(span(T0 + 299, T0 + 600, item(A, 30)))

    def test_settings_are_the_latest_seen_and_pods_those_of_the_window(self) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + SLOT, item(A, 10, pods=("old-1",), limit=500)))
        agg.fold(span(T0 + SLOT, T0 + 2 * SLOT, item(A, 10, pods=("new-1",), limit=800)))
        now = T0 + 2 * SLOT
        assert agg.evidence(now)[A].pods == {"old-1", "new-1"}
        assert agg.evidence(now)[A].limit_millicores == 800
        agg.prune(now + WINDOW - SLOT)
        assert agg.evidence(now + WINDOW - SLOT)[A].pods == {"new-1"}


class TestAgingOut:
    def test_only_the_slots_that_left_the_window_are_dropped(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        for k, now in enumerate(range(T0 + WINDOW, T0 + WINDOW + 4 * SLOT, 300)):
            agg.fold(span(now, now + 300, item(A, 10)))
            agg.prune(now + 300)
            dropped = (k + 1) * 300 // SLOT
            # every slot whose end is after now − window: between the window and one slot more
            expected = 100 * (24 - dropped) + 10 * (k + 1)
            assert agg.evidence(now + 300)[A].periods == pytest.approx(expected), k

    def test_a_container_whose_only_data_left_has_no_evidence(self) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + SLOT, item(A, 100), item(B, 50, pods=("b-1",))))
        for k in range(1, 24):
            agg.fold(span(T0 + k * SLOT, T0 + (k + 1) * SLOT, item(A, 100)))
        assert B in agg.evidence(T0 + WINDOW)
        token = agg.version
        agg.fold(span(T0 + WINDOW, T0 + WINDOW + SLOT, item(A, 0)))
        agg.prune(T0 + WINDOW + SLOT)
        assert set(agg.evidence(T0 + WINDOW + SLOT)) == {A}
        assert agg.changed_since(token) == {A}  # A lost its first slot; B is gone whole
        restored = WindowAggregates.from_bytes(agg.to_bytes())
        assert set(restored.evidence(T0 + WINDOW + SLOT)) == {A}


class TestChanges:
    def test_only_containers_with_new_increases_or_dropped_data_changed(self) -> None:
        agg = WindowAggregates(WINDOW)
        agg.fold(span(T0, T0 + SLOT, item(A, 100), item(B, 100, pods=("b-1",))))
        assert agg.changed_since(None) == {A, B}
        token = agg.version
        agg.fold(span(T0 + SLOT, T0 + SLOT + 300, item(A, 10), item(B, 0, pods=("b-1",))))
        assert agg.changed_since(token) == {A}
        token = agg.version
        agg.fold(span(T0 + SLOT + 300, T0 + SLOT + 600, item(A, 0), item(B, 0, pods=("b-2",))))
        assert agg.changed_since(token) == {B}  # a new pod
        token = agg.version
        agg.prune(T0 + SLOT + 600)
        assert agg.changed_since(token) == set()  # nothing left the window yet


class TestNextRead:
    def test_the_first_read_is_the_window(self) -> None:
        assert WindowAggregates(WINDOW).next_read(T0) == (T0 - WINDOW, T0)

    def test_later_reads_start_where_the_last_ended(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        assert agg.next_read(T0 + WINDOW + 300) == (T0 + WINDOW, T0 + WINDOW + 300)
        assert agg.next_read(T0 + WINDOW + 30) == (T0 + WINDOW, T0 + WINDOW)  # too soon

    def test_a_gap_longer_than_the_window_reads_the_window_again(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        later = T0 + 3 * WINDOW
        assert agg.next_read(later) == (later - WINDOW, later)
        for start, end in [(later - WINDOW, later)]:
            agg.fold(span(start, end, item(B, 10, pods=("b-1",))))
        agg.prune(later)
        assert set(agg.evidence(later)) == {B}


def realistic(deployments: int = 1000, slots: int = 24, seed: int = 7) -> WindowAggregates:
    """``deployments`` × 2 containers × 2 pods, 24 one-hour slots, the agent's 28 buckets;
    four in five containers idle in a slot (every window in the first bucket, a trickle of
    periods, no throttling), the others spread over a few buckets. Counts are not round
    (Prometheus extrapolates), which is the hard case for compression."""
    from unthrottle.agent.sampling import BUCKETS_CORES

    bounds = (*BUCKETS_CORES, float("inf"))
    rnd = random.Random(seed)
    agg = WindowAggregates(86_400)
    for k in range(slots):
        found = {}
        for d in range(deployments):
            pods = {f"app-{d:04d}-7d9f8b6c4-{s}" for s in ("x2k9p", "b7q4m")}
            for name in ("main", "sidecar"):
                key = WorkloadKey(f"team-{d % 20:02d}", f"app-{d:04d}", name)
                windows = 2 * 36_000 * rnd.uniform(0.97, 1.0)
                ev = ContainerEvidence(key, pods=pods, limit_millicores=500,
                                       request_millicores=250)  # fmt: skip
                if rnd.random() < 0.8:
                    ev.usage_s, ev.periods = rnd.uniform(0, 30), rnd.uniform(0, 3000)
                    ev.buckets = dict.fromkeys(bounds, windows)
                else:
                    ev.usage_s, ev.periods = rnd.uniform(300, 7000), windows
                    ev.throttled_periods = windows * rnd.uniform(0, 0.2)
                    ev.throttled_s = ev.throttled_periods * 0.01
                    low, running = rnd.randrange(0, 12), 0.0
                    for j, bound in enumerate(bounds):
                        if j >= low:
                            running = min(windows, running + windows * rnd.uniform(0.05, 0.4))
                        ev.buckets[bound] = running
                    ev.buckets[bounds[-1]] = windows
                found[key] = ev
        agg.fold(Slot(T0 + k * 3600, T0 + (k + 1) * 3600, found))
    return agg


@pytest.fixture(scope="module")
def big() -> WindowAggregates:
    return realistic()


class TestCheckpoint:
    def test_a_round_trip_gives_the_same_aggregates(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        agg.fold(span(T0 + WINDOW, T0 + WINDOW + 1200, item(A, 40), item(B, 5, pods=("b-1",))))
        agg.prune(T0 + WINDOW + 1200)
        back = WindowAggregates.from_bytes(agg.to_bytes())
        assert back == agg
        now = T0 + WINDOW + 1500
        assert back.evidence(now) == agg.evidence(now)
        assert back.next_read(now) == agg.next_read(now)
        assert back.changed_since(3) == agg.changed_since(3)
        assert WindowAggregates.from_chunks(agg.to_chunks(500)) == agg
        assert WindowAggregates.from_bytes(WindowAggregates(WINDOW).to_bytes()) == (
            WindowAggregates(WINDOW)
        )

    def test_2000_containers_fit_in_a_configmap(self, big: WindowAggregates) -> None:
        data = big.to_bytes()
        print(f"\ncheckpoint of 2,000 containers × 24 slots × 28 buckets: {len(data):,} bytes "
              f"({len(data) / 1024:.0f} KiB)")  # fmt: skip
        assert len(data) < 900 * 1024
        back = WindowAggregates.from_bytes(data)
        assert back == big
        assert back.evidence(T0 + 86_400) == big.evidence(T0 + 86_400)

    @staticmethod
    def corruptions(data: bytes) -> Iterator[tuple[str, bytes]]:
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        yield "a flipped bit", bytes(flipped)
        yield "cut short", data[: len(data) - 10]
        yield "trailing bytes", data + b"\0"
        yield "empty", b""
        yield "foreign", b'{"apiVersion": "v1", "kind": "ConfigMap"}'
        body = zlib.compress(b"\0\0\0\x02{}")
        yield "valid outside, nonsense inside", struct.pack(">8sHI", b"UNTHRAGG", 3,
                                                            zlib.crc32(body)) + body  # fmt: skip
        packed = data[14:]
        yield "a newer format", struct.pack(">8sHI", b"UNTHRAGG", 4, zlib.crc32(packed)) + packed

    def test_a_corrupt_or_foreign_blob_is_a_checkpoint_error(self) -> None:
        agg = WindowAggregates(WINDOW)
        first_read(agg)
        for what, blob in self.corruptions(agg.to_bytes()):
            with pytest.raises(CheckpointError):
                WindowAggregates.from_bytes(blob)
                pytest.fail(f"{what} was read")

    def test_a_newer_format_says_so(self) -> None:
        data = WindowAggregates(WINDOW).to_bytes()
        packed = data[14:]
        blob = struct.pack(">8sHI", b"UNTHRAGG", 4, zlib.crc32(packed)) + packed
        with pytest.raises(CheckpointError, match="format 4; this operator reads 3"):
            WindowAggregates.from_bytes(blob)


@pytest.fixture(scope="module")
def eight_hours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """8 h 30 min of history at 30 s ending now; ``t`` is half an hour ago. ops/early ran
    from t − 5 h 59 min to t − 5 h 46 min, in the first slot of the window at t."""
    now = int(time.time()) // 60 * 60
    t = now - 1800
    text = history(now - 8 * HOUR - 1800, now, 30, early=(t - WINDOW + 60, t - WINDOW + 840))
    with PrometheusServer(tmp_path_factory.mktemp("eight"), openmetrics=text) as prom:
        yield prom.url, t


@requires_prometheus
def test_five_minute_reads_folded_recommend_what_a_fresh_full_read_does(
    eight_hours: tuple[str, int], tmp_path: Path
) -> None:
    url, t = eight_hours
    source = PrometheusSource(PrometheusConfig(url))
    owners = owners_known()
    owners.replicasets[("ops", "early-1")] = "early"
    agg = WindowAggregates(WINDOW)
    policy = Policy()
    for k in range(7):  # t, t + 5 min, …, t + 30 min
        now = t + 300 * k
        start, end = agg.next_read(now)
        before = source.queries
        slots = fetch_slots(source, [], start, end, slot_s=agg.slot_s, owners=owners)
        assert source.queries - before == 9
        assert len(slots) == (24 if k == 0 else 1)
        for slot in slots:
            agg.fold(slot)
        agg.prune(now)
        if k == 3:  # the operator restarts: it goes on from the checkpoint
            agg = WindowAggregates.from_bytes(agg.to_bytes())
        folded = agg.evidence(now)
        fresh = fetch(source, [], WINDOW, at=now, owners=owners)
        # ops/early's only slot leaves the window at t + 15 min, as its data leaves a fresh read
        assert (
            set(folded) == set(fresh) == {API, BATCH, WEB, IDLE} | ({EARLY} if k < 3 else set())
        ), k
        for key in (API, BATCH, WEB, IDLE):
            current = Current(fresh[key].limit_millicores, fresh[key].request_millicores)
            got = advise((folded[key], current, policy, WINDOW))
            want = advise((fresh[key], current, policy, WINDOW))
            if want is None:
                assert got is None and key == IDLE
                continue
            assert got is not None, (k, key)
            assert (got.limit_millicores, got.burst_us) == (want.limit_millicores, want.burst_us)
            if key == API:  # throttled half the time under 500m: a change worth comparing
                assert got.limit_millicores != 500 or got.burst_us > 0
