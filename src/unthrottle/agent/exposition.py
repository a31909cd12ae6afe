"""The /metrics text (Prometheus exposition format 0.0.4), rendered directly.

prometheus-client's generic collector path was measured at about 0.9 ms of CPU
per cgroup per scrape with a dozen buckets, ten times what 100 ms sampling costs
the same cgroup in a second (0.09 ms); a node has hundreds of containers. This
renderer builds each container's label set once per scrape, formats the bucket
bounds once per process, and writes lines with plain string joins: about 0.05 ms per
container per scrape (77 series each, the backlog series included; 0.03 ms for the 41
before them) on the machines of docs/benchmarks.md §5 ("What the agent costs",
``bench/results/agent-cost.json``). The format is checked by prometheus-client's parser
and by a real Prometheus server in the tests. Metric names: docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from unthrottle.agent.sampling import BUCKETS_CORES, Series
from unthrottle.cfs.backlog import LEVELS_MILLICORES, OVER_QUOTAS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LE = [repr(b) for b in BUCKETS_CORES] + ["+Inf"]
BACKLOG = "unthrottle_cpu_demand_backlog_windows_total"
ACTIVE = "unthrottle_cpu_active_windows_total"
_BACKLOG_LABELS = [[f',level="{level / 1000:g}",over="{over:g}"' for over in OVER_QUOTAS]
                   for level in LEVELS_MILLICORES]  # fmt: skip

_HELP = [
    ("unthrottle_cpu_demand_cores", "histogram",
     "CPU wanted per sampling window (usage + the larger of throttled time and wait), "
     "in cores."),
    (BACKLOG, "counter",
     "Sampling windows in which the demand above `level` cores, carried from window to "
     "window (a token bucket's debt at that limit), passed `over` x level x window."),
    (ACTIVE, "counter", "Sampling windows with demand (the backlog's denominator)."),
    ("unthrottle_cpu_demand_peak_cores", "gauge",
     "Largest window demand in the trailing peak window, in cores."),
    ("unthrottle_cpu_usage_seconds_total", "counter", "CPU time used."),
    ("unthrottle_cpu_cfs_periods_total", "counter", "CFS periods with the cgroup active."),
    ("unthrottle_cpu_cfs_throttled_periods_total", "counter", "CFS periods that throttled."),
    ("unthrottle_cpu_cfs_throttled_seconds_total", "counter",
     "Time throttled, summed over CPUs (cpu.stat throttled_time)."),
    ("unthrottle_cpu_wait_seconds_total", "counter",
     "Time the container's threads waited for a CPU (schedstat run delay: throttled or "
     "behind other processes)."),
    ("unthrottle_cpu_cfs_bursts_total", "counter", "Periods that used CFS burst."),
    ("unthrottle_cpu_cfs_burst_seconds_total", "counter", "CPU time used above the quota."),
    ("unthrottle_cpu_cfs_quota_seconds", "gauge", "CFS quota per period (absent: no limit)."),
    ("unthrottle_cpu_cfs_period_seconds", "gauge", "CFS period."),
    ("unthrottle_cpu_cfs_burst_seconds", "gauge", "CFS burst setting."),
]  # fmt: skip


def escape(value: str) -> str:
    """A label value as the exposition format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(series: Iterable[Series], *, windows: int = 0, cgroups: int = 0) -> bytes:
    """Every container's metrics, grouped by metric family."""
    rows = [
        (
            f'namespace="{escape(s.found.namespace)}",pod="{escape(s.found.pod)}",'
            f'container="{escape(s.found.container)}"',
            s,
        )
        for s in series
    ]
    out: list[str] = []
    head = {name: f"# HELP {name} {text}\n# TYPE {name} {kind}" for name, kind, text in _HELP}

    out.append(head["unthrottle_cpu_demand_cores"])
    for labels, s in rows:
        running = 0
        prefix = f'unthrottle_cpu_demand_cores_bucket{{{labels},le="'
        for le, count in zip(_LE, s.counts, strict=True):
            running += count
            out.append(f'{prefix}{le}"}} {running}')
        out.append(f"unthrottle_cpu_demand_cores_sum{{{labels}}} {s.sum_cores!r}")
        out.append(f"unthrottle_cpu_demand_cores_count{{{labels}}} {s.total}")

    out.append(head[BACKLOG])
    for labels, s in rows:
        if s.backlog is not None:
            for counts, names in zip(s.backlog.above, _BACKLOG_LABELS, strict=True):
                for count, name in zip(counts, names, strict=True):
                    out.append(f"{BACKLOG}{{{labels}{name}}} {count}")

    def family(name: str, value: object) -> None:
        out.append(head[name])
        for labels, s in rows:
            v = value(s)  # type: ignore[operator]
            if v is not None:
                out.append(f"{name}{{{labels}}} {v!r}")

    family(ACTIVE, lambda s: None if s.backlog is None else s.backlog.active)
    family("unthrottle_cpu_demand_peak_cores", lambda s: s.peak)
    family("unthrottle_cpu_usage_seconds_total", lambda s: s.latest.usage_us / 1e6)
    family("unthrottle_cpu_cfs_periods_total", lambda s: s.latest.nr_periods)
    family("unthrottle_cpu_cfs_throttled_periods_total", lambda s: s.latest.nr_throttled)
    family("unthrottle_cpu_cfs_throttled_seconds_total", lambda s: s.latest.throttled_us / 1e6)
    family("unthrottle_cpu_wait_seconds_total",
           lambda s: s.wait_us / 1e6 if s.wait_measured else None)  # fmt: skip
    family("unthrottle_cpu_cfs_bursts_total", lambda s: s.latest.nr_bursts)
    family("unthrottle_cpu_cfs_burst_seconds_total", lambda s: s.latest.burst_us / 1e6)
    family(
        "unthrottle_cpu_cfs_quota_seconds",
        lambda s: None if s.bandwidth.quota_us is None else s.bandwidth.quota_us / 1e6,
    )
    family("unthrottle_cpu_cfs_period_seconds", lambda s: s.bandwidth.period_us / 1e6)
    family("unthrottle_cpu_cfs_burst_seconds", lambda s: s.bandwidth.burst_us / 1e6)
    out.append("# HELP unthrottle_agent_windows_total Sampling windows taken.")
    out.append("# TYPE unthrottle_agent_windows_total counter")
    out.append(f"unthrottle_agent_windows_total {windows}")
    out.append("# HELP unthrottle_agent_cgroups Cgroups being sampled.")
    out.append("# TYPE unthrottle_agent_cgroups gauge")
    out.append(f"unthrottle_agent_cgroups {cgroups}")
    return ("\n".join(out) + "\n").encode()
