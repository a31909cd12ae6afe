"""The CFS bandwidth model: pure, no I/O.

- :mod:`.settings`: quota / period / burst as validated integers; quantities at the edge;
- :mod:`.series`: a per-period demand series under a quota (vectorised);
- :mod:`.tasks`: a task workload on N cores, with ticks, phase and burst, a pod quota and a
  second container (a sidecar); :mod:`.bucket`: one cgroup's bucket in it;
- :mod:`.pod`: the pod level: a container's stall under its pod's quota, the pair at the
  series level; :mod:`.pod_series`: several containers of a pod at the series level;
- :mod:`.figures`: the figures of a run, shared with the lab.
"""

from unthrottle.cfs.pod import pod_figures, pod_series_bandwidth, stalled_us
from unthrottle.cfs.pod_series import PodSeriesResult, simulate_pod_series
from unthrottle.cfs.series import SeriesResult, SeriesTrace, simulate_series, trace_series
from unthrottle.units import (
    DEFAULT_PERIOD_US,
    MAX_PERIOD_US,
    MIN_PERIOD_US,
    MIN_QUOTA_US,
    Bandwidth,
    InvalidSettings,
    format_cpu,
    parse_cpu,
)

__all__ = [
    "DEFAULT_PERIOD_US",
    "MAX_PERIOD_US",
    "MIN_PERIOD_US",
    "MIN_QUOTA_US",
    "Bandwidth",
    "InvalidSettings",
    "PodSeriesResult",
    "SeriesResult",
    "SeriesTrace",
    "format_cpu",
    "parse_cpu",
    "pod_figures",
    "pod_series_bandwidth",
    "simulate_pod_series",
    "simulate_series",
    "stalled_us",
    "trace_series",
]
