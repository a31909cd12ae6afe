"""Per-period samples of a lab run: usage, throttled time and wait, aligned with the kernel.

This is the period-level evidence the recommendation engine takes: demand =
usage + the larger of throttled time and wait, per period. Observed usage alone
is censored by the quota (DESIGN.md §2), and on a busy machine also by the other
processes: a thread waiting for a CPU is neither running nor throttled. The
wait (``cgroups.waits``: the threads' schedstat run delay) holds the throttled
waits too, so the larger of the two is taken, never their sum.

The lab knows the cgroup's period grid (it calibrated it), so readings are
taken 1 ms after each boundary: the kernel adds a period's throttled time
when it unthrottles, at the refill, and 1 ms leaves time for that. (The node
agent cannot see the grid; how much that costs it is measured in
bench/window_alignment.py.)
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unthrottle.cgroups import Cgroup, CpuStat, Layout
from unthrottle.cgroups.counters import CounterReader
from unthrottle.cgroups.schedule import ScheduledReader
from unthrottle.cgroups.waits import WaitReader

AFTER_BOUNDARY_NS = 1_000_000


@dataclass(frozen=True, slots=True)
class PeriodSamples:
    """Per-period usage and throttled time (µs) of one run."""

    usage_us: npt.NDArray[np.int64]
    throttled_us: npt.NDArray[np.int64]
    period_us: int
    wait_us: npt.NDArray[np.int64] | None = None
    """Per-period wait of the threads (throttled or behind other processes), if read."""
    threads: int = 0
    """The most threads the cgroup had while it was sampled (0: not read)."""

    @property
    def demand_us(self) -> npt.NDArray[np.int64]:
        """Per-period demand: usage plus the larger of throttled time and wait (censoring
        by the quota and by other processes corrected, neither counted twice).

        The kernel adds a thread's wait when the thread next runs, so a long wait lands
        in the window after the one it was spent in: beside two busy threads, one thread's
        windows read up to 139 ms of demand per 100 ms. No window can want more than its
        threads × its length, so the wait counts up to that (never below usage +
        throttled time)."""
        base = self.usage_us + self.throttled_us
        if self.wait_us is None:
            return base
        wanted = self.usage_us + np.maximum(self.throttled_us, self.wait_us)
        if self.threads:
            wanted = np.maximum(base, np.minimum(wanted, self.threads * self.period_us))
        demand: npt.NDArray[np.int64] = wanted
        return demand

    @property
    def contention_us(self) -> npt.NDArray[np.int64]:
        """Per-period wait that was not the quota's: behind other processes."""
        if self.wait_us is None:
            return np.zeros_like(self.usage_us)
        contention: npt.NDArray[np.int64] = np.maximum(self.wait_us - self.throttled_us, 0)
        return contention


class CountersAndWaits(CounterReader):
    """A cgroup's counters with its threads' wait in each reading (``CpuStat.wait_us``)."""

    def __init__(self, layout: Layout, path: str) -> None:
        super().__init__(layout, path)
        self.waits = WaitReader(layout, path)
        self.most_threads = 0

    def read(self) -> CpuStat:
        """The counters, then the threads' summed run delay, µs."""
        stat = super().read()
        wait = self.waits.wait_us()
        self.most_threads = max(self.most_threads, self.waits.threads)
        return dataclasses.replace(stat, wait_us=wait)

    def close(self) -> None:
        """Close the counters' and the threads' files."""
        self.waits.close()
        super().close()


class PeriodSampler:
    """Reads a lab cgroup once per period from ``start_ns`` on, 1 ms after each boundary."""

    def __init__(self, cgroup: Cgroup, start_ns: int, period_ns: int) -> None:
        self.reader = CountersAndWaits(cgroup.layout, cgroup.path)
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
        usage, throttled, wait = [], [], []
        for (t0, a), (t1, b) in itertools.pairwise(readings):
            scale = self.period_ns / (t1 - t0) if t1 - t0 > 1.5 * self.period_ns else 1.0
            usage.append(round((b.usage_us - a.usage_us) * scale))
            throttled.append(round((b.throttled_us - a.throttled_us) * scale))
            wait.append(round((b.wait_us - a.wait_us) * scale))
        return PeriodSamples(
            np.asarray(usage, dtype=np.int64),
            np.asarray(throttled, dtype=np.int64),
            self.period_ns // 1000,
            np.asarray(wait, dtype=np.int64),
            self.reader.most_threads,
        )
