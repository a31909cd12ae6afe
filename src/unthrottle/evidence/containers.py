"""Evidence per Deployment container: what Prometheus knows of one over a window
(:class:`ContainerEvidence`, keyed by :class:`WorkloadKey`), and over one span of it
(:class:`Slot`). Plain data, folded by :mod:`.gathering`; the engine's inputs come from it
(:meth:`ContainerEvidence.period_evidence`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from unthrottle.cfs.backlog import Backlog
from unthrottle.recommend.histogram import evidence_from_histogram, highest, quantile
from unthrottle.recommend.types import CounterEvidence, PeriodEvidence, Waits
from unthrottle.units import DEFAULT_PERIOD_US


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    """A Deployment's container."""

    namespace: str
    deployment: str
    container: str


@dataclass
class ContainerEvidence:
    """What Prometheus knows of one Deployment container over the window."""

    key: WorkloadKey
    pods: set[str] = field(default_factory=set)
    usage_s: float = 0.0
    periods: float = 0.0
    throttled_periods: float = 0.0
    throttled_s: float = 0.0
    wait_s: float | None = None
    """Time its threads waited for a CPU (the agent's counter); None without the agent."""
    pod_throttled_periods: float = 0.0
    """Its share of its pods' own throttled periods (the pod cgroup's quota), beyond its
    own counters: see the module's docstring."""
    pod_throttled_s: float = 0.0
    """Its share of its pods' own throttled time, seconds, beyond its own counters."""
    pressure_s: float | None = None
    """The kubelet's PSI: wall time in which at least one of its threads waited for a CPU
    (``container_pressure_cpu_waiting_seconds_total``, cgroup v2); None where not exported."""
    burst_periods: float | None = None
    """Periods in which it ran above its quota on its burst (cAdvisor's
    ``container_cpu_cfs_burst_periods_total`` or the agent's ``unthrottle_cpu_cfs_bursts_total``):
    0 for a burst never used; None where neither is exported."""
    burst_s: float | None = None
    """CPU time it used above its quota on its burst, seconds (``…_burst_seconds_total``)."""
    buckets: dict[float, float] = field(default_factory=dict)
    """Agent histogram: upper bound (cores) → cumulative windows, summed over pods."""
    backlog: dict[tuple[int, float], float] = field(default_factory=dict)
    """Agent backlog series: (level in millicores, threshold in quotas of the level) →
    windows above it, summed over pods (:mod:`unthrottle.cfs.backlog`); empty from an
    agent without them."""
    active_windows: float | None = None
    """Windows with demand (the backlog's denominator); None without the backlog series."""
    limit_millicores: int | None = None
    request_millicores: int = 0
    gomaxprocs_env: int | None = None
    """An explicit GOMAXPROCS in the container's environment (cluster mode only)."""
    burst_us: int = 0
    """The burst its pod template asks for (cluster mode only)."""
    agent_periods_us: set[int] = field(default_factory=set)
    """The CFS periods (µs) the node agent reports for its pods now
    (``unthrottle_cpu_cfs_period_seconds``): one, or several when its pods run on nodes
    whose kubelets' ``--cpu-cfs-quota-period`` differ; empty without the agent."""

    @property
    def kind(self) -> str:
        """``period`` (agent histogram), ``counters`` (cAdvisor only) or ``none``."""
        if self.buckets and max(self.buckets.values(), default=0) >= 1:
            return "period"
        return "counters" if self.periods >= 1 else "none"

    @property
    def all_throttled_periods(self) -> float:
        """Its own throttled periods and its share of its pods', at most its periods.

        Their sum: where both quotas ran out in the same period it counts that period
        twice, the cap keeping the ratio at most 1 (a container under a pod quota equal to
        its own was throttled by both in the same periods: ``bench/pod_quota.py``)."""
        return min(self.periods, self.throttled_periods + self.pod_throttled_periods)

    @property
    def all_throttled_s(self) -> float:
        """Its own throttled time and its share of its pods', seconds."""
        return self.throttled_s + self.pod_throttled_s

    def throttle_ratio(self) -> float | None:
        """Throttled periods over periods, its pods' share counted (None without periods)."""
        return self.all_throttled_periods / self.periods if self.periods >= 1 else None

    def counters(self, window_s: float, period_us: int = DEFAULT_PERIOD_US) -> CounterEvidence:
        """Counter-level evidence; usage is per active period, so pod churn does not dilute it."""
        period_s = period_us / 1e6
        usage_cores = self.usage_s / (self.periods * period_s) if self.periods >= 1 else 0.0
        return CounterEvidence(
            window_s=window_s,
            usage_cores=usage_cores,
            nr_periods=round(self.periods),
            nr_throttled=round(self.all_throttled_periods),
            throttled_s=self.all_throttled_s,
            waits=self.waits(),
            pod_throttled_s=self.pod_throttled_s,
            burst_periods=self.burst_periods,
        )

    def waits(self) -> Waits | None:
        """Where its threads waited for a CPU: the agent's counter, else the kubelet's PSI (a
        lower bound), else None. The wait holds the throttled waits, the pod's included
        (``bench/pod_wait.py``): the rest was behind other processes."""
        throttled = self.all_throttled_s
        if self.wait_s is not None:
            return Waits(throttled, max(0.0, self.wait_s - throttled))
        if self.pressure_s is not None:
            # wall time ≤ the threads' wait, and the throttled wall time ≤ the throttled
            # time, so what PSI holds beyond the throttled time is at most the contention
            return Waits(throttled, max(0.0, self.pressure_s - throttled), from_pressure=True)
        return None

    def demand_millicores(self) -> dict[str, int] | None:
        """Per-window demand from the agent's histogram: median, p99 and the largest window
        (to the bucket it fell in); None without the histogram."""
        if self.kind != "period":
            return None
        bounds, counts = self._histogram()
        p50, p99 = quantile(bounds, counts, 0.5), quantile(bounds, counts, 0.99)
        return {
            "p50_millicores": round((p50 or 0.0) * 1000),
            "p99_millicores": round((p99 or 0.0) * 1000),
            "max_millicores": round(highest(bounds, counts) * 1000),
        }

    def period_evidence(self, period_us: int = DEFAULT_PERIOD_US) -> PeriodEvidence:
        """Period-level evidence rebuilt from the agent's histogram, with the order the
        backlog series keep where the agent exports them. Like the histogram's windows, the
        backlog's are read as CFS periods (a level's quota is level × period). The usage
        counter per active period rides along (``usage_cores``): what it certainly used,
        whatever the windows read, below which a refinement never goes."""
        evidence = evidence_from_histogram(*self._histogram(), period_us=period_us)
        backlog = None
        if self.backlog and self.active_windows is not None:
            backlog = Backlog(period_us, self.active_windows, dict(self.backlog))
        usage = self.counters(0.0, period_us).usage_cores if self.periods >= 1 else None
        return replace(evidence, observed_throttle_ratio=self.throttle_ratio(), waits=self.waits(),
                       pod_throttled_s=self.pod_throttled_s, backlog=backlog,
                       usage_cores=usage)  # fmt: skip

    def _histogram(self) -> tuple[list[float], list[float]]:
        """Bucket bounds in order, and their cumulative counts."""
        bounds = sorted(self.buckets)
        return bounds, [self.buckets[b] for b in bounds]


class Slot(NamedTuple):
    """Evidence over one span of time: increases over (start, end], settings at ``end``."""

    start: float
    """Unix time, seconds (millisecond precision)."""
    end: float
    evidence: dict[WorkloadKey, ContainerEvidence]


Points = tuple[dict[str, str], Sequence[int], Sequence[float]]
"""A series' labels, the steps (0, 1, …) of the evaluation at which it has a value, and
those values: one step for an instant query, ``steps`` for a range query."""
