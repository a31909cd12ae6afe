"""The pod level: a pod cgroup's quota over its containers' (pure, no I/O).

A kubelet gives a pod whose containers all have CPU limits a quota of its own, the sum of
its containers' limits, on a period grid of its own and with no burst. When the pod runs
out first, the containers' threads stall, and the containers' own counters do not show it
(docs/model.md, "The pod level").

- :func:`stalled_us`: how long a container's threads stalled on the quotas in a window,
  from the container's throttled time and its pod's (the rule the lab's evidence uses and
  the agent's window logic can call);
- :func:`pod_series_bandwidth`: the one bandwidth that stands for a container and a pod
  quota over it at the series level (one container, aligned grids);
- :func:`unthrottle.cfs.pod_series.simulate_pod_series`: several containers' series under
  their quotas and their pod's.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from unthrottle.units import Bandwidth

Stall = TypeVar("Stall", int, npt.NDArray[np.int64])


def stalled_us(
    throttled_us: Stall, pod_throttled_us: Stall | None, wait_us: Stall | None = None
) -> Stall:
    """The time a container's threads stalled on the quotas in a window, µs: its own
    throttled time plus its pod's (``None``: no pod quota, or not read), and no more than
    its threads waited (``wait_us``, their schedstat run delay, where it is read), never
    less than its own throttled time.

    The kernel books a throttle in the cgroup whose quota ran out: the pod's stalls are in
    the pod's ``throttled_time``, not in the container's. Measured on the demo's batch
    (bench/results/pod-stall.json, docs/model.md "The pod level"): the two added up to
    0.52–1.15× the throttled time of the same container alone, and the threads' wait to
    0.86–2.68× the sum. Where both quotas run out together (equal quotas, grids 7 ms apart)
    both cgroups book the same stall, and the sum passed the wait by up to 16 %; the wait,
    which counts a stalled thread once, caps it. The container's own throttled time alone
    (cAdvisor's, today's agent's) was 0.09–0.86× the sum.
    """
    if pod_throttled_us is None:
        return throttled_us
    total: Stall = throttled_us + pod_throttled_us
    if wait_us is None:
        return total
    capped: Stall = np.maximum(throttled_us, np.minimum(total, wait_us))
    return capped if isinstance(capped, np.ndarray) else type(throttled_us)(capped)


def pod_series_bandwidth(container: Bandwidth, pod: Bandwidth | None) -> Bandwidth:
    """What a pod quota over one container leaves it, for :func:`simulate_series`.

    The series model has no phase: both buckets refill at the same boundaries. Then every
    period the container may use the smaller of the two runtimes, and each bucket is
    ``min(left + quota, quota + burst)``; with the pod's quota at least the container's
    (a kubelet's, the sum of the limits), the pod's bucket binds only through its burst:
    the container's burst above the pod's is never spent (the pod has none unless set).
    So the pair is the container's quota with the smaller burst, and no larger than the
    pod's quota. A pod quota below a single container's would be the pod's own quota.
    """
    if pod is None or pod.quota_us is None:
        return container
    if container.quota_us is None:
        return Bandwidth(pod.quota_us, pod.period_us, pod.burst_us)
    if pod.period_us != container.period_us:
        raise ValueError("pod: the series model takes a pod on its container's period")
    quota = min(container.quota_us, pod.quota_us)
    burst = min(container.burst_us, pod.burst_us + (pod.quota_us - quota), quota)
    return Bandwidth(quota, container.period_us, burst)


def pod_figures(nr_periods: int, nr_throttled: int, throttled_us: int) -> dict[str, float]:
    """A pod cgroup's counters over a run, as ``lab run`` and ``simulate`` print them
    (``"pod"`` beside the container's own)."""
    return {
        "nr_periods": nr_periods,
        "nr_throttled": nr_throttled,
        "throttled_ms": round(throttled_us / 1000, 3),
        "throttle_ratio": round(nr_throttled / nr_periods, 4) if nr_periods else 0.0,
    }
