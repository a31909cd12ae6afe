"""The estimators, each one small step over a draft recommendation.

Each takes a :class:`Draft` and returns a new one, adding a reason when it
changed something. :mod:`unthrottle.recommend.engine` chains them, VPA-style.
All are monotone in demand: more demand never gives a smaller limit
(property-tested), because each step is a non-decreasing function of the step
before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from unthrottle.cfs.series import simulate_series
from unthrottle.model.runtime import Runtime
from unthrottle.recommend.types import (
    CounterEvidence,
    Current,
    PeriodEvidence,
    Policy,
    min_millicores_for_period,
)
from unthrottle.units import Bandwidth, quota_of

ROUND_TO_MILLICORES = 10
"""Limits are rounded up to 10m: finer steps are noise next to a period's demand."""
ROUND_BURST_TO_US = 1000
"""Bursts are rounded up to whole milliseconds (never past the quota)."""


@dataclass(frozen=True, slots=True)
class Draft:
    """A recommendation being built: limit (millicores), burst (µs), and why."""

    limit: int | None
    burst_us: int = 0
    reasons: tuple[str, ...] = ()

    def but(self, *, limit: int | None = None, burst_us: int | None = None,
            reason: str | None = None) -> Draft:  # fmt: skip
        """A copy with some fields changed and a reason appended."""
        return replace(
            self,
            limit=self.limit if limit is None else limit,
            burst_us=self.burst_us if burst_us is None else burst_us,
            reasons=self.reasons + ((reason,) if reason else ()),
        )


def ratio_at(evidence: PeriodEvidence, millicores: int, burst_us: int) -> float:
    """The model's throttle ratio for the evidence under a limit and burst."""
    quota = max(quota_of(millicores, evidence.period_us), 1000)
    bandwidth = Bandwidth(quota, evidence.period_us, min(burst_us, quota))
    return simulate_series(evidence.demand_us, bandwidth).throttle_ratio


def _smallest(lo: int, hi: int, meets: object) -> int:
    """The smallest integer in [lo, hi] for which ``meets`` holds (it holds at hi, monotone)."""
    assert callable(meets)
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def worst_order(evidence: PeriodEvidence) -> PeriodEvidence:
    """The windows in the order worst for a burst: all in one run, the largest first.

    A burst is a token bucket: it refills in windows below the quota and drains in those
    above. Put together, the peaks drain it once and it never refills between them, and
    the work they defer runs into the next largest windows; a window's backlog (the
    Lindley recursion of :mod:`unthrottle.cfs.backlog`) is then the most any order can
    give it, so no order throttles more windows at any limit and burst (property-tested
    in ``tests/unit/test_backlog.py``). For evidence rebuilt from a histogram alone, whose
    order was lost (docs/recommend.md, "Peaks in runs")."""
    cached = _WORST[0] if _WORST else None
    if cached is not None and cached[0] is evidence.demand_us:
        return cached[1]
    ordered = replace(evidence, demand_us=np.sort(evidence.demand_us)[::-1].copy())
    _WORST[:] = [(evidence.demand_us, ordered)]
    return ordered


_WORST: list[tuple[object, PeriodEvidence]] = []
"""The last :func:`worst_order` (the array it was made from, held so that its identity
stays its own): a binary search asks for it at every step, and sorting 50,000 windows
costs as much as a simulation."""


def order_gated(evidence: PeriodEvidence) -> bool:
    """Must a burst pass :func:`burst_holds`'s gate? Not for windows in the order they
    happened (the simulation has it); yes where the order was rebuilt."""
    return evidence.backlog is not None or not evidence.in_order


def burst_holds(evidence: PeriodEvidence, millicores: int, burst_us: int, target: float) -> bool:
    """Does the order of the windows let this burst absorb the peaks at this limit?

    Where the agent exported the order (its backlog series), the backlog's bound on the
    ratio (:meth:`~unthrottle.cfs.backlog.Backlog.ratio_at_most`) must meet the target:
    peaks that come one after another drain the bucket, and the shuffled sequence would
    refill it between them. Where the order was lost (a histogram alone: an older agent,
    or history from before it), the ratio in the order worst for the burst
    (:func:`worst_order`) must meet it. True for windows in the order they happened
    (the lab's samples): the simulation has the order already.
    """
    if evidence.backlog is not None:
        bound = evidence.backlog.ratio_at_most(millicores, burst_us)
        return bound is not None and bound <= target
    if evidence.in_order:
        return True
    return ratio_at(worst_order(evidence), millicores, burst_us) <= target


def limit_for_target(evidence: PeriodEvidence, target: float, *, with_burst: bool) -> Draft:
    """The smallest limit whose simulated throttle ratio meets the target.

    The ratio never rises with the limit (property-tested in ``cfs``), so a
    binary search finds the smallest. ``with_burst``: each candidate limit may
    use a burst as large as its quota (the kernel's maximum), where the backlog
    says that burst absorbs the peaks (:func:`burst_holds`, also monotone); else it
    must meet the target without one.
    """
    period = evidence.period_us
    floor = min_millicores_for_period(period)
    peak = int(evidence.demand_us.max()) if evidence.periods else 0
    # At a quota covering the busiest period nothing is ever throttled.
    ceiling = max(floor, -(-peak * 1000 // period))

    def meets(millicores: int, *, gated: bool = True) -> bool:
        if not with_burst:
            return ratio_at(evidence, millicores, 0) <= target
        quota = quota_of(millicores, period)
        if ratio_at(evidence, millicores, quota) > target:
            return False
        if not gated or burst_holds(evidence, millicores, quota, target):
            return True
        return ratio_at(evidence, millicores, 0) <= target

    limit = _smallest(floor, ceiling, meets)
    how = "with a burst of up to its quota" if with_burst else "without burst"
    draft = Draft(limit).but(
        reason=f"period-level evidence ({evidence.describe()}): {limit}m is the smallest "
        f"limit {how} whose simulated throttle ratio meets the target {target:g}"
    )
    if with_burst and order_gated(evidence):
        apart = _smallest(floor, limit, lambda m: meets(m, gated=False))
        if apart < limit:
            if evidence.backlog is None:
                worst = ratio_at(worst_order(evidence), apart, quota_of(apart, period))
                draft = draft.but(
                    reason=f"the order of the windows is unknown and a burst of its quota at "
                    f"{apart}m would not absorb the peaks if they came in one run (up to "
                    f"{worst:.0%} of the windows throttled), so the limit is {limit}m"
                )
                return draft
            bound = evidence.backlog.ratio_at_most(apart, quota_of(apart, period))
            seen = (f"up to {bound:.0%} of the windows would stay throttled" if bound is not None
                    else "it is below the lowest level the backlog is kept at")  # fmt: skip
            draft = draft.but(
                reason=f"the order of the windows (the agent's backlog series) does not show "
                f"that a burst of its quota absorbs the peaks at {apart}m ({seen}: peaks that "
                f"come one after another drain it), so the limit is {limit}m"
            )
    return draft


def average_floor(draft: Draft, evidence: PeriodEvidence, headroom: float) -> Draft:
    """Auto: the long-run average demand, plus headroom, must fit under the quota."""
    assert draft.limit is not None
    mean = float(evidence.demand_us.mean()) if evidence.periods else 0.0
    floor = math.ceil(mean * 1000 / evidence.period_us * (1 + headroom))
    if floor <= draft.limit:
        return draft
    return draft.but(
        limit=floor,
        reason=f"Auto: raised to {floor}m so the average demand plus {headroom:.0%} headroom "
        "fits under the quota (a burst only lends what quiet periods saved)",
    )


def with_headroom(draft: Draft, headroom: float) -> Draft:
    """Multiply the limit by 1 + headroom, for demand the window missed."""
    if draft.limit is None or headroom == 0:
        return draft
    raised = math.ceil(draft.limit * (1 + headroom))
    return draft.but(limit=raised, reason=f"+{headroom:.0%} headroom: {raised}m")


def burst_for_target(draft: Draft, evidence: PeriodEvidence, target: float) -> Draft:
    """The smallest burst (≤ quota) that brings the ratio to the target at this limit, and
    that the order of the windows says absorbs the peaks (:func:`burst_holds`)."""
    assert draft.limit is not None
    limit = draft.limit
    quota = quota_of(limit, evidence.period_us)
    if ratio_at(evidence, limit, 0) <= target:
        return draft.but(burst_us=0)

    def meets(b: int) -> bool:
        return ratio_at(evidence, limit, b) <= target and burst_holds(evidence, limit, b, target)

    if not meets(quota):
        why = "no burst up to the quota meets the target at this limit"
        if ratio_at(evidence, limit, quota) <= target:
            why += " (the peaks come in runs: the agent's backlog series)"
        return draft.but(burst_us=0, reason=why)
    burst = _smallest(0, quota, meets)
    burst = min(quota, -(-burst // ROUND_BURST_TO_US) * ROUND_BURST_TO_US)
    how = (", and the backlog says they stand apart" if evidence.backlog is not None
           else "" if evidence.in_order else ", even if they all came in one run")  # fmt: skip
    return draft.but(
        burst_us=burst,
        reason=f"burst {burst / 1000:g} ms absorbs the short peaks at {limit}m{how}",
    )


def counter_step(evidence: CounterEvidence, current: Current, policy: Policy) -> Draft:
    """Counters only: step up from today's limit in proportion to the throttling seen."""
    coarse = f"coarse evidence (counters over {evidence.window_s:g} s, no period-level demand)"
    if current.limit_millicores is None:
        return Draft(None, reasons=(f"{coarse}: no limit today, nothing is throttled",))
    ratio = evidence.throttle_ratio
    if ratio <= policy.target_ratio:
        return Draft(
            current.limit_millicores,
            current.burst_us,
            (
                f"{coarse}: throttle ratio {ratio:.3f} meets the target; counters cannot show "
                "how far down is safe, so the limit stays",
            ),
        )
    factor = 1 + ratio
    stepped = math.ceil(current.limit_millicores * factor)
    average = math.ceil(evidence.usage_cores * 1000 * (1 + policy.headroom))
    limit = max(stepped, average)
    return Draft(
        limit,
        current.burst_us,
        (
            f"{coarse}: throttle ratio {ratio:.3f} is over the target; limit × {factor:.2f} "
            f"(1 + ratio) = {stepped}m",
        ),
    )


def bounds(draft: Draft, policy: Policy, current: Current) -> Draft:
    """Keep the limit within [limits.min, limits.max], at or above the request and 1 ms quota."""
    if draft.limit is None:
        return draft
    low = max(policy.min_millicores, min_millicores_for_period(current.period_us))
    if draft.limit < low:
        draft = draft.but(limit=low, reason=f"raised to limits.min {low}m")
    if draft.limit is not None and draft.limit > policy.max_millicores:
        draft = draft.but(
            limit=policy.max_millicores,
            reason=f"capped at limits.max {policy.max_millicores}m: the target may not be met",
        )
    if draft.limit is not None and draft.limit < current.request_millicores:
        draft = draft.but(
            limit=current.request_millicores,
            reason=f"raised to the request {current.request_millicores}m (a limit below the "
            "request is refused by the API server)",
        )
    floor = min_millicores_for_period(current.period_us)
    if draft.limit is not None and draft.limit < floor:
        draft = draft.but(
            limit=floor,
            reason=f"raised to {floor}m: a smaller limit is a quota under the kernel's 1 ms",
        )
    return draft


def step_limit(draft: Draft, policy: Policy, current: Current) -> Draft:
    """Move at most ``maxStepUp`` times up or ``maxStepDown`` down from today's limit."""
    if draft.limit is None or current.limit_millicores is None:
        return draft
    up = math.floor(current.limit_millicores * policy.max_step_up)
    down = math.ceil(current.limit_millicores * policy.max_step_down)
    if draft.limit > up:
        return draft.but(
            limit=up, reason=f"step limited to ×{policy.max_step_up:g} of today's limit: {up}m"
        )
    if draft.limit < down:
        return draft.but(
            limit=down,
            reason=f"step limited to ×{policy.max_step_down:g} of today's limit: {down}m",
        )
    return draft


def rounded(draft: Draft) -> Draft:
    """Round the limit up to 10m."""
    if draft.limit is None or draft.limit % ROUND_TO_MILLICORES == 0:
        return draft
    return draft.but(limit=-(-draft.limit // ROUND_TO_MILLICORES) * ROUND_TO_MILLICORES)


def valid(draft: Draft, policy: Policy, current: Current) -> Draft:
    """The last word: whatever the steps did, the result is something the kernel and API accept.

    limit ≥ request, within [min, max] (the request wins over max), quota ≥ 1 ms,
    0 ≤ burst ≤ quota.
    """
    draft = bounds(draft, policy, current)
    if draft.limit is None:
        return draft.but(burst_us=0) if draft.burst_us else draft
    quota = quota_of(draft.limit, current.period_us)
    if draft.burst_us > quota:
        draft = draft.but(
            burst_us=quota, reason=f"burst clamped to the quota ({quota / 1000:g} ms)"
        )
    return draft


def processors(
    limit: int | None, current: Current, policy: Policy
) -> tuple[int | None, int | None, list[str]]:
    """GOMAXPROCS and JVM processor count that match a limit.

    Rounding: the ceiling of the limit in cores, at least 2 for Go. That is what
    Go ≥ 1.25 chooses by itself from the CPU limit, so an explicit value set for
    an older Go behaves like a newer one. (automaxprocs floors, minimum 1: with
    1.5 CPUs it leaves half a core unused; Go's own choice accepts the short
    throttle instead.) The JVM's container support also takes the ceiling of
    quota / period, minimum 1.
    """
    if not policy.sync_processors or limit is None:
        return None, None, []
    cores = -(-limit // 1000)
    if current.runtime is Runtime.GO:
        if current.go_at_least_1_25 and current.gomaxprocs_env is None:
            return (
                None,
                None,
                ["Go ≥ 1.25 sets GOMAXPROCS from the CPU limit itself: leave GOMAXPROCS unset"],
            )
        value = max(2, cores)
        why = f"GOMAXPROCS {value}: ceil of {limit}m, at least 2, as Go ≥ 1.25 would choose"
        if current.gomaxprocs_env is not None and current.gomaxprocs_env != value:
            why += f" (today {current.gomaxprocs_env}: keep the explicit value in step)"
        reasons = [why]
        if current.gomaxprocs_env is not None:
            reasons.append("GOMAXPROCS is set in the env, which turns off Go ≥ 1.25's own "
                           "sizing from the CPU limit (it follows an in-place resize too); "
                           "an env var changes only at a rollout")  # fmt: skip
        return value, None, reasons
    if current.runtime is Runtime.JVM:
        value = max(1, cores)
        return None, value, [f"-XX:ActiveProcessorCount={value}: ceil of {limit}m"]
    return None, None, []


def confidence(evidence: PeriodEvidence | CounterEvidence) -> float:
    """0–1: a day of period-level evidence is full confidence; counters count half."""
    if isinstance(evidence, PeriodEvidence):
        hours = evidence.observed_periods * evidence.period_us / 3.6e9
        return round(min(1.0, hours / 24), 4)
    return round(min(1.0, evidence.window_s / 86_400) * 0.5, 4)


def demand_from_samples(usage_us: np.ndarray, throttled_us: np.ndarray) -> np.ndarray:
    """Per-period demand from per-period usage and throttled time (censoring corrected)."""
    return np.asarray(usage_us, dtype=np.int64) + np.asarray(throttled_us, dtype=np.int64)
