"""The recommendation engine: worked cases, the rules it never breaks, and its properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unthrottle.cfs import simulate_series
from unthrottle.recommend import (
    CounterEvidence,
    Current,
    PeriodEvidence,
    Policy,
    PolicyError,
    Recommendation,
    Runtime,
    Strategy,
    recommend,
)
from unthrottle.units import Bandwidth

PERIOD = 100_000


def evidence(demand: list[int] | np.ndarray) -> PeriodEvidence:
    return PeriodEvidence(np.asarray(demand, dtype=np.int64), PERIOD)


def bursty(n: int = 3000, seed: int = 1) -> np.ndarray:
    """15 ms most periods, 60 ms in one period in ten: average 0.195 CPU, peaks 0.6."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.1, 60_000, 15_000).astype(np.int64)


def simulated_ratio(demand: np.ndarray, rec: Recommendation) -> float:
    assert rec.limit_millicores is not None
    quota = rec.limit_millicores * PERIOD // 1000
    return simulate_series(demand, Bandwidth(quota, PERIOD, rec.burst_us)).throttle_ratio


class TestPeriodEvidence:
    def test_limit_only_gives_the_smallest_limit_that_meets_the_target(self) -> None:
        demand = bursty()
        policy = Policy(strategy=Strategy.LIMIT_ONLY, headroom=0, max_step_up=10)
        rec = recommend(evidence(demand), Current(250), policy)
        assert rec.burst_us == 0
        assert simulated_ratio(demand, rec) <= 0.05
        # 10m less (before rounding) would not meet it
        lower = Recommendation(rec.limit_millicores - 10, 0, PERIOD, None, None, None, None, 0)  # type: ignore[operator]
        assert simulated_ratio(demand, lower) > 0.05

    def test_auto_absorbs_short_peaks_with_burst_and_a_smaller_limit(self) -> None:
        demand = bursty()
        limit_only = recommend(evidence(demand), Current(250), Policy(strategy=Strategy.LIMIT_ONLY))
        auto = recommend(evidence(demand), Current(250), Policy(strategy=Strategy.AUTO))
        assert auto.burst_us > 0
        assert auto.limit_millicores is not None and limit_only.limit_millicores is not None
        assert auto.limit_millicores < limit_only.limit_millicores
        assert auto.expected_throttle_ratio is not None and auto.expected_throttle_ratio <= 0.05

    def test_auto_takes_a_larger_limit_when_demand_is_sustained(self) -> None:
        demand = np.full(2000, 70_000, dtype=np.int64)  # 0.7 CPU, all the time
        auto = recommend(evidence(demand), Current(500), Policy(strategy=Strategy.AUTO))
        assert auto.limit_millicores is not None and auto.limit_millicores >= 700
        assert auto.expected_throttle_ratio == 0

    def test_demand_is_what_counts_not_capped_usage(self) -> None:
        # Throttled at 0.5 CPU, usage reads 50 ms; demand (usage + throttled) reads 100 ms.
        rec = recommend(evidence([100_000] * 500), Current(500), Policy(max_step_up=3))
        assert rec.limit_millicores is not None and rec.limit_millicores >= 1000
        assert rec.current_throttle_ratio == 1.0

    def test_reasons_say_which_estimator_decided_and_what_capped_it(self) -> None:
        rec = recommend(evidence([100_000] * 500), Current(250), Policy())
        assert any("smallest limit" in r for r in rec.reasons)
        assert any("step limited to ×2" in r for r in rec.reasons)
        assert any("not met" in r for r in rec.reasons)
        assert rec.limit_millicores == 500

    def test_a_day_of_periods_is_full_confidence_and_seconds_are_low(self) -> None:
        day = recommend(evidence(np.full(864_000, 10_000)), Current(None), Policy())
        seconds = recommend(evidence([10_000] * 50), Current(None), Policy())
        assert day.confidence == 1.0 and day.confidence_label == "high"
        assert seconds.confidence_label == "low"

    def test_no_evidence_keeps_todays_settings_with_zero_confidence(self) -> None:
        rec = recommend(evidence([]), Current(300, burst_us=5_000), Policy())
        assert (rec.limit_millicores, rec.burst_us, rec.confidence) == (300, 5_000, 0.0)

    def test_evidence_at_another_period_is_refused(self) -> None:
        with pytest.raises(ValueError, match="period"):
            recommend(evidence([1]), Current(300, period_us=50_000), Policy())


class TestCounterEvidence:
    def test_throttling_steps_the_limit_up_in_proportion_and_says_it_is_coarse(self) -> None:
        counters = CounterEvidence(3600, 0.2, 36_000, 9_000)  # ratio 0.25
        rec = recommend(counters, Current(400), Policy())
        assert rec.limit_millicores == 500  # 400 × 1.25
        assert rec.expected_throttle_ratio is None
        assert any("coarse evidence" in r for r in rec.reasons)

    def test_heavy_throttling_never_jumps_past_the_step_limit_or_max(self) -> None:
        counters = CounterEvidence(3600, 0.9, 36_000, 35_000)
        assert recommend(counters, Current(1000), Policy()).limit_millicores == 1980  # 1973 ↑ 10m
        capped = recommend(counters, Current(1000), Policy(max_millicores=1500))
        assert capped.limit_millicores == 1500

    def test_a_container_that_meets_the_target_keeps_its_limit(self) -> None:
        counters = CounterEvidence(3600, 0.2, 36_000, 100)
        assert recommend(counters, Current(700), Policy()).limit_millicores == 700

    def test_counters_get_half_the_confidence(self) -> None:
        counters = CounterEvidence(86_400, 0.2, 864_000, 100)
        assert recommend(counters, Current(700), Policy()).confidence == 0.5


class TestValidity:
    def test_a_limit_is_never_below_the_request_even_past_max(self) -> None:
        rec = recommend(evidence([1_000] * 100), Current(2000, request_millicores=1500),
                        Policy(max_millicores=1000))  # fmt: skip
        assert rec.limit_millicores == 1500
        assert any("request" in r for r in rec.reasons)

    def test_the_quota_is_at_least_1ms_at_a_short_period(self) -> None:
        ev = PeriodEvidence(np.zeros(100, dtype=np.int64), 2_000)
        rec = recommend(ev, Current(None, period_us=2_000), Policy(min_millicores=1))
        assert rec.quota_us is not None and rec.quota_us >= 1_000

    def test_burst_never_exceeds_the_quota(self) -> None:
        rec = recommend(
            evidence(bursty()), Current(250), Policy(max_millicores=100, min_millicores=50)
        )
        assert rec.quota_us is not None and rec.burst_us <= rec.quota_us


class TestProcessors:
    @pytest.mark.parametrize(
        ("current", "gomaxprocs", "jvm"),
        [
            (Current(None, runtime=Runtime.GO, go_at_least_1_25=False), 3, None),
            (Current(None, runtime=Runtime.GO, go_at_least_1_25=True), None, None),
            (Current(None, runtime=Runtime.GO, go_at_least_1_25=True, gomaxprocs_env=64), 3, None),
            (Current(None, runtime=Runtime.JVM), None, 3),
            (Current(None, runtime=Runtime.OTHER), None, None),
        ],
        ids=["old-go", "go-1.25-unset", "go-1.25-explicit", "jvm", "other"],
    )
    def test_processor_counts_follow_the_limit(
        self, current: Current, gomaxprocs: int | None, jvm: int | None
    ) -> None:
        demand = np.full(500, 250_000, dtype=np.int64)  # 2.5 CPUs
        rec = recommend(evidence(demand), current, Policy(headroom=0))
        assert rec.limit_millicores == 2500
        assert (rec.gomaxprocs, rec.jvm_processors) == (gomaxprocs, jvm)

    def test_go_1_25_without_an_explicit_value_is_told_to_leave_it_unset(self) -> None:
        current = Current(None, runtime=Runtime.GO, go_at_least_1_25=True)
        rec = recommend(evidence([50_000] * 100), current, Policy())
        assert any("leave GOMAXPROCS unset" in r for r in rec.reasons)

    def test_sync_off_recommends_no_processor_count(self) -> None:
        current = Current(None, runtime=Runtime.GO, go_at_least_1_25=False)
        rec = recommend(evidence([50_000] * 100), current, Policy(sync_processors=False))
        assert rec.gomaxprocs is None


def test_a_strategy_given_as_text_is_the_strategy() -> None:
    demand = evidence(bursty())
    as_text = recommend(demand, Current(250), Policy(strategy="LimitOnly"))  # type: ignore[arg-type]
    as_enum = recommend(demand, Current(250), Policy(strategy=Strategy.LIMIT_ONLY))
    assert as_text == as_enum and as_text.burst_us == 0


class TestPolicyErrors:
    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"min_millicores": 2000, "max_millicores": 1000}, "limits.max"),
            ({"target_ratio": 0.0}, "targetThrottleRatio"),
            ({"target_ratio": 1.0}, "targetThrottleRatio"),
            ({"target_ratio": -0.1}, "targetThrottleRatio"),
            ({"target_ratio": float("nan")}, "targetThrottleRatio"),
            ({"max_step_up": 0.5}, "limits.maxStepUp"),
            ({"max_step_down": 1.5}, "limits.maxStepDown"),
            ({"min_millicores": 0}, "limits.min"),
            ({"headroom": -1}, "headroom"),
            ({"strategy": "Cheapest"}, "strategy"),
        ],
        ids=[
            "min-over-max",
            "target-0",
            "target-1",
            "target-negative",
            "target-nan",
            "step-up-under-1",
            "step-down-over-1",
            "min-0",
            "negative-headroom",
            "unknown-strategy",
        ],
    )
    def test_a_bad_policy_is_refused_naming_the_field(
        self, kwargs: dict[str, float], field: str
    ) -> None:
        with pytest.raises(PolicyError) as info:
            Policy(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
        assert str(info.value).startswith(f"{field}: ")


# --- properties: ≥ 10,000 generated inputs across them ----------------------------------------

demands = st.lists(st.integers(0, 400_000), min_size=1, max_size=40).map(
    lambda d: np.asarray(d, dtype=np.int64)
)
limits = st.one_of(st.none(), st.integers(10, 8_000))


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    low = draw(st.integers(1, 2_000))
    return Policy(
        target_ratio=draw(st.floats(0.01, 0.5)),
        headroom=draw(st.floats(0, 0.5)),
        min_millicores=low,
        max_millicores=draw(st.integers(low, 16_000)),
        max_step_up=draw(st.floats(1, 4)),
        max_step_down=draw(st.floats(0.1, 1)),
        strategy=draw(st.sampled_from(list(Strategy))),
    )


@st.composite
def currents(draw: st.DrawFn) -> Current:
    limit = draw(limits)
    request = draw(st.integers(0, 4_000))
    if limit is not None:
        request = min(request, limit)
    return Current(
        limit_millicores=limit,
        request_millicores=request,
        burst_us=0,
        runtime=draw(st.sampled_from(list(Runtime))),
        go_at_least_1_25=draw(st.booleans()),
    )


def assert_valid(rec: Recommendation, current: Current, policy: Policy) -> None:
    if rec.limit_millicores is None:
        assert rec.burst_us == 0
        return
    assert rec.limit_millicores >= current.request_millicores
    floor = -(-1_000 * 1000 // rec.period_us)  # the kernel's 1 ms quota, in millicores
    if max(current.request_millicores, floor) <= policy.max_millicores:
        assert policy.min_millicores <= rec.limit_millicores <= policy.max_millicores
    assert rec.quota_us is not None and rec.quota_us >= 1_000
    assert 0 <= rec.burst_us <= rec.quota_us
    Bandwidth(rec.quota_us, rec.period_us, rec.burst_us)  # the kernel would take it


class TestProperties:
    @settings(max_examples=4000, deadline=None)
    @given(demands, currents(), policies())
    def test_every_recommendation_is_valid(
        self, demand: np.ndarray, current: Current, policy: Policy
    ) -> None:
        assert_valid(recommend(evidence(demand), current, policy), current, policy)

    @settings(max_examples=1500, deadline=None)
    @given(st.floats(1, 10**6), st.floats(0, 64), st.integers(1, 10**6), st.data(),
           currents(), policies())  # fmt: skip
    def test_every_counter_recommendation_is_valid(
        self, window: float, usage: float, periods: int, data: st.DataObject,
        current: Current, policy: Policy,
    ) -> None:  # fmt: skip
        throttled = data.draw(st.integers(0, periods))
        counters = CounterEvidence(window, usage, periods, throttled)
        assert_valid(recommend(counters, current, policy), current, policy)

    @settings(max_examples=3000, deadline=None)
    @given(demands, st.data(), currents(), policies())
    def test_more_demand_never_yields_a_smaller_limit(
        self, demand: np.ndarray, data: st.DataObject, current: Current, policy: Policy
    ) -> None:
        # More demand in the periods that have demand. (Waking an idle period with a
        # little work adds an unthrottled active period: the kernel's ratio, which the
        # target is in, goes down, and so may the limit. docs/recommend.md.)
        extra = data.draw(st.lists(st.integers(0, 200_000), min_size=demand.size,
                                   max_size=demand.size))  # fmt: skip
        more = demand + np.where(demand > 0, np.asarray(extra, dtype=np.int64), 0)
        low = recommend(evidence(demand), current, policy).limit_millicores
        high = recommend(evidence(more), current, policy).limit_millicores
        assert low is not None and high is not None
        assert high >= low

    @settings(max_examples=1500, deadline=None)
    @given(demands, st.integers(10, 8_000), policies())
    def test_the_step_limits_hold(self, demand: np.ndarray, limit: int, policy: Policy) -> None:
        current = Current(limit)
        rec = recommend(evidence(demand), current, policy)
        assert rec.limit_millicores is not None
        low = max(policy.min_millicores, int(limit * policy.max_step_down))
        high = min(policy.max_millicores, int(limit * policy.max_step_up))
        if policy.min_millicores <= high and low <= policy.max_millicores:
            # within the step (rounding up to 10m may add up to 9m)
            assert rec.limit_millicores <= max(high, policy.min_millicores) + 9
            assert rec.limit_millicores >= min(low, policy.max_millicores) - 1


def test_the_uncapped_limit_shows_what_the_step_limit_held_back() -> None:
    import numpy as np

    from unthrottle.recommend import Current, PeriodEvidence, Policy, recommend

    demand = np.full(6000, 300_000, dtype=np.int64)  # 3 cores wanted in every period
    rec = recommend(PeriodEvidence(demand), Current(500, 100), Policy())
    assert rec.limit_millicores == 1000  # ×2 per step from 500m
    assert rec.uncapped_limit_millicores is not None
    assert rec.uncapped_limit_millicores >= 3000  # the evidence asks for three cores
    assert rec.to_json()["uncapped_limit_millicores"] == rec.uncapped_limit_millicores


class TestFromThrottledData:
    """A recommendation from throttled evidence is the top of a range (issue 13)."""

    TODAY = 300  # 30 ms a period: the 60 ms periods of bursty() throttle

    def overcounted(self, true: np.ndarray) -> PeriodEvidence:
        """What the agent reports for ``true`` at today's limit: usage + throttled time, with
        each throttled period's stall counted on two run queues (more than the work left)."""
        quota = self.TODAY * PERIOD // 1000
        ratio = simulate_series(true, Bandwidth(quota, PERIOD, 0)).throttle_ratio
        seen = np.where(true > quota, true + 2 * (PERIOD - quota), true)
        return PeriodEvidence(seen.astype(np.int64), PERIOD, observed_throttle_ratio=ratio)

    @pytest.mark.parametrize("strategy", list(Strategy))
    def test_the_limit_the_true_demand_needs_lies_in_the_range(self, strategy: Strategy) -> None:
        true = bursty()
        policy = Policy(strategy=strategy, max_step_up=10)
        rec = recommend(self.overcounted(true), Current(self.TODAY), policy)
        truth = recommend(evidence(true), Current(self.TODAY), policy).limit_millicores
        assert rec.is_range and rec.lower_limit_millicores is not None
        assert rec.limit_millicores is not None and truth is not None
        assert rec.lower_limit_millicores <= truth <= rec.limit_millicores
        assert truth < rec.limit_millicores  # the top overshoots: why the range is shown
        said = " ".join(rec.reasons)
        assert "throttled data" in said and "refines it" in said
        assert f"between {rec.lower_limit_millicores}m and {rec.limit_millicores}m" in said
        assert rec.to_json()["lower_limit_millicores"] == rec.lower_limit_millicores
        if strategy is Strategy.LIMIT_ONLY:  # today's limit was measured throttled
            assert rec.lower_limit_millicores > self.TODAY

    def test_unthrottled_evidence_gives_a_point_estimate(self) -> None:
        rec = recommend(evidence(bursty()), Current(1000), Policy())
        assert rec.current_throttle_ratio == 0.0
        assert not rec.is_range and rec.lower_limit_millicores is None
        assert "lower_limit_millicores" not in rec.to_json()
        assert not any("throttled data" in r for r in rec.reasons)

    def test_throttled_counters_give_a_range_above_todays_limit(self) -> None:
        counters = CounterEvidence(3600, 0.4, 36_000, 18_000)  # half the periods throttled
        rec = recommend(counters, Current(500), Policy())
        assert rec.lower_limit_millicores == 510 and rec.limit_millicores is not None
        assert rec.limit_millicores > 510 and rec.is_range
        calm = recommend(CounterEvidence(3600, 0.4, 36_000, 360), Current(500), Policy())
        assert calm.lower_limit_millicores is None

    @settings(max_examples=1500, deadline=None)
    @given(demands, st.data(), st.integers(10, 4_000), policies())
    def test_any_demand_between_what_ran_and_what_was_seen_lands_in_the_range(
        self, seen: np.ndarray, data: st.DataObject, today: int, policy: Policy
    ) -> None:
        # What ran (each period capped at today's quota) ≤ the true demand ≤ what was seen,
        # with the same idle periods. LimitOnly's bottom also rests on the kernel having
        # measured today's limit throttled, which the series alone cannot promise: left out.
        if policy.strategy is Strategy.LIMIT_ONLY:
            policy = Policy(strategy=Strategy.AUTO, target_ratio=policy.target_ratio)
        quota = today * PERIOD // 1000
        ran = np.minimum(seen, quota)
        share = np.asarray(data.draw(st.lists(st.floats(0, 1), min_size=seen.size,
                                              max_size=seen.size)))  # fmt: skip
        true = (ran + np.floor((seen - ran) * share)).astype(np.int64)
        ratio = simulate_series(seen, Bandwidth(max(quota, 1000), PERIOD, 0)).throttle_ratio
        given_ = PeriodEvidence(seen, PERIOD, observed_throttle_ratio=ratio)
        rec = recommend(given_, Current(today), policy)
        truth = recommend(evidence(true), Current(today), policy).limit_millicores
        assert rec.limit_millicores is not None and truth is not None
        bottom = rec.lower_limit_millicores
        if bottom is None:
            assert truth <= rec.limit_millicores
        else:
            assert bottom <= truth <= rec.limit_millicores and bottom < rec.limit_millicores
