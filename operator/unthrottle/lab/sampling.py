"""Per-period samples of a lab run: usage and throttled time, aligned with the kernel.

This is the period-level evidence the recommendation engine takes:
demand = usage + throttled time, per period. Observed usage alone is censored
by the quota (DESIGN.md §2).

The lab knows the cgroup's period grid (it calibrated it), so readings are
taken 1 ms after each boundary: the kernel adds a period's throttled time
when it unthrottles, at the refill, and 1 ms leaves time for that. (The node
agent cannot see the grid; how much that costs it is measured in
bench/window_alignment.py.)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unthrottle.cgroups import Cgroup
from unthrottle.cgroups.counters import CounterReader
from unthrottle.cgroups.schedule import ScheduledReader

AFTER_BOUNDARY_NS = 1_000_000


@dataclass(frozen=True, slots=True)
class PeriodSamples:
    """Per-period usage and throttled time (µs) of one run."""

    usage_us: npt.NDArray[np.int64]
    throttled_us: npt.NDArray[np.int64]
    period_us: int

    @property
    def demand_us(self) -> npt.NDArray[np.int64]:
        """Per-period demand: usage plus throttled time (censoring corrected)."""
        return self.usage_us + self.throttled_us


class PeriodSampler:
    """Reads a lab cgroup once per period from ``start_ns`` on, 1 ms after each boundary."""

    def __init__(self, cgroup: Cgroup, start_ns: int, period_ns: int) -> None:
        self.reader = CounterReader(cgroup.layout, cgroup.path)
        self.period_ns = period_ns
        self.schedule = ScheduledReader(
            self.reader, start_ns + period_ns, period_ns, AFTER_BOUNDARY_NS, baseline=True
        )

    def start(self) -> None:
        """Start sampling in the background."""
        self.schedule.start()

    def stop(self) -> None:
        """Stop sampling and close the cgroup's files."""
        self.schedule.stop()
        self.reader.close()

    def samples(self) -> PeriodSamples:
        """What was sampled, as arrays, each window as one period's worth.

        A reading taken late (the sampler thread waits its turn on a busy machine)
        makes one window span more than a period; it is scaled by its real length
        so that it does not read as twice the demand.
        """
        readings = self.schedule.readings
        usage, throttled = [], []
        for (t0, a), (t1, b) in itertools.pairwise(readings):
            scale = self.period_ns / (t1 - t0) if t1 - t0 > 1.5 * self.period_ns else 1.0
            usage.append(round((b.usage_us - a.usage_us) * scale))
            throttled.append(round((b.throttled_us - a.throttled_us) * scale))
        return PeriodSamples(
            np.asarray(usage, dtype=np.int64),
            np.asarray(throttled, dtype=np.int64),
            self.period_ns // 1000,
        )
