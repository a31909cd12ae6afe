"""Sample a cgroup once per CFS period during a lab run: usage and throttled time.

This is the period-level evidence the recommendation engine takes:
demand = usage + throttled time, per period. Observed usage alone is censored
by the quota (DESIGN.md §2).

The lab knows the cgroup's period grid (it calibrated it), so samples are
taken 1 ms after each boundary. The kernel adds a period's throttled time when
it unthrottles, at the refill, and 1 ms leaves time for that. (The node agent
cannot see the grid; how much unaligned windows cost is measured there.)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from unthrottle.cgroups import Cgroup

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


@dataclass
class PeriodSampler:
    """A thread that reads a cgroup's counters each period, from ``start_ns`` on."""

    cgroup: Cgroup
    start_ns: int
    period_ns: int
    usage_us: list[int] = field(default_factory=list)
    throttled_us: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling in the background."""
        self._thread = threading.Thread(target=self._run, name="period-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take one last sample and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        previous = self.cgroup.read_stat()
        at = self.start_ns + AFTER_BOUNDARY_NS
        while True:
            at += self.period_ns
            left = at - time.monotonic_ns()
            if self._stop.wait(max(0.0, left / 1e9)):
                break
            now = self.cgroup.read_stat()
            delta = now - previous
            previous = now
            self.usage_us.append(delta.usage_us)
            self.throttled_us.append(delta.throttled_us)

    def samples(self) -> PeriodSamples:
        """What was sampled, as arrays."""
        return PeriodSamples(
            np.asarray(self.usage_us, dtype=np.int64),
            np.asarray(self.throttled_us, dtype=np.int64),
            self.period_ns // 1000,
        )
