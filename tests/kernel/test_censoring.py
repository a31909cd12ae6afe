"""Demand under censoring, against the truth (root only).

The same workload is measured unlimited (its true per-period demand) and under
a limit that throttles it, where usage alone is capped by the quota. Demand
estimated as usage + throttled time must recover the truth well enough that the
recommendation made from the throttled run matches the one from the truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from unthrottle.cgroups import Layout
from unthrottle.recommend import Current, PeriodEvidence, Policy, Strategy, recommend
from unthrottle_lab.runner import LabOptions, run_sampled
from unthrottle_lab.scenario import parse_scenario

pytestmark = pytest.mark.kernel

SCENARIO = parse_scenario(
    {
        "name": "censoring",
        "workload": {"kind": "batch", "task_cpu_ms": 40, "workers": 2, "tasks": 24},
        "runs": [{}, {"cpus": 0.5}],
    }
)
POLICY = Policy(strategy=Strategy.LIMIT_ONLY, headroom=0, max_step_up=100, min_millicores=10)


def test_usage_plus_throttled_time_recovers_the_demand_that_usage_hides(
    layout: Layout,
) -> None:
    """The censoring is the kernel's; the recovery compares two runs' demand, which another
    process on the 2 cores would change (two workers left one core want one core): so both
    runs measure with the machine's other processes at idle priority (``isolate``), and
    the sampler, in this process, wakes on time beside them."""
    workload = SCENARIO.workload.to_workload()
    options = LabOptions(isolate=True)
    _, truth = run_sampled(workload, SCENARIO.runs[0], layout, options)
    limited, seen = run_sampled(workload, SCENARIO.runs[1], layout, options)
    # Censored: usage under the limit stays at the quota (50 ms a period). One window may
    # catch more and the next less: the sampler's windows sit 1 ms after the boundaries and
    # wake with some jitter (beside a hog in CI: a median window of 51.2 ms, one of 85 ms
    # next to one of 34 ms). So the bound is on the mean: n windows span at most n + 1
    # periods' quota, plus the 5 ms slice each CPU may carry into the first.
    windows = len(seen.usage_us)
    assert np.mean(seen.usage_us) <= (50_000 * (windows + 1) + 2 * 5_000) / windows
    assert limited.stat.throttle_ratio > 0.8
    busy = truth.demand_us[truth.demand_us > 0]
    # Two threads busy back to back: ~2 CPUs of demand per period.
    assert np.median(busy) > 150_000
    # Estimated: usage + throttled time is back near the truth.
    estimated = seen.demand_us[seen.demand_us > 0]
    assert np.median(estimated) == pytest.approx(np.median(busy), rel=0.2)

    from_truth = recommend(PeriodEvidence(truth.demand_us), Current(None), POLICY)
    from_throttled = recommend(PeriodEvidence(seen.demand_us), Current(500), POLICY)
    from_usage = recommend(PeriodEvidence(seen.usage_us), Current(500), POLICY)
    assert from_truth.limit_millicores and from_throttled.limit_millicores
    assert from_usage.limit_millicores
    ratio = from_throttled.limit_millicores / from_truth.limit_millicores
    # On a miss, the windows say which run read off. A late reading's counters are
    # attributed by the refills its window holds (docs/benchmarks.md §3, "Late readings";
    # a measured run whose refills were booked after the readings, 1.36x as read, is
    # replayed in tests/unit/test_late_readings.py).
    assert 0.8 <= ratio <= 1.25, (
        f"{from_throttled.limit_millicores}m from the throttled run, "
        f"{from_truth.limit_millicores}m from the truth; demand per window, ms: "
        f"truth {(truth.demand_us // 1000).tolist()}, throttled {(seen.demand_us // 1000).tolist()}"
    )
    # Sizing from usage alone would keep the limit where it is, and the throttling.
    assert from_usage.limit_millicores < 0.5 * from_truth.limit_millicores
