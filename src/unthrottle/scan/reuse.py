"""Run the engine again only for containers whose evidence or settings changed materially.

An operator folds five minutes into a day of evidence every cycle: the distribution
of a container's demand barely moves, and re-running the engine for every container
(5–40 ms each, docs/benchmarks.md §7) would cost a minute of CPU per cycle at
2,000 containers. A container's last recommendation is kept while its settings and
the policy are the same, its evidence kind is the same, its throttle ratio moved by
less than :attr:`ReuseSettings.ratio_drift` and its demand distribution by less
than :attr:`ReuseSettings.share_drift` (total variation distance between the
histogram's bucket shares then and now), and no share of windows above a backlog threshold
(the agent's backlog series: the order of the windows) moved by more than that. A slot that
ages out, a burst of new demand or a rollout moves one of these, and the engine runs again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.recommend import Current, Policy, Recommendation


@dataclass(frozen=True, slots=True)
class ReuseSettings:
    """When a recommendation is reused."""

    share_drift: float = 0.02
    """Largest total variation distance (0–1) of the demand distribution kept: 2 % of the
    windows moving to other buckets. One 5-minute increment of a stationary container
    moves it by well under 1 % on a 24 h window."""
    ratio_drift: float = 0.01
    """Largest change of the observed throttle ratio kept (absolute)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    current: Current
    policy: Policy
    kind: str
    ratio: float | None
    shares: dict[float, float]
    usage: float
    backlog: dict[tuple[int, float], float]
    recommendation: Recommendation | None


def _shares(item: ContainerEvidence) -> dict[float, float]:
    """Each bucket's share of the windows (from the cumulative histogram)."""
    bounds = sorted(item.buckets)
    total = item.buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return {}
    out, below = {}, 0.0
    for bound in bounds:
        count = item.buckets[bound]
        out[bound] = max(0.0, count - below) / total
        below = max(below, count)
    return out


def _backlog(item: ContainerEvidence) -> dict[tuple[int, float], float]:
    """The share of active windows above each backlog threshold (empty without them)."""
    if not item.active_windows:
        return {}
    return {key: count / item.active_windows for key, count in item.backlog.items()}


def _moved(a: dict[tuple[int, float], float], b: dict[tuple[int, float], float]) -> float:
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys()), default=0.0)


def _distance(a: dict[float, float], b: dict[float, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())


@dataclass
class EngineCache:
    """The last recommendation per container, and what it was made from."""

    settings: ReuseSettings = field(default_factory=ReuseSettings)
    entries: dict[WorkloadKey, _Entry] = field(default_factory=dict)

    def reusable(
        self, key: WorkloadKey, item: ContainerEvidence, current: Current, policy: Policy
    ) -> tuple[bool, Recommendation | None]:
        """(True, the kept recommendation) when nothing changed materially."""
        entry = self.entries.get(key)
        if entry is None or (entry.current, entry.policy, entry.kind) != (
            current,
            policy,
            item.kind,
        ):
            return False, None
        ratio = item.throttle_ratio()
        if (ratio is None) != (entry.ratio is None) or (
            ratio is not None
            and entry.ratio is not None
            and abs(ratio - entry.ratio) > self.settings.ratio_drift
        ):
            return False, None
        if item.kind == "period":
            if _distance(_shares(item), entry.shares) > self.settings.share_drift:
                return False, None
            if _moved(_backlog(item), entry.backlog) > self.settings.share_drift:
                return False, None
        elif item.kind == "counters":
            usage = item.usage_s / item.periods if item.periods else 0.0
            if abs(usage - entry.usage) > self.settings.share_drift * max(entry.usage, 1e-9):
                return False, None
        return True, entry.recommendation

    def keep(
        self,
        key: WorkloadKey,
        item: ContainerEvidence,
        current: Current,
        policy: Policy,
        recommendation: Recommendation | None,
    ) -> None:
        """Remember a fresh recommendation and its inputs."""
        usage = item.usage_s / item.periods if item.periods else 0.0
        self.entries[key] = _Entry(
            current,
            policy,
            item.kind,
            item.throttle_ratio(),
            _shares(item) if item.kind == "period" else {},
            usage,
            _backlog(item),
            recommendation,
        )

    def forget_except(self, keys: set[WorkloadKey]) -> None:
        """Drop containers that are no longer selected (memory stays bounded)."""
        for key in [k for k in self.entries if k not in keys]:
            del self.entries[key]
