"""Several containers of one pod at the series level: each under its quota, all under the
pod's (a kubelet's: the sum of their limits). Pure, no I/O; see :mod:`unthrottle.cfs.pod`.

A period loop, not vectorised (the buckets interact): for sizing a multi-container pod so
that every container, and so the sum, meets a target, not for weeks of history at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unthrottle.cfs.series import IntArray, SeriesResult, as_demand
from unthrottle.units import Bandwidth


@dataclass(frozen=True, slots=True)
class PodSeriesResult:
    """Several containers' demand series under their quotas and their pod's."""

    containers: tuple[SeriesResult, ...]
    """Each container's counters: its own throttles and the pod's, as
    :func:`stalled_us` counts them (a period in which it got less than it wanted)."""
    pod_nr_throttled: int
    """Periods in which the pod's runtime was short of what its containers could use."""
    pod_nr_periods: int
    """Periods in which any container wanted CPU."""

    @property
    def worst_ratio(self) -> float:
        """The highest throttle ratio among the containers: what a target holds."""
        return max((c.throttle_ratio for c in self.containers), default=0.0)


def simulate_pod_series(
    demands_us: Sequence[Sequence[int] | IntArray], containers: Sequence[Bandwidth], pod: Bandwidth
) -> PodSeriesResult:
    """Simulate several containers of one pod, period by period: each draws on its own
    bucket, and the pod's bucket caps what they draw together (a kubelet's pod quota is the
    sum of their limits). Where the pod's runtime is short, it is shared in proportion to
    what each container's own quota let it draw (an approximation: the kernel hands it out
    in per-CPU slices, first come). No phase between the grids (as :func:`simulate_series`),
    so the result is for sizing: which limits keep every container under a target once
    the pod's quota is their sum. Work not done is deferred, never lost; integers."""
    if len(demands_us) != len(containers) or not containers:
        raise ValueError("demands: one series per container, at least one")
    series = [as_demand(d) for d in demands_us]
    length = len(series[0])
    if any(len(d) != length for d in series):
        raise ValueError("demands: every container's series must be as long")
    if any(c.period_us != pod.period_us for c in containers):
        raise ValueError("pod: the series model takes a pod on its containers' period")
    k = len(containers)
    inf = np.iinfo(np.int64).max // 4
    quota = np.array([c.quota_us if c.quota_us is not None else inf for c in containers])
    cap = np.array([c.quota_us + c.burst_us if c.quota_us is not None else inf
                    for c in containers], dtype=np.int64)  # fmt: skip
    bucket = cap.copy()
    pod_quota = pod.quota_us if pod.quota_us is not None else inf
    pod_cap = pod_quota + pod.burst_us if pod.quota_us is not None else inf
    pod_bucket = pod_cap
    owed = np.zeros(k, dtype=np.int64)
    demand = np.stack(series) if length else np.zeros((k, 0), dtype=np.int64)
    used = np.zeros((k, length), dtype=np.int64)
    deferred = np.zeros((k, length), dtype=np.int64)
    pod_throttled = 0
    for t in range(length):
        wanted = demand[:, t] + owed
        drawn = np.minimum(wanted, bucket)
        total = int(drawn.sum())
        if total > pod_bucket:
            pod_throttled += 1
            drawn = _share(drawn, int(pod_bucket))
        used[:, t] = drawn
        owed = wanted - drawn
        deferred[:, t] = owed
        bucket = np.minimum(bucket - drawn + quota, cap)
        pod_bucket = min(pod_bucket - int(drawn.sum()) + pod_quota, pod_cap)
    results = tuple(_sum_up(demand[i], used[i], deferred[i], containers[i]) for i in range(k))
    active: npt.NDArray[np.bool_] = np.asarray((demand > 0).any(axis=0), dtype=np.bool_)
    if length > 1:
        active[1:] |= np.asarray((deferred[:, :-1] > 0).any(axis=0), dtype=np.bool_)
    return PodSeriesResult(results, pod_throttled, int(np.count_nonzero(active)))


def _share(drawn: IntArray, runtime: int) -> IntArray:
    """``runtime`` shared in proportion to ``drawn``, in integers (largest remainders)."""
    total = int(drawn.sum())
    exact = drawn * runtime
    share = exact // total
    rest = runtime - int(share.sum())
    order = np.argsort(-(exact % total), kind="stable")
    share[order[:rest]] += 1
    shared: IntArray = share
    return shared


def _sum_up(demand: IntArray, used: IntArray, deferred: IntArray, bw: Bandwidth) -> SeriesResult:
    active = demand > 0
    active[1:] |= deferred[:-1] > 0
    throttled = deferred > 0
    nr_periods = int(np.count_nonzero(active))
    nr_throttled = int(np.count_nonzero(throttled))
    over = np.maximum(used - bw.quota_us, 0) if bw.quota_us is not None else np.zeros_like(used)
    return SeriesResult(
        periods=int(demand.size),
        nr_periods=nr_periods,
        nr_throttled=nr_throttled,
        throttle_ratio=nr_throttled / nr_periods if nr_periods else 0.0,
        demand_us=int(demand.sum()),
        used_us=int(used.sum()),
        deferred_us=int(deferred.sum()),
        final_deferred_us=int(deferred[-1]) if deferred.size else 0,
        max_deferred_us=int(deferred.max()) if deferred.size else 0,
        nr_bursts=int(np.count_nonzero(over)),
        burst_us=int(over.sum()),
    )
