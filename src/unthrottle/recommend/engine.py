"""The recommendation engine: the estimator chain, assembled in one place.

============================  =====================================================
step                          effect
============================  =====================================================
1. quantile for the target    smallest limit whose simulated ratio meets the target
                              (period-level), or a step up ∝ throttling (counters)
2. headroom                   × (1 + headroom), for demand the window missed
3. Auto: average floor        at least the long-run average × (1 + headroom)
4. burst sizing               smallest burst ≤ quota that meets the target
4b. refinement floor          met the target at today's limit: no lower than the
                              counters' usage × (1 + headroom), or today's limit
5. bounds                     [limits.min, limits.max], ≥ request, quota ≥ 1 ms
6. step limit                 within ×maxStepDown … ×maxStepUp of today's limit
7. rounding                   up to 10m
8. validity                   bounds again (they win over steps), burst ≤ quota
9. processors                 GOMAXPROCS / JVM count from the final limit
============================  =====================================================

Every step is non-decreasing in demand, so more demand never yields a smaller
limit. The result always satisfies the kernel's and the API server's rules.

Evidence throttled past the target is censored: usage is capped at the quota,
and usage + throttled time is an upper bound on demand (a stalled thread is
counted for the whole stall, on every run queue, whatever work it had left).
The limit made from it is then the top of a range. The bottom is the same
chain run on what certainly ran — each window's demand capped at today's
quota, which no window's usage exceeds below its throttling — so, the chain
being monotone, the limit the true demand asks for lies between the two. Where
today's limit itself was measured throttled with no more burst than the
recommendation allows (``LimitOnly``, counters), the bottom is also above
today's limit. The reason says the range, and that the recommendation is
refined from the unthrottled evidence once applied (docs/recommend.md).

On a shared node (the threads waited behind other processes) the demand is a range too
(:mod:`unthrottle.recommend.contention`): the limit is sized to usage + wait, the safe
end; the chain on usage + throttled time is what it asks for beside the same neighbours
(the bottom, where it is below the one made from what certainly ran), and the expected
ratio is simulated on both (``expected_throttle_ratio_range``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from unthrottle.cfs.series import simulate_series
from unthrottle.recommend import contention
from unthrottle.recommend.estimators import (
    ROUND_TO_MILLICORES,
    Draft,
    average_floor,
    bounds,
    burst_for_target,
    confidence,
    counter_step,
    limit_for_target,
    order_gated,
    processors,
    rounded,
    step_limit,
    valid,
    with_headroom,
    worst_order,
)
from unthrottle.recommend.types import (
    CounterEvidence,
    Current,
    Evidence,
    PeriodEvidence,
    Policy,
    Recommendation,
    Strategy,
)
from unthrottle.units import Bandwidth, quota_of


def _current_ratio(evidence: Evidence, current: Current) -> float | None:
    if isinstance(evidence, CounterEvidence):
        return evidence.throttle_ratio
    if evidence.observed_throttle_ratio is not None:
        return evidence.observed_throttle_ratio
    if current.limit_millicores is None:
        return 0.0
    quota = max(quota_of(current.limit_millicores, evidence.period_us), 1000)
    bandwidth = Bandwidth(quota, evidence.period_us, min(current.burst_us, quota))
    return simulate_series(evidence.demand_us, bandwidth).throttle_ratio


def _expected_ratio(evidence: Evidence, draft: Draft, period_us: int) -> float | None:
    if isinstance(evidence, CounterEvidence) or draft.limit is None:
        return None if isinstance(evidence, CounterEvidence) else 0.0
    quota = quota_of(draft.limit, period_us)
    bandwidth = Bandwidth(quota, period_us, min(draft.burst_us, quota))
    ratio = simulate_series(evidence.demand_us, bandwidth).throttle_ratio
    if evidence.backlog is not None and bandwidth.burst_us:
        # the shuffled windows refill the bucket between peaks; the backlog knows better
        bound = evidence.backlog.ratio_at_most(draft.limit, bandwidth.burst_us)
        ratio = max(ratio, 1.0 if bound is None else bound)
    elif not evidence.in_order and bandwidth.burst_us:
        # the order was lost: the burst is held to the order worst for it
        worst = simulate_series(worst_order(evidence).demand_us, bandwidth).throttle_ratio
        ratio = max(ratio, worst)
    return round(ratio, 4)


def _period_chain(evidence: PeriodEvidence, policy: Policy) -> Draft:
    """Steps 1–4 on period-level evidence."""
    burst_allowed = policy.strategy is not Strategy.LIMIT_ONLY
    draft = limit_for_target(evidence, policy.target_ratio, with_burst=burst_allowed)
    draft = with_headroom(draft, policy.headroom)
    if policy.strategy is Strategy.AUTO:
        draft = average_floor(draft, evidence, policy.headroom)
    if burst_allowed:
        draft = burst_for_target(draft, evidence, policy.target_ratio)
    return draft


def _finished(draft: Draft, policy: Policy, current: Current) -> Draft:
    """Steps 5–8: bounds, step limit, rounding, validity (each monotone)."""
    draft = bounds(draft, policy, current)
    draft = step_limit(draft, policy, current)
    draft = rounded(draft)
    return valid(draft, policy, current)


def _what_ran(evidence: PeriodEvidence, today_millicores: int) -> PeriodEvidence:
    """What certainly ran: each window's demand capped at today's quota, which no window's
    usage exceeds below its throttling. The backlog is of the throttled demand too, so it is
    dropped: the peaks are taken to stand apart."""
    quota = quota_of(today_millicores, evidence.period_us)
    return replace(evidence, demand_us=np.minimum(evidence.demand_us, quota), backlog=None)


def _lower_limit(
    evidence: Evidence, current: Current, policy: Policy, ratio: float | None
) -> int | None:
    """The bottom of the range when the evidence was throttled past the target, else None."""
    today = current.limit_millicores
    if today is None or ratio is None or ratio <= policy.target_ratio or _empty(evidence):
        return None
    if isinstance(evidence, CounterEvidence):
        # the counters' step keeps today's burst: measured throttled at today's limit with it
        draft = Draft(today + ROUND_TO_MILLICORES, current.burst_us)
    else:
        draft = _period_chain(_what_ran(evidence, today), policy)
        if policy.strategy is Strategy.LIMIT_ONLY and draft.limit is not None:
            # no burst: today's limit, with today's burst or more, was measured throttled
            draft = draft.but(limit=max(draft.limit, today + ROUND_TO_MILLICORES))
    return _finished(draft, policy, current).limit


def _shared_lower(
    found: contention.Split | None,
    unwaited: Draft,
    evidence: Evidence,
    current: Current,
    policy: Policy,
    ratio: float | None,
) -> int | None:
    """The limit the quota's end of a shared node's demand asks for (the chain on usage +
    throttled time; for counters, the step without the wait's floor); None on a quiet node.
    Where today's limit was measured throttled past the target with no more burst than
    the recommendation allows (``LimitOnly``, counters), beside the same neighbours, it is
    also above today's limit."""
    today = current.limit_millicores
    if isinstance(evidence, CounterEvidence):
        if evidence.waits is None or evidence.waits.contention_s <= 0:
            return None
        return _finished(unwaited, policy, current).limit
    if found is None or not isinstance(evidence, PeriodEvidence):
        return None
    if found.scale is None:
        draft = _period_chain(found.quota_side, policy)
    else:  # the chain is homogeneous: the quota's end asks for the whole's × the share kept
        whole = _period_chain(evidence, policy)
        assert whole.limit is not None
        draft = Draft(math.ceil(whole.limit * found.scale), round(whole.burst_us * found.scale))
    throttled = today is not None and ratio is not None and ratio > policy.target_ratio
    if throttled and policy.strategy is Strategy.LIMIT_ONLY and draft.limit is not None:
        assert today is not None
        draft = draft.but(limit=max(draft.limit, today + ROUND_TO_MILLICORES))
    return _finished(draft, policy, current).limit


def _ran_ratio(evidence: Evidence, current: Current, draft: Draft) -> float | None:
    """The expected ratio at the draft on what certainly ran: each window's demand capped
    at today's quota (:func:`_lower_limit`'s). At a quota above today's nothing of it is
    throttled; below, what it must be."""
    if not isinstance(evidence, PeriodEvidence) or current.limit_millicores is None:
        return None
    return _expected_ratio(_what_ran(evidence, current.limit_millicores), draft,
                           evidence.period_us)  # fmt: skip


def _quota_end_ratio(found: contention.Split, draft: Draft, period_us: int) -> float | None:
    """The expected ratio at the draft on the quota's end of the demand. In proportion, the
    agent's backlog series are of the whole, not of it: the burst is held to the order
    worst for it instead (no order throttles more windows: :func:`worst_order`). With the
    whole's backlog, which bounds no limit below its levels, the demo's pool read 100 %
    at 1200m + 90 ms beside the same neighbours, where the kernel counted 0 %."""
    if found.scale is None:
        return _expected_ratio(found.quota_side, draft, period_us)
    unordered = replace(found.quota_side, backlog=None, in_order=False)
    return _expected_ratio(unordered, draft, period_us)


def _range_reason(lower: int, upper: int, today: int, ratio: float) -> str:
    return (
        f"made from throttled data ({ratio:.0%} of periods throttled at {today}m): usage + "
        f"throttled time overstates demand, so {upper}m is an upper bound; what the demand "
        f"itself asks for is between {lower}m and {upper}m. Once applied the container runs "
        "unthrottled, and the next recommendation, from that evidence, refines it"
    )


def recommend(evidence: Evidence, current: Current, policy: Policy) -> Recommendation:
    """A recommendation for one container: always valid, with its reasons."""
    if isinstance(evidence, PeriodEvidence):
        if evidence.period_us != current.period_us:
            raise ValueError(
                f"evidence is per {evidence.period_us} µs period but the container's period "
                f"is {current.period_us} µs"
            )
        draft = (
            _period_chain(evidence, policy)
            if evidence.periods
            else Draft(
                current.limit_millicores,
                current.burst_us,
                ("no period-level evidence in the window: nothing to size from",),
            )
        )
    else:
        draft = counter_step(evidence, current, policy)  # headroom is inside the step
        draft = _unused_burst(draft, evidence, current, policy)
    draft = _pod_quota(draft, evidence)
    draft = _order_unknown(draft, evidence)
    uncapped = rounded(draft).limit  # what the evidence asks for, before bounds and steps
    ratio = _current_ratio(evidence, current)
    waited = _waited(draft, evidence, current, policy, ratio)
    if (isinstance(evidence, PeriodEvidence) and order_gated(evidence)
            and waited.limit != draft.limit and waited.limit is not None
            and policy.strategy is not Strategy.LIMIT_ONLY):  # fmt: skip
        # the burst was sized at the limit before; the order's word holds at this one only
        waited = burst_for_target(waited, evidence, policy.target_ratio)
    unwaited = draft  # before the wait behind other processes was counted (counters)
    draft = _not_below_usage(waited, evidence, current, policy, ratio)
    draft = _finished(draft, policy, current)
    found = contention.split(evidence)
    lower = _lower_limit(evidence, current, policy, ratio)
    held = _held_for_contention(evidence, draft, current, policy, ratio)
    # kept on an oversubscribed node: not lowered for what the quota's end asks either
    shared = None if held else _shared_lower(found, unwaited, evidence, current, policy, ratio)
    top = draft.limit
    if top is None or (shared is not None and shared >= top):
        shared = None  # a step or bound held the top down to it
    if top is not None and lower is not None and lower < top:
        assert current.limit_millicores is not None and ratio is not None  # _lower_limit's
        draft = draft.but(reason=_range_reason(lower, top, current.limit_millicores, ratio))
    else:
        lower = None  # a point estimate (or a step or bound held the top down to the bottom)
    if shared is not None and found is None:  # counters: no windows, no expected ratios
        draft = draft.but(reason=f"on a shared node the demand is a range: beside the same "
                          f"neighbours it asks for about {shared}m (without the wait behind "
                          f"other processes), if the node goes quiet up to {top}m, the end "
                          "it is sized to")  # fmt: skip
    # the bottom: what certainly ran, or the quota's end of a shared node's demand, whichever
    # is less (the quota's end is usage + throttled time: an upper bound too, when censored)
    ran_bottom = lower is not None and (shared is None or lower <= shared)
    lower = min((x for x in (lower, shared) if x is not None), default=None)
    gomaxprocs, jvm, notes = processors(draft.limit, current, policy)
    draft, expected, span = _expectation(evidence, current, policy, draft, found, shared,
                                         ran_bottom=ran_bottom, held=held, ratio=ratio)  # fmt: skip
    return Recommendation(
        limit_millicores=draft.limit,
        burst_us=draft.burst_us,
        period_us=current.period_us,
        gomaxprocs=gomaxprocs,
        jvm_processors=jvm,
        expected_throttle_ratio=expected,
        expected_throttle_ratio_range=span,
        current_throttle_ratio=ratio,
        confidence=confidence(evidence) if not _empty(evidence) else 0.0,
        reasons=[*draft.reasons, *notes],
        uncapped_limit_millicores=uncapped,
        lower_limit_millicores=lower,
    )


def _expectation(
    evidence: Evidence,
    current: Current,
    policy: Policy,
    draft: Draft,
    found: contention.Split | None,
    shared: int | None,
    *,
    ran_bottom: bool,
    held: bool,
    ratio: float | None,
) -> tuple[Draft, float | None, tuple[float, float] | None]:
    """The expected ratio (the end the limit is sized to), its range over a shared node's
    demand, and the reasons they call for."""
    expected = simulated = _expected_ratio(evidence, draft, current.period_us)
    low = simulated if found is None else _quota_end_ratio(found, draft, current.period_us)
    from_ran = False
    if found is not None and ran_bottom and low is not None:
        # the bottom is what certainly ran (the quota's end is an upper bound too, when
        # censored): the expected ratio's low end is on it, as the limit's is
        ran_low = _ran_ratio(evidence, current, draft) or 0.0
        from_ran, low = ran_low < low, min(low, ran_low)
    if held:
        # nothing changes, and the demand that would throttle it (the wait behind others)
        # is not the quota's: today's measure is the expectation (the demo beside a hog
        # read "expected 100 %" at a limit the kernel throttled 0–0.4 % of periods); the
        # simulated one, with the wait, is what a quiet node would bring: the range's top
        expected = low = ratio
    span = contention.ratio_range(low, simulated if found is not None else expected)
    if found is not None and span is not None and draft.limit is not None:
        draft = draft.but(reason=contention.reason(
            found, limit=draft.limit, expected=span,
            lower_limit=shared, upper_limit=draft.limit, from_ran=from_ran))  # fmt: skip
    if span is not None and expected is not None and expected > policy.target_ratio >= span[0]:
        draft = draft.but(
            reason=f"the target {policy.target_ratio:g} is met beside the same neighbours "
            f"(expected {span[0]:.3f}) and not if the node goes quiet (expected "
            f"{span[1]:.3f}): a bound or a step above held it back"
        )
    elif expected is not None and expected > policy.target_ratio:
        draft = draft.but(
            reason=f"the target {policy.target_ratio:g} is not met under this recommendation "
            f"(expected {expected:.3f}): a bound, a step or an oversubscribed node above held "
            "it back"
        )
    return draft, expected, span


def _not_below_usage(
    draft: Draft, evidence: Evidence, current: Current, policy: Policy, ratio: float | None
) -> Draft:
    """Refining: the evidence met the target at today's limit, so its windows show the
    demand itself and the chain may step down from them. But windows can read less than
    the container used: their edges fall on the kernel's period grid, which no setting
    chooses (a ``lab tune`` on CI refined an answer that met, 2,140m, to 1,850m + 43 ms from
    windows averaging 1.68 cores or less, where that run's counters said about 1.93; the
    kernel throttled it). The usage counter over the window is what it certainly used: the limit
    stays at that plus headroom, as Auto's average floor would have it, or at today's,
    which met the target, whichever is less; the burst is sized again at that limit."""
    usage = evidence.usage_cores if isinstance(evidence, PeriodEvidence) else None
    today = current.limit_millicores
    if (usage is None or today is None or draft.limit is None or ratio is None
            or ratio > policy.target_ratio):  # fmt: skip
        return draft
    floor = min(today, math.ceil(usage * 1000 * (1 + policy.headroom)))
    if draft.limit >= floor:
        return draft
    kept = "today's limit, which met the target" if floor == today else (
        f"its usage plus {policy.headroom:.0%} headroom")  # fmt: skip
    draft = draft.but(
        limit=floor,
        reason=f"refined from evidence that met the target at {today}m: not below the "
        f"{usage * 1000:.0f}m its usage counter measured over the window ({draft.limit}m from "
        f"the windows, which read less), so {floor}m: {kept}",
    )
    if isinstance(evidence, PeriodEvidence) and policy.strategy is not Strategy.LIMIT_ONLY:
        draft = burst_for_target(draft, evidence, policy.target_ratio)
    return draft


def _unused_burst(
    draft: Draft, evidence: CounterEvidence, current: Current, policy: Policy
) -> Draft:
    """Counters: today's burst, never used over the window and throttling under the target,
    was not needed (cAdvisor's burst counters, docs/recommend.md): it is dropped. Only
    where the counters are exported (cAdvisor with #3795, or the agent's)."""
    unused = evidence.burst_periods is not None and evidence.burst_periods < 1
    if not (current.burst_us and draft.burst_us and unused and evidence.nr_periods):
        return draft
    if evidence.throttle_ratio > policy.target_ratio:
        return draft
    return draft.but(
        burst_us=0,
        reason=f"today's burst ({current.burst_us // 1000} ms) was never used in "
        f"{evidence.nr_periods} periods (container_cpu_cfs_burst_periods_total): it was not "
        "needed, so it is dropped",
    )


def _pod_quota(draft: Draft, evidence: Evidence) -> Draft:
    """Say where its pod's own quota throttled it (docs/recommend.md, "The pod's own quota").

    Its share of the pod cgroup's throttling is in the evidence already (the ratio, the
    throttled time; the agent's demand holds it through the wait): this names it, since
    the container's own counters, and a dashboard built on them, do not show it.
    """
    if evidence.pod_throttled_s < 0.05:
        return draft
    return draft.but(
        reason=f"its pod's own quota (the sum of its containers' limits) throttled it too: "
        f"{evidence.pod_throttled_s:.1f} s of the pod cgroup's throttled time is counted as "
        "its share (by usage), which its own counters do not show"
    )


ORDER_UNKNOWN = (
    "the order of the windows is unknown (the agent's histogram without its backlog series: "
    "an older agent, or history from before it): a burst is counted on only where it would "
    "absorb the peaks even if they all came in one run, the order worst for it"
)


def _order_unknown(draft: Draft, evidence: Evidence) -> Draft:
    """Say so where a burst was weighed on a rebuilt order (docs/recommend.md, "Peaks in
    runs"): the worst order was assumed for it. Where that order raised the limit instead,
    :func:`~unthrottle.recommend.estimators.limit_for_target`'s reason says so (one line
    per container: a report of a thousand Deployments must stay readable)."""
    if (isinstance(evidence, PeriodEvidence) and not evidence.in_order
            and evidence.backlog is None and draft.burst_us):  # fmt: skip
        return draft.but(reason=ORDER_UNKNOWN)
    return draft


HIDDEN_BY_CONTENTION = (
    "contention can hide demand: cAdvisor's counters do not show the time threads waited for "
    "a CPU behind other processes, so on a busy node this may be low (the unthrottle agent "
    "measures it)"
)


def _waited(
    draft: Draft, evidence: Evidence, current: Current, policy: Policy, ratio: float | None
) -> Draft:
    """What the waiting for a CPU says (docs/recommend.md, "Busy nodes").

    The demand counts the time threads waited behind other processes: contention hides
    demand (usage at the quota, never throttled), and a limit sized without it throttles
    whenever the thread does get a core. But where the container waited mostly behind
    other processes and its quota kept it under the target, the limit is not what slows
    it: a higher one would not give it the CPU. The node is oversubscribed; the limit is
    not raised for that wait, and the reason says so.
    """
    waits = evidence.waits
    if waits is None:
        if isinstance(evidence, CounterEvidence):
            return draft.but(reason=HIDDEN_BY_CONTENTION)
        return draft
    if waits.contention_s <= 0:
        return draft
    waited = (f"{waits.contention_s:.1f} s waiting for a CPU behind other processes, "
              f"{waits.throttled_s:.1f} s on its quota")  # fmt: skip
    if waits.from_pressure:
        waited = (f"{waited}, from the kubelet's PSI: wall time, a lower bound for several "
                  "threads")  # fmt: skip
    today = current.limit_millicores
    quota_fine = ratio is not None and ratio <= policy.target_ratio
    if not (waits.mostly_contention and quota_fine):
        draft = _with_wait(draft, evidence, current, policy)
        return draft.but(reason=f"the demand counts the time its threads waited ({waited}): "
                         "contention hid it")  # fmt: skip
    asked = rounded(draft).limit
    if today is not None and asked is not None and asked > today:
        return draft.but(
            limit=today,
            reason=f"the node is oversubscribed ({waited}; throttled in {ratio:.0%} of periods, "
            f"under the target): a higher limit would not give it the CPU, so the limit is not "
            f"raised for that wait ({asked}m with it)",
        )
    return draft.but(reason=f"the node is oversubscribed ({waited}): a higher limit would not "
                     "give it the CPU")  # fmt: skip


def _held_for_contention(
    evidence: Evidence, draft: Draft, current: Current, policy: Policy, ratio: float | None
) -> bool:
    """Today's settings kept on an oversubscribed node (:func:`_waited`): the threads waited
    mostly behind other processes and the quota kept them under the target."""
    waits = evidence.waits
    return (isinstance(evidence, PeriodEvidence) and waits is not None
            and waits.contention_s > 0 and waits.mostly_contention
            and ratio is not None and ratio <= policy.target_ratio
            and (draft.limit, draft.burst_us)
            == (current.limit_millicores, current.burst_us))  # fmt: skip


def _with_wait(draft: Draft, evidence: Evidence, current: Current, policy: Policy) -> Draft:
    """Counters: the limit at least the average demand with the wait behind other processes
    (usage + contention per active period, with headroom). Period-level evidence counts the
    wait in each window's demand already."""
    if not isinstance(evidence, CounterEvidence) or evidence.waits is None or draft.limit is None:
        return draft
    active_s = evidence.nr_periods * current.period_us / 1e6
    if active_s <= 0:
        return draft
    cores = evidence.usage_cores + evidence.waits.contention_s / active_s
    floor = math.ceil(cores * 1000 * (1 + policy.headroom))
    return draft.but(limit=floor) if floor > draft.limit else draft


def _empty(evidence: Evidence) -> bool:
    if isinstance(evidence, PeriodEvidence):
        return evidence.periods == 0
    return evidence.nr_periods == 0 and evidence.window_s == 0
