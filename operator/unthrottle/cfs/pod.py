"""The pod level: a pod cgroup's quota over its containers' (pure, no I/O).

A kubelet gives a pod whose containers all have CPU limits a quota of its own, the sum of
its containers' limits, on a period grid of its own and with no burst. When the pod runs
out first, the containers' threads stall, and the containers' own counters do not show it
(docs/model.md, "The pod level").

- :func:`stalled_us`: how long a container's threads stalled on the quotas in a window,
  from the container's throttled time and its pod's (the rule the lab's evidence uses and
  the agent's window logic can call);
- :func:`pod_series_bandwidth`: the one bandwidth that stands for a container and a pod
  quota over it at the series level (one container, aligned grids).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from unthrottle.cfs.settings import Bandwidth

Stall = TypeVar("Stall", int, npt.NDArray[np.int64])


def stalled_us(throttled_us: Stall, pod_throttled_us: Stall | None) -> Stall:
    """The time a container's threads stalled on the quotas in a window, µs: its own
    throttled time plus its pod's (``None``: no pod quota, or not read).

    The kernel books a throttle only in the cgroup whose quota ran out: the pod's stalls
    are in the pod's ``throttled_time`` and not in the container's. Measured on the demo's
    batch (docs/model.md, "The pod level"): the container's throttled time plus its pod's
    came to the throttled time the same run had without the pod quota, and the threads'
    run delay (``cgroups.waits``) to at least that sum. The sum counts twice a CPU stalled
    by both at once; the two run out together only where the quotas are equal and the
    grids in phase, and then the kernel books it once (the first to run out).
    """
    if pod_throttled_us is None:
        return throttled_us
    total: Stall = throttled_us + pod_throttled_us
    return total


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
