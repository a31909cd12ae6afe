"""Evidence rebuilt from the agent's histogram keeps its distribution and sizes like the truth."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from unthrottle.agent.sampling import BUCKETS_CORES
from unthrottle.recommend import Current, PeriodEvidence, Policy, Strategy, recommend
from unthrottle.recommend.histogram import MAX_PERIODS, evidence_from_histogram, highest, quantile

INF = math.inf


def histogram_of(demand_cores: np.ndarray) -> tuple[list[float], list[float]]:
    """What Prometheus holds for these windows: cumulative counts per agent bucket."""
    bounds = [*BUCKETS_CORES, INF]
    cumulative = [float(np.count_nonzero(demand_cores <= b)) for b in bounds]
    return bounds, cumulative


def test_the_rebuilt_windows_fall_in_the_same_buckets() -> None:
    bounds, cumulative = histogram_of(np.asarray([0.1] * 70 + [0.45] * 20 + [1.8] * 10))
    rebuilt = evidence_from_histogram(bounds, cumulative, period_us=100_000)
    assert rebuilt.periods == 100
    assert histogram_of(rebuilt.demand_us / 100_000)[1] == cumulative


def test_each_bucket_s_windows_are_spread_evenly_up_to_its_bound() -> None:
    # 3 windows in (0, 0.3] core, 1 in (0.3, 0.6], 1 above the top bound (read at 0.6)
    rebuilt = evidence_from_histogram([0.3, 0.6, INF], [3, 4, 5], period_us=100_000)
    assert sorted(rebuilt.demand_us.tolist()) == [10_000, 20_000, 30_000, 60_000, 60_000]


def test_busy_windows_are_scattered_not_back_to_back() -> None:
    # the engine simulates a sequence: ten busy windows in a row would drain a burst that
    # ten scattered ones (what independent windows look like) leave full
    bounds, cumulative = histogram_of(np.asarray([0.1] * 90 + [1.8] * 10))
    busy = evidence_from_histogram(bounds, cumulative, period_us=100_000).demand_us > 100_000
    assert np.count_nonzero(busy) == 10
    longest = max(len(run) for run in "".join("x" if b else " " for b in busy).split())
    assert longest <= 3


def test_another_process_rebuilds_the_same_sequence() -> None:
    # two runs of `recommend` on the same history give the same burst: the order is seeded
    bounds, cumulative = histogram_of(np.linspace(0, 2, 500))
    here = evidence_from_histogram(bounds, cumulative, period_us=100_000).demand_us.tolist()
    code = (
        "import json, sys\n"
        "from unthrottle.recommend.histogram import evidence_from_histogram\n"
        "bounds, cumulative = json.load(sys.stdin)\n"
        "e = evidence_from_histogram(bounds, cumulative, period_us=100_000)\n"
        "print(json.dumps(e.demand_us.tolist()))\n"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps([bounds, cumulative]), text=True,
        capture_output=True, check=True, env={**os.environ, "PYTHONHASHSEED": "7"},
    )  # fmt: skip
    assert json.loads(there.stdout) == here
    assert here != sorted(here)


def test_windows_above_the_top_bucket_sit_at_its_bound() -> None:
    rebuilt = evidence_from_histogram([1.0, 64.0, INF], [5, 5, 8], period_us=100_000)
    assert sorted(rebuilt.demand_us.tolist())[-3:] == [6_400_000] * 3


def test_a_week_of_windows_is_capped_in_proportion() -> None:
    rebuilt = evidence_from_histogram(
        [0.5, 1.0, INF], [9e6, 12e6, 12e6], period_us=100_000, max_periods=1200
    )
    assert rebuilt.periods == 1200
    assert np.count_nonzero(rebuilt.demand_us <= 50_000) == 900


def test_a_recommendation_from_the_histogram_matches_one_from_the_windows() -> None:
    # independent windows (what the rebuild assumes): most quiet, one in ten busy
    rng = np.random.default_rng(5)
    cores = np.where(rng.random(5000) < 0.1, rng.uniform(0.5, 0.9, 5000), rng.uniform(0, 0.2, 5000))
    truth = PeriodEvidence(np.rint(cores * 100_000).astype(np.int64))
    rebuilt = evidence_from_histogram(*histogram_of(cores), period_us=100_000)
    policy = Policy(strategy=Strategy.LIMIT_ONLY, headroom=0, max_step_up=10)
    want = recommend(truth, Current(300), policy).limit_millicores
    got = recommend(rebuilt, Current(300), policy).limit_millicores
    assert want is not None and got is not None
    assert abs(got - want) <= 0.15 * want  # within the bucket resolution near the answer


def test_a_days_histogram_sizes_like_its_capped_rebuild() -> None:
    # 864,000 windows (a day), capped to MAX_PERIODS: the answer must not move
    rng = np.random.default_rng(11)
    cores = np.where(rng.random(864_000) < 0.08, rng.uniform(0.6, 1.4, 864_000),
                     rng.uniform(0.05, 0.3, 864_000))  # fmt: skip
    bounds, cumulative = histogram_of(cores)
    capped = evidence_from_histogram(bounds, cumulative, period_us=100_000)
    full = evidence_from_histogram(bounds, cumulative, period_us=100_000, max_periods=10**7)
    assert capped.periods <= MAX_PERIODS < full.periods == 864_000
    # a day's windows, however many are simulated: confidence and reasons say so
    assert capped.observed_periods == 864_000 and full.stands_for is None
    assert recommend(capped, Current(300), Policy()).confidence == 1.0
    assert (
        "864000 periods, rebuilt as 50000" in recommend(capped, Current(300), Policy()).reasons[0]
    )
    for strategy in (Strategy.LIMIT_ONLY, Strategy.AUTO):
        policy = Policy(strategy=strategy, max_step_up=10)
        want, got = recommend(full, Current(300), policy), recommend(capped, Current(300), policy)
        assert want.limit_millicores is not None and got.limit_millicores is not None
        assert abs(got.limit_millicores - want.limit_millicores) <= 0.02 * want.limit_millicores
        assert abs(got.burst_us - want.burst_us) <= max(2000, 0.1 * want.burst_us)
        assert got.expected_throttle_ratio is not None and want.expected_throttle_ratio is not None
        assert abs(got.expected_throttle_ratio - want.expected_throttle_ratio) < 0.005


def test_quantiles_interpolate_as_promql_does() -> None:
    bounds, cumulative = [0.25, 0.5, 1.0, INF], [70.0, 90.0, 100.0, 100.0]
    assert quantile(bounds, cumulative, 0.5) == pytest.approx(0.25 * 50 / 70)
    assert quantile(bounds, cumulative, 0.8) == pytest.approx(0.375)  # half-way in (0.25, 0.5]
    assert quantile(bounds, cumulative, 0.99) == pytest.approx(0.95)
    assert highest(bounds, cumulative) == 1.0
    # windows above the top bound sit at it; an empty histogram has no quantile
    assert quantile([1.0, INF], [5.0, 10.0], 0.99) == 1.0 == highest([1.0, INF], [5.0, 10.0])
    assert quantile([1.0, INF], [0.0, 0.0], 0.5) is None
