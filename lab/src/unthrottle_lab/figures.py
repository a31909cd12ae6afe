"""The figures of one run, shared by the lab (measured) and the model (predicted).

Both print the same JSON shape, so the two can be compared run by run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def nearest_rank(values: Sequence[float], percent: float) -> float:
    """The nearest-rank percentile: the smallest value with ``percent`` % at or below it."""
    if not values:
        raise ValueError("no values to take a percentile of")
    if not 0 < percent <= 100:
        raise ValueError(f"percentile {percent} is outside (0, 100]")
    ordered = sorted(values)
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Latency:
    """Task latency percentiles in milliseconds (nearest rank)."""

    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, latencies_ms: Sequence[float]) -> Latency:
        """Percentiles of a list of latencies (ms)."""
        return cls(
            p50=nearest_rank(latencies_ms, 50),
            p95=nearest_rank(latencies_ms, 95),
            p99=nearest_rank(latencies_ms, 99),
            max=max(latencies_ms),
        )

    def to_json(self) -> dict[str, float]:
        """``{"p50", "p95", "p99", "max"}`` in ms, to the µs: the shape runs print."""
        return {"p50": round(self.p50, 3), "p95": round(self.p95, 3),
                "p99": round(self.p99, 3), "max": round(self.max, 3)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, float]) -> Latency:
        """Back from :meth:`to_json`'s shape."""
        return cls(p50=data["p50"], p95=data["p95"], p99=data["p99"], max=data["max"])


@dataclass(frozen=True, slots=True)
class CpuStatDelta:
    """The ``cpu.stat`` counters over a span, in the units the figures use."""

    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_us: int = 0
    nr_bursts: int = 0
    burst_us: int = 0
    usage_us: int = 0
    wait_us: int = 0
    """Time the threads waited for a CPU, summed over threads (schedstat run delay; the
    model's: throttled or behind other threads). It holds the throttled waits too."""

    @property
    def contention_us(self) -> int:
        """Waiting that was not the quota's: behind other threads on a busy machine."""
        return max(0, self.wait_us - self.throttled_us)

    @property
    def throttle_ratio(self) -> float:
        """Share of active periods that were throttled."""
        return self.nr_throttled / self.nr_periods if self.nr_periods else 0.0


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What one run of a scenario produced (or is predicted to produce)."""

    limit: dict[str, float]
    """The run's settings exactly as the scenario file gives them."""
    latency: Latency
    wall_ms: float
    stat: CpuStatDelta
    extra: dict[str, Any]
    """Context that is not a figure: the period phase, HZ, etc."""

    def to_json(self) -> dict[str, Any]:
        """The shape `lab run --json` and `simulate --json` both print."""
        return {
            "limit": self.limit,
            "latency_ms": self.latency.to_json(),
            "wall_ms": round(self.wall_ms, 3),
            "nr_periods": self.stat.nr_periods,
            "nr_throttled": self.stat.nr_throttled,
            "throttled_ms": round(self.stat.throttled_us / 1000, 3),
            "nr_bursts": self.stat.nr_bursts,
            "burst_ms": round(self.stat.burst_us / 1000, 3),
            "throttle_ratio": round(self.stat.throttle_ratio, 4),
            "usage_ms": round(self.stat.usage_us / 1000, 3),
            "wait_ms": round(self.stat.wait_us / 1000, 3),
            **self.extra,
        }

    @classmethod
    def from_json(cls, run: dict[str, Any]) -> RunFigures:
        """Back from :meth:`to_json`'s shape (a run `lab run --json` or `simulate --json`
        printed, a sidecar's in its ``extra``); what is not a figure goes back in ``extra``."""
        return cls(
            limit=dict(run["limit"]),
            latency=Latency.from_json(run["latency_ms"]),
            wall_ms=float(run["wall_ms"]),
            stat=CpuStatDelta(
                nr_periods=int(run["nr_periods"]),
                nr_throttled=int(run["nr_throttled"]),
                throttled_us=round(float(run["throttled_ms"]) * 1000),
                nr_bursts=int(run["nr_bursts"]),
                burst_us=round(float(run["burst_ms"]) * 1000),
                usage_us=round(float(run.get("usage_ms") or 0) * 1000),
                wait_us=round(float(run.get("wait_ms") or 0) * 1000),
            ),
            extra={k: v for k, v in run.items() if k not in _FIGURE_KEYS},
        )


_FIGURE_KEYS = frozenset({"limit", "latency_ms", "wall_ms", "nr_periods", "nr_throttled",
                          "throttled_ms", "nr_bursts", "burst_ms", "throttle_ratio", "usage_ms",
                          "wait_ms"})  # fmt: skip
"""The keys of :meth:`RunFigures.to_json` that are figures (the rest is ``extra``)."""
