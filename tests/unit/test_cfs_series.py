"""The per-period demand model: exact cases worked by hand, then properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unthrottle.cfs import simulate_series, trace_series
from unthrottle.units import Bandwidth

Q = 50_000  # 0.5 CPU at the default 100 ms period


class TestWorkedCases:
    def test_demand_over_the_quota_is_deferred_to_the_next_period(self) -> None:
        trace = trace_series([30_000, 80_000, 10_000], Bandwidth(Q))
        assert trace.used_us.tolist() == [30_000, 50_000, 40_000]
        assert trace.deferred_us.tolist() == [0, 30_000, 0]
        assert trace.throttled.tolist() == [False, True, False]

    def test_idle_periods_do_not_count_as_periods(self) -> None:
        result = simulate_series([30_000, 80_000, 10_000, 0, 0, 60_000], Bandwidth(Q))
        assert (result.nr_periods, result.nr_throttled) == (4, 2)
        assert result.throttle_ratio == 0.5
        assert result.final_deferred_us == 10_000

    def test_burst_saved_from_quiet_periods_absorbs_a_spike(self) -> None:
        demand = [20_000, 20_000, 75_000]
        assert simulate_series(demand, Bandwidth(Q)).nr_throttled == 1
        with_burst = simulate_series(demand, Bandwidth(Q, burst_us=25_000))
        assert with_burst.nr_throttled == 0
        assert (with_burst.nr_bursts, with_burst.burst_us) == (1, 25_000)

    def test_burst_is_capped_at_its_setting_however_long_the_quiet(self) -> None:
        demand = [0] * 50 + [90_000]
        result = simulate_series(demand, Bandwidth(Q, burst_us=30_000))
        assert result.nr_throttled == 1
        assert result.final_deferred_us == 10_000

    def test_a_multi_threaded_period_may_want_more_than_the_period(self) -> None:
        result = simulate_series([350_000], Bandwidth(200_000))
        assert result.final_deferred_us == 150_000

    def test_no_limit_never_throttles(self) -> None:
        result = simulate_series([10**7, 0, 5], Bandwidth())
        assert result.nr_throttled == 0
        assert result.used_us == result.demand_us

    def test_negative_demand_is_refused(self) -> None:
        with pytest.raises(ValueError, match="negative"):
            simulate_series([10, -1], Bandwidth(Q))


demands = st.lists(st.integers(0, 400_000), min_size=1, max_size=60)
quotas = st.integers(1_000, 300_000)


@st.composite
def bandwidths(draw: st.DrawFn) -> Bandwidth:
    quota = draw(quotas)
    return Bandwidth(quota, 100_000, draw(st.integers(0, quota)))


class TestProperties:
    @settings(max_examples=2000)
    @given(demands, bandwidths())
    def test_cpu_work_is_conserved(self, demand: list[int], bw: Bandwidth) -> None:
        result = simulate_series(demand, bw)
        assert result.used_us + result.final_deferred_us == sum(demand)
        trace = trace_series(demand, bw)
        assert (trace.used_us >= 0).all()
        assert (trace.deferred_us >= 0).all()

    @settings(max_examples=1000)
    @given(demands, st.integers(0, 100_000))
    def test_no_throttling_when_the_quota_covers_every_period(
        self, demand: list[int], burst: int
    ) -> None:
        quota = max(*demand, 1_000)
        result = simulate_series(demand, Bandwidth(quota, 1_000_000, min(burst, quota)))
        assert result.nr_throttled == 0
        assert result.deferred_us == 0

    @settings(max_examples=2000)
    @given(demands, bandwidths(), st.integers(0, 200_000))
    def test_the_throttle_ratio_never_rises_when_the_limit_rises(
        self, demand: list[int], bw: Bandwidth, more: int
    ) -> None:
        assert bw.quota_us is not None
        higher = Bandwidth(bw.quota_us + more, bw.period_us, bw.burst_us)
        low, high = simulate_series(demand, bw), simulate_series(demand, higher)
        assert high.nr_throttled <= low.nr_throttled
        assert high.throttle_ratio <= low.throttle_ratio
        assert high.deferred_us <= low.deferred_us

    @settings(max_examples=2000)
    @given(demands, bandwidths(), st.integers(0, 300_000))
    def test_burst_never_raises_throttling(
        self, demand: list[int], bw: Bandwidth, more: int
    ) -> None:
        assert bw.quota_us is not None
        bigger = Bandwidth(bw.quota_us, bw.period_us, min(bw.quota_us, bw.burst_us + more))
        assert (
            simulate_series(demand, bigger).nr_throttled <= simulate_series(demand, bw).nr_throttled
        )

    @settings(max_examples=300)
    @given(demands, bandwidths())
    def test_the_vectorised_model_matches_a_period_by_period_loop(
        self, demand: list[int], bw: Bandwidth
    ) -> None:
        assert bw.quota_us is not None
        runtime, owed, throttled = bw.quota_us + bw.burst_us, 0, []
        for d in demand:
            want = d + owed
            used = min(want, runtime)
            owed = want - used
            throttled.append(owed > 0)
            runtime = min(runtime - used + bw.quota_us, bw.quota_us + bw.burst_us)
        assert trace_series(demand, bw).throttled.tolist() == throttled

    def test_a_week_of_periods_runs_in_one_call(self) -> None:
        demand = np.random.default_rng(7).integers(0, 120_000, 6_048_000)
        result = simulate_series(demand, Bandwidth(60_000, burst_us=20_000))
        assert result.periods == 6_048_000
        assert result.used_us + result.final_deferred_us == int(demand.sum())
