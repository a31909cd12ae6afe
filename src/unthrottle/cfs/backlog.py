"""The backlog a CFS burst depends on: demand above a level, carried from window to window.

Under a quota ``q`` per window and a burst ``B`` (the token bucket of :mod:`.series`), let

    E_t = max(0, E_{t-1} + d_t - q),   E_0 = 0

(a Lindley recursion: the demand above the quota, carried over, less what quiet windows
give back). Window ``t`` is throttled under ``(q, B)`` exactly when ``E_t > B``. With
``x_t`` of :mod:`.series` (``x_t = min(x_{t-1}, B) + q - d_t``), ``U_t = B - x_t`` obeys
``U_t = max(U_{t-1}, 0) + d_t - q``, so ``max(U_t, 0)`` is ``E_t`` and ``x_t < 0`` is
``E_t > B``. The share of windows whose backlog at a level passed ``b`` is therefore the
throttle ratio under a limit at that level with any burst up to ``b``: the order of the
windows is in it, where a histogram of demand per window has none.

The node agent folds each container's windows into :class:`BacklogFold` at a few fixed
levels (:data:`LEVELS_MILLICORES`) and exports how many windows passed each of a few
thresholds (:data:`OVER_QUOTAS`, in quotas of the level); :class:`Backlog` reads them back
and bounds the ratio at any limit and burst (:meth:`Backlog.ratio_at_most`).

Between two levels the backlog is bounded by convexity: ``E_t`` is a maximum of functions
affine in the level (``max_s Σ (d_u - ℓ)`` over the windows since ``s``), so at
``M = λ·ℓ₁ + (1-λ)·ℓ₂`` it is at most ``λ·E_t(ℓ₁) + (1-λ)·E_t(ℓ₂)``, and a window above
``B`` there is above ``b₁`` at ``ℓ₁`` or above ``b₂`` at ``ℓ₂`` whenever
``λ·b₁ + (1-λ)·b₂ ≤ B``. Every bound given is an upper bound on the model's ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise

LEVELS_MILLICORES = (100, 250, 500, 1000, 2000, 4000, 8000)
"""Levels the backlog is kept at, millicores: a factor 2–2.5 apart over the limits a
policy allows by default (100m–8). Between two, the bound interpolates (convexity);
below the lowest, nothing is known; above the highest, the highest's bound holds."""
OVER_QUOTAS = (0.0, 0.25, 0.5, 1.0, 2.0)
"""Thresholds, in quotas of the level (``level × window``): a window is counted when its
backlog passed ``over × quota``. 0: throttled with no burst at all; 0.25–1: the bursts a
limit near the level may have (at most its quota); 2: for the interpolation between
levels a factor 2 apart."""


def drains_us(window_us: int) -> tuple[int, ...]:
    """Each level's quota per window, µs: what a window gives back to the backlog."""
    return tuple(level * window_us // 1000 for level in LEVELS_MILLICORES)


class BacklogFold:
    """One container's backlog at every level, window by window (the agent keeps one each).

    Integers throughout (µs). Backlog never rises with the level, so the levels still
    carrying some are a prefix: a window updates them and the first level it clears, no more.
    """

    __slots__ = ("_drains", "_edges", "above", "active", "backlog", "carrying", "window_us")

    def __init__(self, window_us: int) -> None:
        self.window_us = window_us
        """The windows' length, µs."""
        self._drains = drains_us(window_us)
        self._edges = tuple(tuple(round(over * d) for over in OVER_QUOTAS) for d in self._drains)
        self.backlog = [0] * len(LEVELS_MILLICORES)
        """Backlog at each level after the last window, µs."""
        self.carrying = 0
        """How many levels (a prefix) carry backlog."""
        self.above = [[0] * len(OVER_QUOTAS) for _ in LEVELS_MILLICORES]
        """Windows whose backlog passed each threshold, per level (cumulative)."""
        self.active = 0
        """Windows with demand (cumulative): the ratio's denominator."""

    def observe(self, demand_us: int) -> None:
        """Account one window that wanted ``demand_us`` (0: it did not run)."""
        if demand_us <= 0:
            self.idle(1)
            return
        self.active += 1
        backlog, drains = self.backlog, self._drains
        for k in range(len(drains)):
            e = backlog[k] + demand_us - drains[k]
            if e <= 0:
                for j in range(k, self.carrying):
                    backlog[j] = 0
                self.carrying = k
                return
            backlog[k] = e
            counts = self.above[k]
            for j, edge in enumerate(self._edges[k]):
                if e <= edge:
                    break
                counts[j] += 1
        self.carrying = len(drains)

    def idle(self, windows: int) -> None:
        """Account ``windows`` windows that did not run: each gives back a quota per level.

        They are not active, but a backlog still above a threshold in them counts: under
        that level the work deferred into them would run, and throttle, there."""
        if windows <= 0:
            return
        for k in range(self.carrying):
            e, drain = self.backlog[k], self._drains[k]
            counts = self.above[k]
            for j, edge in enumerate(self._edges[k]):
                if e <= edge:
                    break
                # the i-th quiet window holds e - i·drain: above the edge for i < (e - edge)/drain
                counts[j] += min(windows, -(-(e - edge) // drain) - 1)
            self.backlog[k] = max(0, e - windows * drain)
        while self.carrying and self.backlog[self.carrying - 1] == 0:
            self.carrying -= 1

    def snapshot(self) -> Backlog:
        """The counts so far, as the engine reads them."""
        window_us = self.window_us
        above = {(level, over): float(self.above[k][j])
                 for k, level in enumerate(LEVELS_MILLICORES)
                 for j, over in enumerate(OVER_QUOTAS)}  # fmt: skip
        return Backlog(window_us, float(self.active), above)


def fold(demand_us: object, window_us: int) -> Backlog:
    """The backlog counts of a whole sequence of windows (µs each), as the agent keeps them."""
    acc = BacklogFold(window_us)
    for d in demand_us:  # type: ignore[attr-defined]
        acc.observe(int(d))
    return acc.snapshot()


@dataclass(frozen=True, slots=True)
class Backlog:
    """How many windows passed each backlog threshold, over a span (counts may be
    fractional: Prometheus's ``increase`` extrapolates)."""

    window_us: int
    """The windows' length, µs (the agent's ``--period``)."""
    active: float
    """Windows with demand."""
    above: Mapping[tuple[int, float], float] = field(default_factory=dict)
    """(level in millicores, threshold in quotas of the level) → windows above it."""

    def _count(self, level: int, over: float) -> float | None:
        return self.above.get((level, over))

    def _quota_us(self, level: int) -> float:
        return level * self.window_us / 1000

    def ratio_at_most(self, millicores: int, burst_us: int) -> float | None:
        """An upper bound on the share of active windows throttled under a limit of
        ``millicores`` with a burst of ``burst_us`` (the model's, on these windows, in
        order); None where no level at or below the limit was counted."""
        if self.active <= 0:
            return 0.0
        levels = sorted({level for level, _ in self.above})
        best: float | None = None

        def take(count: float | None) -> None:
            nonlocal best
            if count is not None and (best is None or count < best):
                best = count

        for level in levels:  # one level at or below the limit, a threshold at or below B
            if level <= millicores:
                for over in OVER_QUOTAS:
                    if over * self._quota_us(level) <= burst_us:
                        take(self._count(level, over))
        for low, high in pairwise(levels):  # between two (convexity)
            if not low < millicores < high:
                continue
            share = (high - millicores) / (high - low)  # λ: the limit = λ·low + (1-λ)·high
            for o1 in OVER_QUOTAS:
                for o2 in OVER_QUOTAS:
                    reach = share * o1 * self._quota_us(low) + (1 - share) * o2 * self._quota_us(
                        high
                    )
                    c1, c2 = self._count(low, o1), self._count(high, o2)
                    if reach <= burst_us and c1 is not None and c2 is not None:
                        take(c1 + c2)
        return None if best is None else min(1.0, best / self.active)

    def __add__(self, other: Backlog) -> Backlog:
        keys = set(self.above) | set(other.above)
        above = {k: self.above.get(k, 0.0) + other.above.get(k, 0.0) for k in keys}
        return Backlog(self.window_us, self.active + other.active, above)
