"""The CFS bandwidth model: pure, no I/O.

- :mod:`.settings`: quota / period / burst as validated integers; quantities at the edge;
- :mod:`.series`: a per-period demand series under a quota (vectorised);
- :mod:`.tasks`: a task workload on N cores, with ticks, phase and burst, a pod quota and a
  second container (a sidecar); :mod:`.bucket`: one cgroup's bucket in it;
- :mod:`.pod`: the pod level: a container's stall under its pod's quota, the pair at the
  series level; :mod:`.pod_series`: several containers of a pod at the series level;
- :mod:`.figures`: the figures of a run, shared with the lab.
"""

from unthrottle.cfs.figures import CpuStatDelta, Latency, RunFigures, nearest_rank
from unthrottle.cfs.pod import pod_figures, pod_series_bandwidth, stalled_us
from unthrottle.cfs.pod_series import PodSeriesResult, simulate_pod_series
from unthrottle.cfs.series import SeriesResult, SeriesTrace, simulate_series, trace_series
from unthrottle.cfs.settings import (
    DEFAULT_PERIOD_US,
    MAX_PERIOD_US,
    MIN_PERIOD_US,
    MIN_QUOTA_US,
    Bandwidth,
    InvalidSettings,
    format_cpu,
    parse_cpu,
)
from unthrottle.cfs.tasks import DEFAULT_HZ, Machine, Sidecar, simulate_tasks
from unthrottle.cfs.workload import Kind, Workload

__all__ = [
    "DEFAULT_HZ",
    "DEFAULT_PERIOD_US",
    "MAX_PERIOD_US",
    "MIN_PERIOD_US",
    "MIN_QUOTA_US",
    "Bandwidth",
    "CpuStatDelta",
    "InvalidSettings",
    "Kind",
    "Latency",
    "Machine",
    "PodSeriesResult",
    "RunFigures",
    "SeriesResult",
    "SeriesTrace",
    "Sidecar",
    "Workload",
    "format_cpu",
    "nearest_rank",
    "parse_cpu",
    "pod_figures",
    "pod_series_bandwidth",
    "simulate_pod_series",
    "simulate_series",
    "simulate_tasks",
    "stalled_us",
    "trace_series",
]
