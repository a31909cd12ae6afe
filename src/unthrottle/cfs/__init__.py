"""The CFS series model the engine sizes with: pure, no I/O.

- :mod:`.series`: a per-period demand series under a quota (vectorised);
- :mod:`.backlog`: the order of busy windows, which a histogram loses;
- :mod:`.pod`: the pod level: a container's stall under its pod's quota, the pair at the
  series level; :mod:`.pod_series`: several containers of a pod at the series level.

Quotas, periods and bursts as the kernel takes them are :mod:`unthrottle.units`; the task
simulator, which predicts what the lab measures, is the laboratory's
(``unthrottle_lab.sim``).
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
