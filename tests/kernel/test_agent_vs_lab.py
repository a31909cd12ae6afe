"""The agent's demand histogram agrees with the lab's aligned measurement of the same run.

The lab samples the cgroup on the kernel's own period grid (the truth). The
agent's code (its counter reader and its histogram) samples the same run at
the same time through unaligned 100 ms windows, half a period off the grid.
Its histogram's quantiles, read the way PromQL's ``histogram_quantile`` does,
must fall within a bucket of the truth (root only).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from unthrottle.agent.discovery import Found
from unthrottle.agent.sampling import BUCKETS_CORES, Series
from unthrottle.cgroups import Cgroup, CpuStat, Layout
from unthrottle.cgroups.counters import CounterReader
from unthrottle.units import Bandwidth
from unthrottle_lab.runner import LabOptions, run_sampled
from unthrottle_lab.scenario import parse_scenario
from unthrottle_lab.schedule import ScheduledReader

pytestmark = pytest.mark.kernel

SCENARIO = parse_scenario(
    {
        "name": "agent-vs-lab",
        "workload": {
            "kind": "open",
            "task_cpu_ms": 8,
            "workers": 2,
            "tasks": 180,
            "rate_per_s": 60,
            "seed": 3,
        },
        "runs": [{"cpus": 0.6}],
    }
)


def histogram_quantile(q: float, counts: list[int]) -> float:
    """PromQL's histogram_quantile over the agent's (non-cumulative) bucket counts."""
    bounds = [0.0, *BUCKETS_CORES]
    total = sum(counts)
    rank = q * total
    running = 0
    for i, count in enumerate(counts[:-1]):
        if running + count >= rank:
            low, high = bounds[i], bounds[i + 1]
            return low + (high - low) * (rank - running) / count if count else high
        running += count
    return BUCKETS_CORES[-1]


def bucket_width(value: float) -> float:
    bounds = [0.0, *BUCKETS_CORES]
    for low, high in itertools.pairwise(bounds):
        if value <= high:
            return high - low
    return bounds[-1]


def test_the_agents_histogram_matches_the_kernel_aligned_truth(layout: Layout) -> None:
    taken: dict[str, ScheduledReader] = {}

    def watch(cgroup: Cgroup, t0: int, period_ns: int) -> Callable[[], None]:
        reader = CounterReader(layout, cgroup.path)
        taken["agent"] = ScheduledReader(reader, t0, period_ns, phase_ns=period_ns // 2)
        taken["agent"].start()

        def stop() -> None:
            taken["agent"].stop()
            reader.close()

        return stop

    # Isolated: another process's load would move the two samplings' windows apart.
    _, truth = run_sampled(SCENARIO.workload.to_workload(), SCENARIO.runs[0], layout,
                           LabOptions(isolate=True), watch=watch)  # fmt: skip
    # The agent's own histogram, fed the cumulative usage + throttled time of each reading.
    readings = [(at, s.usage_us + s.throttled_us) for at, s in taken["agent"].readings]
    series = Series(Found("x", "", "x", ""), None, Bandwidth(60_000), readings[0][1],  # type: ignore[arg-type]
                    readings[0][0], CpuStat(0, 0, 0, 0, 0, 0))  # fmt: skip
    for at, demand in readings[1:]:
        series.observe(demand, at, keep=10)
    # Like with like: both usage + throttled time (the wait is the agent's own tests').
    # Idle periods count, as idle windows do.
    aligned = (truth.usage_us + truth.throttled_us) / truth.period_us
    assert series.total >= 0.8 * aligned.size
    for q in (0.5, 0.9):
        want = float(np.quantile(aligned, q, method="inverted_cdf"))
        got = histogram_quantile(q, series.counts)
        assert abs(got - want) <= bucket_width(want) + 0.05, (q, got, want, series.counts)
