"""Simulate CFS bandwidth over a per-period demand series.

Input: CPU µs wanted in each period (it may exceed the period: many threads).
Each period the cgroup may use the runtime it has; demand beyond that is
*deferred* to the next period (work is delayed, never lost), and that period is
*throttled*. Burst is the kernel's token bucket (Linux ≥ 5.14,
``__refill_cfs_bandwidth_runtime``): at each period boundary the runtime
becomes ``min(left_over + quota, quota + burst)``, so unused quota is saved up
to ``burst`` and spent when demand exceeds the quota.

Model assumptions (the task-level model in :mod:`unthrottle_lab.sim.tasks` drops
the first two):

- demand inside a period can always be served while runtime lasts (enough
  cores; no tick granularity, so no overrun past the quota);
- the run starts after an idle spell, with a full bucket (``quota + burst``);
- a period counts in ``nr_periods`` when the cgroup wanted CPU in it (the
  kernel's period timer only runs while the cgroup is active).

The recursion is vectorised. With ``x_t`` = runtime left at the end of period
``t`` minus the work still owed (only one of the two is non-zero)::

    x_t = min(x_{t-1}, burst) + quota - demand_t,   x_0 = burst

which unrolls to ``x_t = S_t + burst - max(0, S_1 … S_{t-1})`` with ``S`` the
running sum of ``quota - demand``. Period ``t`` is throttled when ``x_t < 0``;
``-x_t`` is then the work deferred into period ``t + 1``. Integers throughout:
the result is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unthrottle.cfs.pod import pod_series_bandwidth
from unthrottle.units import Bandwidth

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SeriesTrace:
    """Per-period outcome of a simulation (arrays of equal length, µs)."""

    demand_us: IntArray
    """CPU wanted in the period by new work (the input)."""
    used_us: IntArray
    """CPU the cgroup got in the period (new work and work deferred into it)."""
    deferred_us: IntArray
    """Work still owed at the end of the period, carried into the next one."""
    throttled: npt.NDArray[np.bool_]
    """True where the cgroup ran out of runtime with work left."""


@dataclass(frozen=True, slots=True)
class SeriesResult:
    """What ``cpu.stat`` would report for a demand series, plus the deferred work."""

    periods: int
    """Length of the series."""
    nr_periods: int
    """Periods in which the cgroup wanted CPU (the kernel's ``nr_periods``)."""
    nr_throttled: int
    """Periods that ended with work still owed."""
    throttle_ratio: float
    """``nr_throttled / nr_periods`` (0 for an idle series)."""
    demand_us: int
    """Total CPU wanted."""
    used_us: int
    """Total CPU got; ``demand_us - used_us == final_deferred_us`` (work is conserved)."""
    deferred_us: int
    """Sum over periods of the work carried into the next period (µs × periods)."""
    final_deferred_us: int
    """Work still owed after the last period."""
    max_deferred_us: int
    """The largest amount owed at any boundary."""
    nr_bursts: int
    """Periods that used more than the quota (spent saved burst)."""
    burst_us: int
    """CPU used above the quota, in total."""


def as_demand(demand_us: Sequence[int] | IntArray) -> IntArray:
    """A demand series as a validated int64 array (no negative demand)."""
    arr = np.asarray(demand_us, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError("demand must be a one-dimensional series of µs per period")
    if arr.size and int(arr.min()) < 0:
        raise ValueError("demand: a period's demand cannot be negative")
    return arr


def trace_series(
    demand_us: Sequence[int] | IntArray, bandwidth: Bandwidth, *, pod: Bandwidth | None = None
) -> SeriesTrace:
    """Simulate period by period and return the per-period trace (``pod``: a pod quota
    over the container, :func:`unthrottle.cfs.pod.pod_series_bandwidth`)."""
    demand = as_demand(demand_us)
    bandwidth = pod_series_bandwidth(bandwidth, pod)
    if bandwidth.quota_us is None:
        zeros = np.zeros_like(demand)
        return SeriesTrace(demand, demand.copy(), zeros, np.zeros(demand.shape, dtype=np.bool_))
    quota = bandwidth.quota_us
    burst = bandwidth.burst_us
    running = np.cumsum(quota - demand)  # S_t
    best_before = np.empty_like(running)  # max(0, S_1 … S_{t-1})
    if running.size:
        best_before[0] = 0
        np.maximum.accumulate(running[:-1], out=best_before[1:])
        np.maximum(best_before, 0, out=best_before)
    x = running + burst - best_before
    deferred = np.maximum(-x, 0)
    carried_in = np.empty_like(deferred)
    if deferred.size:
        carried_in[0] = 0
        carried_in[1:] = deferred[:-1]
    used = demand + carried_in - deferred
    return SeriesTrace(demand, used, deferred, x < 0)


def simulate_series(
    demand_us: Sequence[int] | IntArray, bandwidth: Bandwidth, *, pod: Bandwidth | None = None
) -> SeriesResult:
    """Simulate a demand series under ``bandwidth`` and sum it up like ``cpu.stat``.

    ``pod``: the pod cgroup's quota over this one container (a kubelet's: the container's
    limit, no burst); what the two leave the container is one bandwidth at this level
    (:func:`unthrottle.cfs.pod.pod_series_bandwidth`), so a recommendation sized with it
    meets the target under the pod's quota too, and one sized without it does not count on
    a burst the pod's quota takes away. The counters are the container's and its pod's
    together, as the lab's evidence counts them (:func:`unthrottle.cfs.pod.stalled_us`)."""
    bandwidth = pod_series_bandwidth(bandwidth, pod)
    trace = trace_series(demand_us, bandwidth)
    # Active periods: new demand, or work carried in from the period before.
    active = trace.demand_us > 0
    active[1:] |= trace.deferred_us[:-1] > 0
    nr_periods = int(np.count_nonzero(active))
    nr_throttled = int(np.count_nonzero(trace.throttled))
    if bandwidth.quota_us is None:
        over = np.zeros_like(trace.used_us)
    else:
        over = np.maximum(trace.used_us - bandwidth.quota_us, 0)
    return SeriesResult(
        periods=int(trace.demand_us.size),
        nr_periods=nr_periods,
        nr_throttled=nr_throttled,
        throttle_ratio=nr_throttled / nr_periods if nr_periods else 0.0,
        demand_us=int(trace.demand_us.sum()),
        used_us=int(trace.used_us.sum()),
        deferred_us=int(trace.deferred_us.sum()),
        final_deferred_us=int(trace.deferred_us[-1]) if trace.deferred_us.size else 0,
        max_deferred_us=int(trace.deferred_us.max()) if trace.deferred_us.size else 0,
        nr_bursts=int(np.count_nonzero(over)),
        burst_us=int(over.sum()),
    )
