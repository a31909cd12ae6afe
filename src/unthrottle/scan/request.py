"""What a scan is asked: one typed request, parsed once at the edge (CLI options or a policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from unthrottle.evidence.fetching import CONCURRENCY
from unthrottle.model.owners import DEPLOYMENT, KINDS
from unthrottle.model.policy import SpecError, ThrottlePolicySpec
from unthrottle.model.selector import Selector
from unthrottle.recommend import Policy, PolicyError, Strategy
from unthrottle.units import DEFAULT_PERIOD_US, MAX_PERIOD_US, MIN_PERIOD_US


def engine_policy(spec: ThrottlePolicySpec) -> Policy:
    """The engine's :class:`~unthrottle.recommend.Policy` for a ThrottlePolicy spec;
    ``burst.enabled: false`` is strategy LimitOnly.

    The engine checks its own invariants, and the model should have caught every one of
    them: a miss is a :class:`~unthrottle.model.policy.SpecError` naming the field."""
    try:
        return Policy(
            target_ratio=spec.target_throttle_ratio,
            headroom=spec.headroom,
            min_millicores=spec.min_millicores,
            max_millicores=spec.max_millicores,
            max_step_up=spec.limits.max_step_up,
            max_step_down=spec.limits.max_step_down,
            strategy=Strategy(spec.strategy) if spec.burst.enabled else Strategy.LIMIT_ONLY,
            sync_processors=spec.processors.enabled,
        )
    except PolicyError as error:  # pragma: no cover - a model/engine mismatch, kept for safety
        raise SpecError(error.field, str(error).removeprefix(f"{error.field}: ")) from None


class History(StrEnum):
    """Which series hold the window's history."""

    AUTO = "auto"
    """The recording rules' series when they reach back to the window's start, else raw."""
    RAW = "raw"
    RECORDED = "recorded"


@dataclass(frozen=True, slots=True)
class ScanRequest:
    """Everything a scan needs besides its sources. The clock is an input: a request with
    the same ``now`` over the same data gives the same result."""

    window_s: int
    """Seconds of history to read, ending at ``now``."""
    now: float
    """Unix time the window ends at."""
    policy: Policy = field(default_factory=Policy)
    namespaces: tuple[str, ...] = ()
    """Namespaces to cover; empty: every namespace."""
    selector: Selector = field(default_factory=Selector)
    """Which Deployments, by their labels; empty: all."""
    containers: frozenset[str] | None = None
    """Container names to manage; None: every container."""
    history: History = History.AUTO
    concurrency: int = CONCURRENCY
    """Prometheus queries in flight at once."""
    jobs: int | None = None
    """Processes computing recommendations; None: every usable CPU."""
    go_at_least_1_25: bool = False
    """Go ≥ 1.25 sizes GOMAXPROCS from the limit itself. Unknown from outside the image, so
    an older Go is assumed."""
    cfs_period_us: int = DEFAULT_PERIOD_US
    """The CFS period, µs, of containers the node agent reports none for (cAdvisor's
    counters carry no period): the kubelets' ``--cpu-cfs-quota-period``, 100 ms unless
    changed. Where the agent's series exist, each container's own period is used."""
    cfs_period_from: str = "the default"
    """Where :attr:`cfs_period_us` came from, as the reasons say it (``--cfs-period``)."""
    kinds: tuple[str, ...] = (DEPLOYMENT,)
    """The kinds of workload to cover (:data:`~unthrottle.model.owners.KINDS`)."""

    def __post_init__(self) -> None:
        if self.window_s < 1:
            raise ValueError(f"window: {self.window_s} s is not positive")
        if self.concurrency < 1:
            raise ValueError(f"concurrency: {self.concurrency} is below 1")
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs: {self.jobs} is below 1")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds: {', '.join(unknown) or 'none'} is not one of "
                             f"{', '.join(KINDS)}")  # fmt: skip
        if not MIN_PERIOD_US <= self.cfs_period_us <= MAX_PERIOD_US:
            raise ValueError(f"cfs_period: {self.cfs_period_us} µs is outside the kernel's "
                             "range of 1 ms to 1 s")  # fmt: skip
