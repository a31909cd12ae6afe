"""A refinement never goes below what the container used (issue 40 §1).

Once a recommendation runs unthrottled, its windows show the demand itself, and the
engine refines from them, possibly down. Windows can read less than the container used:
on CI ``lab tune`` refined an answer that met (2,140m) to 1,850m + 43 ms from windows
that read less than the run's counters (about 1.93 cores), and the kernel throttled it.
The usage counter over the window (``PeriodEvidence.usage_cores``) is what it certainly
used: the refinement stays at that plus headroom, or at today's limit, which met.
"""

from __future__ import annotations

import numpy as np
import pytest

from unthrottle.recommend import Current, PeriodEvidence, Policy, recommend

TODAY = Current(limit_millicores=2140)
"""The answer that met the target on CI, now today's limit."""
SHORT_WINDOWS = np.array([170_000, 160_000, 175_000, 150_000, 165_000, 168_000], dtype=np.int64)
"""Six windows of a run at 2,140m, unthrottled, that read 1.65 cores on average: less than
the run's counters (1.93 cores), as the windows of the CI run did."""
COUNTERS_CORES = 1.93


def refining(usage_cores: float | None) -> PeriodEvidence:
    return PeriodEvidence(SHORT_WINDOWS, observed_throttle_ratio=0.0, usage_cores=usage_cores)


def test_windows_that_read_less_than_the_counters_step_down_below_them_without_the_rule() -> None:
    """What the rule is for: from the windows alone the engine steps below what was used."""
    rec = recommend(refining(None), TODAY, Policy())
    assert rec.limit_millicores is not None
    assert rec.limit_millicores < 1000 * COUNTERS_CORES, rec


@pytest.mark.parametrize("policy", [Policy(), Policy(strategy="BurstPreferred"),
                                    Policy(strategy="LimitOnly")],
                         ids=["auto", "burst-preferred", "limit-only"])  # fmt: skip
def test_a_refinement_stays_at_or_above_the_usage_its_counters_measured(policy: Policy) -> None:
    rec = recommend(refining(COUNTERS_CORES), TODAY, policy)
    assert rec.limit_millicores is not None
    assert 1000 * COUNTERS_CORES <= rec.limit_millicores <= TODAY.limit_millicores, rec
    assert rec.burst_us <= rec.limit_millicores * 100  # valid: never above the quota
    said = [r for r in rec.reasons if "its usage counter measured over the window" in r]
    assert said and "1930m" in said[0], rec.reasons


def test_where_usage_and_headroom_pass_todays_limit_the_answer_that_met_is_kept() -> None:
    rec = recommend(refining(2.05), TODAY, Policy())
    assert rec.limit_millicores == TODAY.limit_millicores, rec
    assert any("today's limit, which met the target" in r for r in rec.reasons), rec.reasons


def test_throttled_evidence_is_not_held_by_the_rule() -> None:
    """Past the target the evidence is censored and the limit goes up: no refinement."""
    throttled = PeriodEvidence(SHORT_WINDOWS + 60_000, observed_throttle_ratio=0.5,
                               usage_cores=COUNTERS_CORES)  # fmt: skip
    rec = recommend(throttled, Current(limit_millicores=1500), Policy())
    assert not any("its usage counter" in r for r in rec.reasons), rec.reasons
