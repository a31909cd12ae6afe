"""The recommendation engine: the estimator chain, assembled in one place.

============================  =====================================================
step                          effect
============================  =====================================================
1. quantile for the target    smallest limit whose simulated ratio meets the target
                              (period-level), or a step up ∝ throttling (counters)
2. headroom                   × (1 + headroom), for demand the window missed
3. Auto: average floor        at least the long-run average × (1 + headroom)
4. burst sizing               smallest burst ≤ quota that meets the target
5. bounds                     [limits.min, limits.max], ≥ request, quota ≥ 1 ms
6. step limit                 within ×maxStepDown … ×maxStepUp of today's limit
7. rounding                   up to 10m
8. validity                   bounds again (they win over steps), burst ≤ quota
9. processors                 GOMAXPROCS / JVM count from the final limit
============================  =====================================================

Every step is non-decreasing in demand, so more demand never yields a smaller
limit. The result always satisfies the kernel's and the API server's rules.
"""

from __future__ import annotations

from unthrottle.cfs.series import simulate_series
from unthrottle.cfs.settings import Bandwidth
from unthrottle.recommend.estimators import (
    Draft,
    average_floor,
    bounds,
    burst_for_target,
    confidence,
    counter_step,
    limit_for_target,
    processors,
    quota_of,
    rounded,
    step_limit,
    valid,
    with_headroom,
)
from unthrottle.recommend.types import (
    CounterEvidence,
    Current,
    Evidence,
    PeriodEvidence,
    Policy,
    Recommendation,
    Strategy,
)


def _current_ratio(evidence: Evidence, current: Current) -> float | None:
    if isinstance(evidence, CounterEvidence):
        return evidence.throttle_ratio
    if evidence.observed_throttle_ratio is not None:
        return evidence.observed_throttle_ratio
    if current.limit_millicores is None:
        return 0.0
    quota = max(quota_of(current.limit_millicores, evidence.period_us), 1000)
    bandwidth = Bandwidth(quota, evidence.period_us, min(current.burst_us, quota))
    return simulate_series(evidence.demand_us, bandwidth).throttle_ratio


def _expected_ratio(evidence: Evidence, draft: Draft, period_us: int) -> float | None:
    if isinstance(evidence, CounterEvidence) or draft.limit is None:
        return None if isinstance(evidence, CounterEvidence) else 0.0
    quota = quota_of(draft.limit, period_us)
    bandwidth = Bandwidth(quota, period_us, min(draft.burst_us, quota))
    return round(simulate_series(evidence.demand_us, bandwidth).throttle_ratio, 4)


def _period_chain(evidence: PeriodEvidence, policy: Policy) -> Draft:
    """Steps 1–4 on period-level evidence."""
    burst_allowed = policy.strategy is not Strategy.LIMIT_ONLY
    draft = limit_for_target(evidence, policy.target_ratio, with_burst=burst_allowed)
    draft = with_headroom(draft, policy.headroom)
    if policy.strategy is Strategy.AUTO:
        draft = average_floor(draft, evidence, policy.headroom)
    if burst_allowed:
        draft = burst_for_target(draft, evidence, policy.target_ratio)
    return draft


def recommend(evidence: Evidence, current: Current, policy: Policy) -> Recommendation:
    """A recommendation for one container: always valid, with its reasons."""
    if isinstance(evidence, PeriodEvidence):
        if evidence.period_us != current.period_us:
            raise ValueError(
                f"evidence is per {evidence.period_us} µs period but the container's period "
                f"is {current.period_us} µs"
            )
        draft = (
            _period_chain(evidence, policy)
            if evidence.periods
            else Draft(
                current.limit_millicores,
                current.burst_us,
                ("no period-level evidence in the window: nothing to size from",),
            )
        )
    else:
        draft = counter_step(evidence, current, policy)  # headroom is inside the step
    uncapped = rounded(draft).limit  # what the evidence asks for, before bounds and steps
    draft = bounds(draft, policy, current)
    draft = step_limit(draft, policy, current)
    draft = rounded(draft)
    draft = valid(draft, policy, current)
    gomaxprocs, jvm, notes = processors(draft.limit, current, policy)
    expected = _expected_ratio(evidence, draft, current.period_us)
    if expected is not None and expected > policy.target_ratio:
        draft = draft.but(
            reason=f"the target {policy.target_ratio:g} is not met under this recommendation "
            f"(expected {expected:.3f}): a bound or step above held it back"
        )
    return Recommendation(
        limit_millicores=draft.limit,
        burst_us=draft.burst_us,
        period_us=current.period_us,
        gomaxprocs=gomaxprocs,
        jvm_processors=jvm,
        expected_throttle_ratio=expected,
        current_throttle_ratio=_current_ratio(evidence, current),
        confidence=confidence(evidence) if not _empty(evidence) else 0.0,
        reasons=[*draft.reasons, *notes],
        uncapped_limit_millicores=uncapped,
    )


def _empty(evidence: Evidence) -> bool:
    if isinstance(evidence, PeriodEvidence):
        return evidence.periods == 0
    return evidence.nr_periods == 0 and evidence.window_s == 0
