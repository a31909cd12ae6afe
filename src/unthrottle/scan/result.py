"""What a scan finds: per Deployment and container, today's settings, the evidence, the
recommendation; and the problems it met, as data (the scan neither prints nor exits)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from unthrottle.evidence.plots import ContainerSeries
from unthrottle.model.owners import DEPLOYMENT, kind_and_name
from unthrottle.recommend import Recommendation, Runtime
from unthrottle.units import DEFAULT_PERIOD_US


class ProblemKind(StrEnum):
    """What can be wrong with a scan as a whole."""

    NO_DEPLOYMENTS = "NoDeployments"
    """Nothing selected: no Deployment in the namespaces matches."""
    NO_COUNTERS = "NoCounters"
    """Deployments, but no CPU counters for any of them: nothing is scraped."""
    COUNTERS_ONLY = "CountersOnly"
    """No agent series: recommendations come from coarse counters."""
    RECORDED_SERIES = "RecordedSeries"
    """The recording rules' series were read (a note, not a fault)."""
    MIXED_PERIODS = "MixedPeriods"
    """A Deployment's pods run on nodes whose CFS periods differ: sized at the largest."""


FATAL = frozenset({ProblemKind.NO_DEPLOYMENTS, ProblemKind.NO_COUNTERS})
"""Problems after which there is nothing to recommend."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem, with a message for people."""

    kind: ProblemKind
    message: str


@dataclass(frozen=True, slots=True)
class ContainerResult:
    """One container of a Deployment: today, the evidence, and what to set."""

    name: str
    limit_millicores: int | None
    request_millicores: int
    burst_us: int
    gomaxprocs_env: int | None
    runtime: Runtime
    evidence: str
    """``period`` (the agent's 100 ms windows), ``counters`` (cAdvisor only) or ``none``."""
    pods: int
    throttle_ratio: float | None
    demand: dict[str, int] | None
    """Per-window demand: ``p50_millicores``, ``p99_millicores``, ``max_millicores``."""
    recommendation: Recommendation | None
    managed: bool = True
    """False for a container the policy's ``containers`` leaves out (shown, never changed)."""
    histogram: tuple[tuple[float, float], ...] = ()
    """The agent's per-window demand histogram over the window: (upper bound in cores,
    cumulative windows), bounds ascending, ``inf`` last; empty without the agent's series."""
    period_us: int = DEFAULT_PERIOD_US
    """The CFS period it was assessed at, µs: the node agent's where it reports one, else
    the request's (``--cfs-period``); the recommendation's reasons say which."""
    series: ContainerSeries | None = None
    """Its counters step by step over the window, for the report's plots (read only for
    the containers plotted: :func:`unthrottle.scan.series.with_series`)."""
    burst_used: tuple[float, float] | None = None
    """How much of its burst it used over the window: (periods that ran above the quota,
    CPU seconds above it), from cAdvisor's ``container_cpu_cfs_burst_{periods,seconds}_total``
    or the agent's copies; None where neither is exported. (0, 0) with a burst set: a burst
    never used, which was not needed."""

    def harm(self, target: float) -> float:
        """Throttling × how far over the target: the order people should look in."""
        ratio = self.throttle_ratio or 0.0
        return ratio * max(0.0, ratio - target)

    def up_to_date(self) -> bool:
        """Does the recommendation leave the limit and burst as they are?"""
        rec = self.recommendation
        return rec is not None and (rec.limit_millicores, rec.burst_us) == (
            self.limit_millicores,
            self.burst_us,
        )

    def to_json(self) -> dict[str, Any]:
        """The container object of ``recommend --format json`` (fields may be added, never
        removed). ``period_us`` is there when it is not the default 100 ms, as the report
        writes its fields."""
        out: dict[str, Any] = {
            "name": self.name,
            "current": {
                "limit_millicores": self.limit_millicores,
                "request_millicores": self.request_millicores,
                "burst_us": self.burst_us,
                "gomaxprocs": self.gomaxprocs_env,
            },
            "throttle_ratio": self.throttle_ratio,
            "demand": self.demand,
            "evidence": self.evidence,
            "pods": self.pods,
            "recommendation": None
            if self.recommendation is None
            else self.recommendation.to_json(),
            "histogram": [
                {"le": "+Inf" if math.isinf(bound) else bound, "windows": round(count)}
                for bound, count in self.histogram
            ],
        }
        if self.period_us != DEFAULT_PERIOD_US:
            out["period_us"] = self.period_us
        if self.burst_used is not None:
            periods, seconds = self.burst_used
            out["burst_used"] = {"periods": round(periods), "seconds": round(seconds, 3)}
        if self.series is not None:
            out.update(series_json(self.series))
        return out


def series_json(series: ContainerSeries) -> dict[str, Any]:
    """The plotted series as the report's JSON carries them: the throttle ratio per step
    (steps with periods), CPU used per pod (mean and busiest), cores, per step."""
    return {
        "series_step_s": series.step_s,
        "throttle_series": [{"t": round(t), "ratio": round(r, 5)} for t, r in series.ratios()],
        "usage_series": [
            {"t": round(t), "cores": round(mean, 4), "peak": round(peak, 4)}
            for t, mean, peak in zip(series.times, series.usage_cores, series.peak_cores,
                                     strict=True)
        ],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkloadResult:
    """One workload: a Deployment, a StatefulSet or a DaemonSet."""

    namespace: str
    deployment: str
    """Its reference (:func:`~unthrottle.model.owners.ref`): a Deployment's name, else
    ``statefulset/<name>`` or ``daemonset/<name>``."""
    containers: tuple[ContainerResult, ...]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    applied: dict[str, Any] | None = None
    """What Apply changed and its verdict, measured (:func:`unthrottle.scan.series.with_series`);
    None: not read, or no change recorded."""

    @property
    def kind(self) -> str:
        """``Deployment``, ``StatefulSet`` or ``DaemonSet``."""
        return kind_and_name(self.deployment)[0]

    @property
    def name(self) -> str:
        """Its name (without its kind)."""
        return kind_and_name(self.deployment)[1]

    def identity(self) -> dict[str, str]:
        """``kind`` and ``name`` for the outputs, and ``deployment`` for a Deployment (the
        field readers of earlier versions know)."""
        out = {"kind": self.kind, "name": self.name}
        if self.kind == DEPLOYMENT:
            out["deployment"] = self.name
        return out

    def harm(self, target: float) -> float:
        """Its most harmed container's."""
        return max((c.harm(target) for c in self.containers), default=0.0)


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The scan's answer, most harmful Deployment first."""

    now: float
    window_s: int
    target: float
    workloads: tuple[WorkloadResult, ...]
    problems: tuple[Problem, ...] = ()

    @property
    def fatal(self) -> Problem | None:
        """The first problem after which there is nothing to recommend, if any."""
        return next((p for p in self.problems if p.kind in FATAL), None)

    def to_json(self, window: str) -> dict[str, Any]:
        """The JSON document of ``recommend --format json`` (``window`` as the user wrote it)."""
        return {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.now)),
            "window": window,
            "target": self.target,
            "workloads": [
                {
                    "namespace": w.namespace,
                    **w.identity(),
                    "containers": [c.to_json() for c in w.containers],
                    **({"applied": w.applied} if w.applied is not None else {}),
                }
                for w in self.workloads
            ],
        }
