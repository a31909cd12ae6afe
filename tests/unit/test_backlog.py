"""The backlog series keep the order the histogram loses, and the engine sizes bursts by it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from unthrottle.agent.sampling import BUCKETS_CORES
from unthrottle.cfs import simulate_series, trace_series
from unthrottle.cfs.backlog import LEVELS_MILLICORES, OVER_QUOTAS, BacklogFold, fold
from unthrottle.recommend import Current, PeriodEvidence, Policy, Strategy, recommend
from unthrottle.recommend.engine import ORDER_UNKNOWN
from unthrottle.recommend.histogram import evidence_from_histogram
from unthrottle.units import Bandwidth
from unthrottle_lab.agentview import View, as_read

W = 100_000
UNKNOWN = "the order of the windows is unknown"
"""What every reason that rests on a lost order starts with: where the worst order raised
the limit, and where a burst held in it (``ORDER_UNKNOWN``)."""


def clustered() -> np.ndarray:
    """The demo's batch: 1.6 s of two busy cores, 1.6 s of nothing, over and over."""
    return np.array(([200_000] * 16 + [0] * 16) * 20, dtype=np.int64)


def scattered() -> np.ndarray:
    """Seed 002's burst: a 20 ms task every 93 ms, so a window now and then holds two."""
    starts = np.arange(600) * 93_000
    return (np.bincount(starts // W, minlength=560)[:550] * 20_000).astype(np.int64)


def noisy() -> np.ndarray:
    rng = np.random.default_rng(7)
    busy = rng.random(2000) < 0.3
    runs = np.repeat(busy[:400], 5)  # runs of five windows
    return np.where(runs, rng.integers(50_000, 400_000, 2000), rng.integers(0, 40_000, 2000))


SEQUENCES = {"clustered": clustered, "scattered": scattered, "noisy": noisy}


@pytest.mark.parametrize("name", SEQUENCES)
def test_the_windows_over_a_threshold_are_the_model_s_throttled_windows(name: str) -> None:
    demand = SEQUENCES[name]()
    counts = fold(demand, W)
    for level in LEVELS_MILLICORES:
        quota = level * W // 1000
        for over in (o for o in OVER_QUOTAS if o <= 1):
            burst = round(over * quota)
            throttled = int(trace_series(demand, Bandwidth(quota, W, burst)).throttled.sum())
            assert counts.above[(level, over)] == throttled, (level, over)
    assert counts.active == np.count_nonzero(demand)


@pytest.mark.parametrize("name", SEQUENCES)
def test_the_bound_is_never_below_the_model_s_ratio_between_levels_too(name: str) -> None:
    demand = SEQUENCES[name]()
    counts = fold(demand, W)
    for millicores in (150, 300, 700, 1000, 1300, 1800, 2500, 5000):
        quota = millicores * W // 1000
        for burst in (0, quota // 4, quota // 2, quota):
            bound = counts.ratio_at_most(millicores, burst)
            ratio = simulate_series(demand, Bandwidth(quota, W, burst)).throttle_ratio
            assert bound is not None and bound >= ratio - 1e-12


def test_quiet_windows_in_one_go_count_as_one_by_one() -> None:
    one, many = BacklogFold(W), BacklogFold(W)
    for fold_ in (one, many):
        for d in (900_000, 450_000, 380_000):
            fold_.observe(d)
    for _ in range(7):
        one.observe(0)
    many.idle(7)
    assert one.above == many.above and one.backlog == many.backlog and one.active == 3


def test_below_the_lowest_level_nothing_is_known() -> None:
    assert fold(scattered(), W).ratio_at_most(50, 5_000) is None


def agent_view(demand: np.ndarray, *, with_backlog: bool) -> PeriodEvidence:
    """What the operator reads of these windows: the histogram, and the backlog if exported."""
    bounds = [*BUCKETS_CORES, math.inf]
    cumulative = [float(np.count_nonzero(demand / W <= b)) for b in bounds]
    rebuilt = evidence_from_histogram(bounds, cumulative, period_us=W)
    return replace(rebuilt, backlog=fold(demand, W)) if with_backlog else rebuilt


def test_peaks_in_runs_get_no_burst_but_a_limit_that_covers_them() -> None:
    rec = recommend(agent_view(clustered(), with_backlog=True), Current(1000), Policy())
    assert rec.burst_us == 0 and rec.limit_millicores is not None
    assert rec.limit_millicores >= 2000
    assert any("does not show that a burst" in r for r in rec.reasons)


def test_without_the_backlog_runs_get_no_burst_the_worst_order_would_drain() -> None:
    # an agent without the series: the order is unknown, and the burst is weighed in the
    # order worst for it (all the peaks in one run), not in the rebuild's shuffled one
    rec = recommend(agent_view(clustered(), with_backlog=False), Current(1000), Policy())
    assert rec.burst_us == 0 and rec.limit_millicores is not None
    assert rec.limit_millicores >= 2000
    assert any("order of the windows is unknown" in r and "if they came in one run" in r
               for r in rec.reasons)  # fmt: skip
    quota = rec.limit_millicores * W // 1000
    kernel_like = trace_series(clustered(), Bandwidth(quota, W, rec.burst_us)).throttled
    assert kernel_like.sum() / np.count_nonzero(clustered()) <= 0.05  # what the kernel sees


def test_without_the_backlog_scattered_peaks_pay_for_the_order_they_might_have() -> None:
    # the burst the backlog confirms for peaks that stand apart is not offered on a histogram
    # alone, since in one run they would drain it: a larger limit instead, and the reason
    known = recommend(agent_view(scattered(), with_backlog=True), Current(250), Policy())
    evidence = agent_view(scattered(), with_backlog=False)
    unknown = recommend(evidence, Current(250), Policy())
    assert known.limit_millicores is not None and unknown.limit_millicores is not None
    assert known.burst_us > 0 and ORDER_UNKNOWN not in known.reasons
    assert any(UNKNOWN in r for r in unknown.reasons)
    assert unknown.limit_millicores > known.limit_millicores
    quota = unknown.limit_millicores * W // 1000
    worst = np.sort(evidence.demand_us)[::-1]
    if unknown.burst_us:  # a burst, if any, holds with the peaks in one run
        ratio = simulate_series(worst, Bandwidth(quota, W, unknown.burst_us)).throttle_ratio
        assert ratio <= 0.05
    assert unknown.expected_throttle_ratio is not None and unknown.expected_throttle_ratio <= 0.05


@pytest.mark.parametrize("seed", range(40))
def test_no_order_throttles_more_windows_than_the_peaks_in_one_run(seed: int) -> None:
    # what the engine assumes of a histogram alone: the largest first, all together
    rng = np.random.default_rng(seed)
    demand = np.where(rng.random(60) < 0.4, rng.integers(0, 300_000, 60), 0).astype(np.int64)
    worst_first = np.sort(demand)[::-1]
    for millicores in (300, 800, 1500):
        quota = millicores * W // 1000
        for burst in (0, quota // 3, quota):
            band = Bandwidth(quota, W, burst)
            worst = int(trace_series(worst_first, band).throttled.sum())
            for _ in range(25):
                shuffled = rng.permutation(demand)
                assert int(trace_series(shuffled, band).throttled.sum()) <= worst


def test_scattered_peaks_keep_a_burst_that_the_order_confirms() -> None:
    rec = recommend(agent_view(scattered(), with_backlog=True), Current(250), Policy())
    assert rec.burst_us > 0 and rec.limit_millicores is not None
    assert rec.limit_millicores <= 300
    quota = rec.limit_millicores * W // 1000
    in_order = trace_series(scattered(), Bandwidth(quota, W, rec.burst_us)).throttled
    assert in_order.sum() / np.count_nonzero(scattered()) <= 0.05
    assert ORDER_UNKNOWN not in rec.reasons


@pytest.mark.parametrize("strategy", [Strategy.AUTO, Strategy.BURST_PREFERRED])
def test_more_backlog_never_gives_a_smaller_limit(strategy: Strategy) -> None:
    policy = Policy(strategy=strategy)
    base = agent_view(scattered(), with_backlog=True)
    worse = replace(base, backlog=fold(np.sort(scattered())[::-1], W))  # same windows, in a run
    a = recommend(base, Current(250), policy).limit_millicores
    b = recommend(worse, Current(250), policy).limit_millicores
    assert a is not None and b is not None and b >= a


@pytest.mark.parametrize("view", list(View))
def test_lab_tune_reads_a_run_as_the_operator_would(view: View) -> None:
    # the lab's in-order samples, seen through the agent's exports (or not)
    in_order = PeriodEvidence(clustered(), W, observed_throttle_ratio=0.9)
    seen = as_read(in_order, view)
    rec = recommend(seen, Current(1000), Policy())
    assert seen.observed_throttle_ratio == 0.9
    assert seen.in_order is (view is View.SEQUENCE)
    assert (seen.backlog is not None) is (view is View.AGENT)
    assert rec.burst_us == 0  # peaks in runs, and where the order is unknown, the worst
    assert any(UNKNOWN in r for r in rec.reasons) is (view is View.HISTOGRAM)
