"""The engine's inputs and output, as plain frozen data (integers inside: millicores, µs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from unthrottle.cfs.backlog import Backlog
from unthrottle.model.runtime import Runtime
from unthrottle.units import DEFAULT_PERIOD_US, MIN_QUOTA_US


class PolicyError(ValueError):
    """A policy that cannot be applied; ``field`` is the ThrottlePolicy spec field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class Strategy(StrEnum):
    """How throttling is fixed."""

    LIMIT_ONLY = "LimitOnly"
    """Only raise (or lower) the limit."""
    BURST_PREFERRED = "BurstPreferred"
    """The smallest limit that, with a burst of up to its quota, meets the target."""
    AUTO = "Auto"
    """Burst when the long-run average fits under the quota; otherwise a larger limit."""


@dataclass(frozen=True, slots=True)
class Policy:
    """What the user asks for (a ThrottlePolicy spec, in integers).

    Field names in errors are the spec's: ``targetThrottleRatio``, ``limits.min`` …
    """

    target_ratio: float = 0.05
    """Share of active periods allowed to throttle, in (0, 1). 0.05: seeds/004's rule of thumb."""
    headroom: float = 0.10
    """Added to the limit the evidence needs (0.10 = +10 %), for demand the window missed."""
    min_millicores: int = 100
    """Never recommend less; 100m keeps a quota of 10 ms at the default period."""
    max_millicores: int = 8000
    """Never recommend more."""
    max_step_up: float = 2.0
    """One recommendation raises a limit at most this many times (VPA-style damping)."""
    max_step_down: float = 0.8
    """One recommendation lowers a limit to no less than this share of it."""
    strategy: Strategy = Strategy.AUTO
    sync_processors: bool = True
    """Also recommend GOMAXPROCS (Go) or -XX:ActiveProcessorCount (JVM) to match the limit."""

    def __post_init__(self) -> None:
        try:  # a policy read from YAML or a CRD arrives as strings
            object.__setattr__(self, "strategy", Strategy(self.strategy))
        except ValueError:
            choices = ", ".join(s.value for s in Strategy)
            raise PolicyError("strategy", f"{self.strategy!r} is not one of {choices}") from None
        if not (0 < self.target_ratio < 1) or math.isnan(self.target_ratio):
            raise PolicyError("targetThrottleRatio", f"{self.target_ratio} is not in (0, 1)")
        if not 0 <= self.headroom <= 10:
            raise PolicyError("headroom", f"{self.headroom} is not in [0, 10]")
        if self.min_millicores < 1:
            raise PolicyError("limits.min", f"{self.min_millicores}m is not a positive limit")
        if self.max_millicores < self.min_millicores:
            raise PolicyError(
                "limits.max",
                f"{self.max_millicores}m is below limits.min ({self.min_millicores}m)",
            )
        if not self.max_step_up >= 1:
            raise PolicyError("limits.maxStepUp", f"{self.max_step_up} is below 1")
        if not 0 < self.max_step_down <= 1:
            raise PolicyError("limits.maxStepDown", f"{self.max_step_down} is not in (0, 1]")


@dataclass(frozen=True, slots=True)
class Current:
    """A container's settings today, and what runs in it."""

    limit_millicores: int | None
    request_millicores: int = 0
    period_us: int = DEFAULT_PERIOD_US
    burst_us: int = 0
    runtime: Runtime = Runtime.UNKNOWN
    go_at_least_1_25: bool | None = None
    """Go ≥ 1.25 sizes GOMAXPROCS from the CPU limit by itself (unless GOMAXPROCS is set)."""
    gomaxprocs_env: int | None = None
    """An explicit GOMAXPROCS in the container's environment."""


@dataclass(frozen=True, slots=True)
class Waits:
    """Where the container's threads waited for a CPU over the window, seconds of thread time.

    Measured as the threads' schedstat run delay (the node agent's
    ``unthrottle_cpu_wait_seconds_total``, the lab's ``wait_us``), which holds both:
    ``throttled_s`` is the part the quota withheld, ``contention_s`` the rest, behind
    other processes on a busy node. The demand already counts both.
    """

    throttled_s: float
    contention_s: float
    from_pressure: bool = False
    """Read from the kubelet's PSI (``container_pressure_cpu_waiting_seconds_total``,
    cgroup v2) where the agent is absent: wall time with at least one thread waiting, not
    thread time, so ``contention_s`` is then a lower bound (PSI less the throttled time)."""

    @property
    def mostly_contention(self) -> bool:
        """More of the waiting was behind other processes than on the quota."""
        return self.contention_s > self.throttled_s


@dataclass(frozen=True, slots=True)
class PeriodEvidence:
    """Per-period demand, in order: CPU µs wanted in each period (usage + throttled time).

    Observed usage under throttling is capped by the quota (censored); usage
    plus throttled time is what the container would have used (DESIGN.md §2).
    """

    demand_us: npt.NDArray[np.int64]
    period_us: int = DEFAULT_PERIOD_US
    observed_throttle_ratio: float | None = None
    """The ratio cpu.stat reported over the same window, when known."""
    stands_for: int | None = None
    """How many observed periods a scaled-down rebuild stands for (a histogram's week
    rebuilt as 50,000 windows); None when ``demand_us`` is every period observed."""
    waits: Waits | None = None
    """Where the threads waited, when it was measured (the demand then includes it)."""
    pod_throttled_s: float = 0.0
    """The container's share of its pod's own throttled time (the pod cgroup's quota) over
    the window, seconds: in ``observed_throttle_ratio`` already, and in the demand where the
    threads' wait was measured (the run delay holds it)."""
    usage_cores: float | None = None
    """The CPU it used over the window, cores, from the cumulative usage counter (the
    operator: cAdvisor's or the agent's, per active period; ``lab tune``: a run's usage over
    its wall time); None where not known. What it certainly used, whatever the windows
    read: a refinement never goes below it (:mod:`unthrottle.recommend.engine`)."""
    in_order: bool = True
    """``demand_us`` is in the order it happened (False: rebuilt from a histogram, whose
    windows were shuffled)."""
    backlog: Backlog | None = None
    """The order the histogram lost, where the agent exported it: how often the demand
    above a few levels, carried from window to window, passed a few thresholds
    (:mod:`unthrottle.cfs.backlog`). A burst is offered only where it bounds the ratio."""
    quota_demand_us: npt.NDArray[np.int64] | None = None
    """Per-period demand without the wait behind other processes, in the order of
    ``demand_us``: usage + the quotas' stall, what the quota hid (the lab measures it
    period by period). None where only the sum was kept (the agent's histogram): the
    engine then takes ``waits.contention_s`` out of every window in proportion."""

    @property
    def periods(self) -> int:
        """How many periods of evidence there are."""
        return int(self.demand_us.size)

    @property
    def observed_periods(self) -> int:
        """How many periods were observed: what confidence is measured in."""
        return self.periods if self.stands_for is None else self.stands_for

    def describe(self) -> str:
        """``12345 periods``, or ``6048000 periods, rebuilt as 50000``."""
        if self.observed_periods == self.periods:
            return f"{self.periods} periods"
        return f"{self.observed_periods} periods, rebuilt as {self.periods}"


@dataclass(frozen=True, slots=True)
class CounterEvidence:
    """Only cumulative counters over a window (what cAdvisor gives): the coarse fallback."""

    window_s: float
    usage_cores: float
    """Average CPU used over the window, in cores."""
    nr_periods: int
    nr_throttled: int
    throttled_s: float = 0.0
    waits: Waits | None = None
    """Where the threads waited, from the node agent (or, a lower bound, the kubelet's PSI);
    None from cAdvisor's counters alone, which do not show the time a thread waited behind
    other processes."""
    pod_throttled_s: float = 0.0
    """Of ``throttled_s`` (and of ``nr_throttled``'s time), the container's share of its
    pod's own throttling: its own counters do not show it."""
    burst_periods: float | None = None
    """Periods in which it ran on its burst (cAdvisor's ``container_cpu_cfs_burst_periods_total``
    or the agent's); None where not exported. 0 with a burst set: the burst was not needed."""

    @property
    def throttle_ratio(self) -> float:
        """Throttled periods over periods."""
        return self.nr_throttled / self.nr_periods if self.nr_periods else 0.0


Evidence = PeriodEvidence | CounterEvidence


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What to set for one container, and why."""

    limit_millicores: int | None
    burst_us: int
    period_us: int
    gomaxprocs: int | None
    """The GOMAXPROCS to set; None: leave it as it is (or unset, see reasons)."""
    jvm_processors: int | None
    """The -XX:ActiveProcessorCount to set; None when not a JVM or sync is off."""
    expected_throttle_ratio: float | None
    """The model's ratio under the recommendation, on the evidence (None: counters only)."""
    current_throttle_ratio: float | None
    confidence: float
    """0–1: how much evidence, how long a window, how fine."""
    reasons: list[str] = field(default_factory=list)
    uncapped_limit_millicores: int | None = None
    """What the evidence asks for before ``limits.min``/``max`` and the step limits (VPA's
    "uncapped target"): a reviewer sees how far the caps held the recommendation back."""
    lower_limit_millicores: int | None = None
    """Set when the evidence was throttled past the target: the limit is then an upper
    bound (usage + throttled time overstates demand), and the smallest limit that meets
    the target lies in [``lower_limit_millicores``, ``limit_millicores``], the bottom always
    below the top. None: a point estimate (the evidence shows demand itself)."""
    expected_throttle_ratio_range: tuple[float, float] | None = None
    """The expected ratio as a range over the demand (docs/recommend.md, "Busy nodes"):
    from what the quota hid (usage + throttled time: the node stays as busy) to what the
    threads wanted under contention (usage + wait: the node goes quiet). Both ends equal
    where the threads waited behind no other process; None: counters only.
    ``expected_throttle_ratio`` is the top, the end the limit is sized to."""

    @property
    def is_range(self) -> bool:
        """True when the limit is the top of a range (made from throttled data)."""
        return self.lower_limit_millicores is not None  # set only below the limit

    @property
    def quota_us(self) -> int | None:
        """The quota the recommended limit gives at the container's period."""
        if self.limit_millicores is None:
            return None
        return self.limit_millicores * self.period_us // 1000

    def to_json(self) -> dict[str, object]:
        """The fields every output carries (``lab tune --json``, ``recommend --format json``);
        ``lower_limit_millicores`` only where the limit is the top of a range;
        ``expected_throttle_ratio_range`` as ``[lo, hi]`` (null: counters only)."""
        out: dict[str, object] = {
            "limit_millicores": self.limit_millicores,
            "burst_us": self.burst_us,
            "gomaxprocs": self.gomaxprocs,
            "jvm_processors": self.jvm_processors,
            "expected_throttle_ratio": self.expected_throttle_ratio,
            "expected_throttle_ratio_range": None
            if self.expected_throttle_ratio_range is None
            else list(self.expected_throttle_ratio_range),
            "confidence": self.confidence,
            "reasons": list(self.reasons),
            "uncapped_limit_millicores": self.uncapped_limit_millicores,
        }
        if self.is_range:
            out["lower_limit_millicores"] = self.lower_limit_millicores
        return out

    @property
    def confidence_label(self) -> str:
        """low, medium or high."""
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.25 else "low"


def min_millicores_for_period(period_us: int) -> int:
    """The smallest limit whose quota is the kernel's 1 ms minimum at this period."""
    return -(-MIN_QUOTA_US * 1000 // period_us)
