"""One cgroup's CFS bandwidth in the task model: a token bucket on a period grid of its own.

The task model (:mod:`unthrottle_lab.sim.tasks`) keeps one bucket per cgroup with a quota: a
container's, a pod's second container's (a sidecar), the pod's. Each has the same parts,
the kernel's ``cfs_bandwidth`` and its per-CPU ``cfs_rq`` runtime:

- a global pool, refilled at its own period boundaries with
  ``min(left + quota, quota + burst)``, debts from overruns paid first;
- each CPU's local runtime, drawn from the pool in slices (``assign_cfs_rq_runtime``),
  kept across refills, and given back beyond ``retained_us`` when the CPU's run queue of
  this cgroup empties;
- each CPU throttled when its local runtime is spent and the pool cannot give more,
  until a refill pays its debt;
- the period timer, which runs while the cgroup is active, and the counters of
  ``cpu.stat`` (``nr_periods``, ``nr_throttled``, ``throttled_usec``, bursts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unthrottle.units import Bandwidth

EPS = 1e-6  # µs; events closer than this are simultaneous


@dataclass(slots=True)
class Bucket:
    """A cgroup's pool, grid, per-CPU runtime and counters (module docstring)."""

    quota: float
    burst: float
    period: float
    next_boundary: float
    """The next period boundary, µs after the workload's start."""
    local: list[float]
    """Per CPU: runtime drawn from the pool and not yet spent (< 0: a debt)."""
    throttled: list[bool]
    """Per CPU: this cgroup's run queue there is throttled."""
    pool: float
    snap: float = 0.0
    """The pool at the last refill, for burst accounting."""
    timer_active: bool = False
    used_since_boundary: float = 0.0
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_us: float = 0.0
    nr_bursts: int = 0
    burst_us: float = 0.0
    periods_at_end: int | None = field(default=None)
    """``nr_periods`` when its cgroup's workload ended (a pod's container that ends first)."""

    @classmethod
    def of(cls, bandwidth: Bandwidth, phase_us: int, cpus: int) -> Bucket | None:
        """The bucket of ``bandwidth`` (None without a quota), full, its grid ``phase_us``
        before the workload's start, over ``cpus`` CPUs."""
        if bandwidth.quota_us is None:
            return None
        period = float(bandwidth.period_us)
        phase = phase_us % bandwidth.period_us
        pool = float(bandwidth.quota_us) + float(bandwidth.burst_us)
        return cls(float(bandwidth.quota_us), float(bandwidth.burst_us), period,
                   period - phase if phase else period, [0.0] * cpus, [False] * cpus,
                   pool, pool)  # fmt: skip

    @property
    def due(self) -> bool:
        """Whether its next boundary is an event: the timer runs, or a CPU waits for it."""
        return self.timer_active or any(self.throttled)

    def draw(self, cpu: int, slice_us: float) -> bool:
        """Top up a CPU's runtime from the pool (``assign_cfs_rq_runtime``); False: none."""
        if self.local[cpu] > EPS:
            return True
        take = min(slice_us - self.local[cpu], max(self.pool, 0.0))
        self.local[cpu] += take
        self.pool -= take
        return self.local[cpu] > EPS

    def check(self, cpu: int, slice_us: float) -> None:
        """Throttle a CPU whose runtime is spent and that the pool cannot top up."""
        if not self.throttled[cpu] and not self.draw(cpu, slice_us):
            self.throttled[cpu] = True

    def give_back(self, cpu: int, keep_us: float) -> None:
        """A CPU's run queue of this cgroup emptied: its runtime beyond ``keep_us`` goes back."""
        if self.local[cpu] > keep_us:
            self.pool += self.local[cpu] - keep_us
            self.local[cpu] = keep_us

    def refill(self) -> None:
        """The period boundary: count, refill, pay debts and unthrottle, maybe stop the timer.
        The caller moves on to the next boundary while ``next_boundary`` is passed."""
        if self.timer_active:
            throttled_now = any(self.throttled)
            self.nr_periods += 1
            self.nr_throttled += int(throttled_now)
            spent = self.snap - self.pool  # global runtime handed out in the period
            if spent > self.quota + EPS and self.burst > 0:
                self.nr_bursts += 1
                self.burst_us += spent - self.quota
            self.pool = min(self.pool + self.quota, self.quota + self.burst)
            self.snap = self.pool
            for cpu, local in enumerate(self.local):
                debt = max(0.0, -local)
                if self.throttled[cpu] and self.pool > debt:
                    self.pool -= debt
                    self.local[cpu] = 0.0
                    self.throttled[cpu] = False
            if self.used_since_boundary <= EPS and not throttled_now:
                self.timer_active = False
        self.used_since_boundary = 0.0
        self.next_boundary += self.period

    def ended(self) -> None:
        """Its cgroup's workload ended now (after this instant's boundaries)."""
        if self.periods_at_end is None:
            self.periods_at_end = self.nr_periods

    def periods_in_span(self) -> tuple[int, int]:
        """``nr_periods`` and ``nr_throttled`` over its workload's span, as the lab reads them.

        The lab reads a pod's containers' counters once both have ended. Where this one
        ended first, its timer counted the period holding its end and the idle one after;
        the lab takes the first out (``lab.runner._within_span``), the idle one stays.
        """
        periods = self.nr_periods
        if self.periods_at_end is not None and periods > self.periods_at_end:
            periods -= 1
        return periods, min(self.nr_throttled, periods)
