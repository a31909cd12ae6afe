"""``lab tune``: prove a recommendation on the real kernel.

1. Run the scenario's first run (today's settings) in a real cgroup, sampling
   it every period: period-level evidence, and the cpu.stat counters.
2. Recommend from that evidence; compute the baselines from the same samples.
3. Run the workload again under each, in fresh cgroups, and measure.
4. Refine, as the operator's verify loop does. Evidence from a throttled run
   is censored, and usage + throttled time is an upper bound on demand (a
   stalled thread may have had less work left than its stall). Once our
   recommendation runs unthrottled, its samples show the demand itself, so
   recommend again from them and measure that too.

**A pod of two containers** (the first run has a ``sidecar``): both containers are sampled
every period, each on its own grid, and each container's evidence holds its share of the
pod's throttled time (:mod:`unthrottle_lab.sampling`: time by usage, the operator's rule).
Each container is recommended for from its own evidence, and every run of the tune puts
both answers in a pod whose quota is their sum (and whose burst is the sum of their
bursts), as a kubelet and the agent would; the target holds for each container's periods
and the pod's. The baselines are each container's own, run together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unthrottle.cgroups import Layout
from unthrottle.recommend import (
    Current,
    PeriodEvidence,
    Policy,
    Recommendation,
    Waits,
    recommend,
)
from unthrottle.recommend.baselines import baselines
from unthrottle_lab.agentview import View, as_read
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.runner import LabOptions, run_pod_sampled, run_run, run_sampled
from unthrottle_lab.sampling import PeriodSamples
from unthrottle_lab.scenario import RunSpec, Scenario, SidecarSpec
from unthrottle_lab.workload import Workload


@dataclass(frozen=True, slots=True)
class Tried:
    """Settings that were run on the kernel, and what came of them."""

    name: str
    limit_millicores: int
    burst_us: int
    after: RunFigures
    how: str = ""
    sidecar_limit_millicores: int | None = None
    """The sidecar's limit beside it (a two-container pod), None without one."""


@dataclass(frozen=True, slots=True)
class SidecarTune:
    """What the tune recommended for a pod's second container (its figures are each run's
    ``extra["sidecar"]``)."""

    recommendation: Recommendation
    refined: Recommendation | None = None
    """Its second recommendation, from the uncensored samples, when the tune refined."""

    def to_json(self) -> dict[str, Any]:
        """``{"recommendation", "refined"}``, each a recommendation's JSON (or null)."""
        return {
            "recommendation": self.recommendation.to_json(),
            "refined": None if self.refined is None else self.refined.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Refinement:
    """The second recommendation, from the uncensored samples of the first, and its run."""

    recommendation: Recommendation
    after: RunFigures


@dataclass(frozen=True, slots=True)
class TuneResult:
    """Before, our recommendation and what it did, and the baselines beside it."""

    scenario: str
    target: float
    before: RunFigures
    samples: PeriodSamples
    recommendation: Recommendation
    after: RunFigures
    baselines: list[Tried]
    refined: Refinement | None = None
    sidecar: SidecarTune | None = None
    """The sidecar's recommendations, for a two-container pod; None for one container."""

    @property
    def final(self) -> tuple[Recommendation, RunFigures]:
        """Our last word: the refined recommendation when there is one."""
        if self.refined is not None:
            return self.refined.recommendation, self.refined.after
        return self.recommendation, self.after

    def to_json(self) -> dict[str, Any]:
        """The shape issue 3 defines (RUN as in ``lab run --json``), plus ``refined``."""
        return {
            "scenario": self.scenario,
            "target": self.target,
            "before": self.before.to_json(),
            "recommendation": self.recommendation.to_json(),
            "after": self.after.to_json(),
            "refined": None
            if self.refined is None
            else {
                "recommendation": self.refined.recommendation.to_json(),
                "after": self.refined.after.to_json(),
            },
            "sidecar": None if self.sidecar is None else self.sidecar.to_json(),
            "baselines": [
                {
                    "name": b.name,
                    "limit_millicores": b.limit_millicores,
                    "burst_us": b.burst_us,
                    "how": b.how,
                    "after": b.after.to_json(),
                    **_sidecar_limit(b),
                }
                for b in self.baselines
            ],
        }


def _sidecar_limit(tried: Tried) -> dict[str, int]:
    if tried.sidecar_limit_millicores is None:
        return {}
    return {"sidecar_limit_millicores": tried.sidecar_limit_millicores}


def spec_for(
    limit_millicores: int,
    burst_us: int,
    period_us: int,
    other_threads: int = 0,
    *,
    pod_quota: bool = False,
    sidecar: SidecarSpec | None = None,
) -> RunSpec:
    """A lab run with these settings, beside the same other load as today's run, and in a
    pod with a quota of its own when today's run is (``pod_quota``: the pod's quota follows
    the limit, as a kubelet's is the sum of its containers')."""
    spec = RunSpec(cpus=limit_millicores / 1000, period_ms=period_us / 1000,
                   burst_ms=burst_us / 1000)  # fmt: skip
    # set only when asked for, so that a quiet run's settings read as before
    update: dict[str, object] = {"other_threads": other_threads} if other_threads else {}
    if pod_quota:
        update["pod_quota"] = True
    if sidecar is not None:
        update["sidecar"] = sidecar
    return spec.model_copy(update=update) if update else spec


def throttle_ratio(figures: RunFigures) -> float:
    """A run's throttle ratio as the target holds it: the container's, or its pod's where
    the pod has a quota and was throttled more often (its stalls are the container's)."""
    pod = figures.extra.get("pod") or {}
    return max(figures.stat.throttle_ratio, float(pod.get("throttle_ratio", 0.0)))


def sidecar_ratio(figures: RunFigures) -> float:
    """A two-container run's sidecar's throttle ratio as the target holds it: its own, or
    its pod's where that was throttled more often (as :func:`throttle_ratio`)."""
    pod = figures.extra.get("pod") or {}
    own = float(figures.extra["sidecar"]["throttle_ratio"])
    return max(own, float(pod.get("throttle_ratio", 0.0)))


def evidence_of(samples: PeriodSamples, ratio: float, usage: float | None = None) -> PeriodEvidence:
    """The engine's evidence from a run's period samples: the demand with the wait in it,
    where the threads waited (on the quota, or behind other processes), and ``usage``, the
    run's usage over its wall time from its counters (:func:`usage_cores`), which the engine
    never refines below."""
    waits = Waits(float(samples.throttled_us.sum()) / 1e6,
                  float(samples.contention_us.sum()) / 1e6)  # fmt: skip
    # quota_demand_us: the quota's end of the demand, period by period (recommend.contention)
    return PeriodEvidence(samples.demand_us, samples.period_us, observed_throttle_ratio=ratio,
                          waits=waits, usage_cores=usage,
                          quota_demand_us=samples.usage_us + samples.stalled_us)  # fmt: skip


def usage_cores(figures: RunFigures) -> float | None:
    """A run's CPU usage over its wall time, cores, from its counters (``usage_ms /
    wall_ms``); None for a run without a wall time."""
    return figures.stat.usage_us / (figures.wall_ms * 1000) if figures.wall_ms > 0 else None


def sidecar_usage_cores(figures: RunFigures) -> float | None:
    """The sidecar's usage over its wall time in a two-container run (:func:`usage_cores`)."""
    return usage_cores(RunFigures.from_json(figures.extra["sidecar"]))


def current_of(run: RunSpec) -> Current:
    """Today's settings as the engine takes them (request = 0: the lab has none)."""
    bandwidth = run.bandwidth()
    return Current(
        limit_millicores=bandwidth.millicores,
        period_us=bandwidth.period_us,
        burst_us=bandwidth.burst_us,
    )


def tune(
    scenario: Scenario,
    layout: Layout,
    policy: Policy,
    options: LabOptions | None = None,
    *,
    with_baselines: bool = True,
    on_step: Callable[[str], None] | None = None,
    view: View = View.SEQUENCE,
) -> TuneResult:
    """Measure, recommend, and re-measure under the recommendation and the baselines.

    ``view``: recommend from the samples in order, or from what the operator would read of
    them (:mod:`unthrottle_lab.agentview`)."""
    say = on_step or (lambda _: None)
    options = options or LabOptions()
    workload = scenario.workload.to_workload()
    first = scenario.runs[0]
    if first.sidecar is not None:
        return _tune_pod(scenario, workload, layout, policy, options,
                         with_baselines=with_baselines, say=say, view=view)  # fmt: skip
    say(f"measuring today's settings ({first.label()}), sampling every period")
    before, samples = run_sampled(workload, first, layout, options)
    current = current_of(first)
    evidence = as_read(evidence_of(samples, throttle_ratio(before), usage_cores(before)), view,
                       threads=samples.threads)  # fmt: skip
    others = first.other_threads
    pod = first.pod_quota
    rec = recommend(evidence, current, policy)
    if rec.limit_millicores is None:
        raise ValueError("the recommendation keeps no limit; there is nothing to re-run")
    say(f"re-running under the recommendation ({rec.limit_millicores}m, burst {rec.burst_us} µs)")
    spec = spec_for(rec.limit_millicores, rec.burst_us, current.period_us, others, pod_quota=pod)
    after, after_samples = run_sampled(workload, spec, layout, options)
    refined = None
    censored = throttle_ratio(before) > policy.target_ratio
    if censored and throttle_ratio(after) <= policy.target_ratio:
        evidence = as_read(evidence_of(after_samples, throttle_ratio(after), usage_cores(after)),
                           view, threads=after_samples.threads)  # fmt: skip
        now = Current(rec.limit_millicores, period_us=current.period_us, burst_us=rec.burst_us)
        second = recommend(evidence, now, policy)
        changed = (second.limit_millicores, second.burst_us) != (rec.limit_millicores, rec.burst_us)
        if second.limit_millicores is not None and changed:
            say(f"refining from unthrottled evidence ({second.limit_millicores}m)")
            spec = spec_for(second.limit_millicores, second.burst_us, current.period_us, others,
                            pod_quota=pod)  # fmt: skip
            refined = Refinement(second, run_run(workload, spec, layout, options))
    tried = []
    if with_baselines:
        for base in baselines(samples.usage_us, samples.period_us):
            say(f"re-running under the {base.name} baseline ({base.limit_millicores}m)")
            spec = spec_for(base.limit_millicores, 0, current.period_us, others, pod_quota=pod)
            figures = run_run(workload, spec, layout, options)
            tried.append(Tried(base.name, base.limit_millicores, 0, figures, base.how))
    return TuneResult(
        scenario=scenario.name,
        target=policy.target_ratio,
        before=before,
        samples=samples,
        recommendation=rec,
        after=after,
        baselines=tried,
        refined=refined,
    )


def _side(first: RunSpec, limit_millicores: int, burst_us: int) -> SidecarSpec:
    """Today's sidecar (its workload) with these settings."""
    assert first.sidecar is not None
    return SidecarSpec(workload=first.sidecar.workload, cpus=limit_millicores / 1000,
                       burst_ms=burst_us / 1000)  # fmt: skip


def _pair(first: RunSpec, own: Recommendation, side: Recommendation) -> RunSpec:
    """A two-container run with both answers: the pod's quota is their sum."""
    assert own.limit_millicores is not None and side.limit_millicores is not None
    period_us = first.bandwidth().period_us
    sidecar = _side(first, side.limit_millicores, side.burst_us)
    return spec_for(own.limit_millicores, own.burst_us, period_us, first.other_threads,
                    sidecar=sidecar)  # fmt: skip


def _recommend_both(
    before: RunFigures,
    samples: tuple[PeriodSamples, PeriodSamples],
    now: tuple[Current, Current],
    policy: Policy,
    view: View,
) -> tuple[Recommendation, Recommendation]:
    """Each container's recommendation from its own evidence (its share of the pod's
    throttled time in it), its ratio as the target holds it."""
    own_evidence = evidence_of(samples[0], throttle_ratio(before), usage_cores(before))
    own = recommend(as_read(own_evidence, view, threads=samples[0].threads), now[0], policy)
    side_evidence = as_read(
        evidence_of(samples[1], sidecar_ratio(before), sidecar_usage_cores(before)),
        view,
        threads=samples[1].threads,
    )
    side = recommend(side_evidence, now[1], policy)
    if own.limit_millicores is None or side.limit_millicores is None:
        raise ValueError("the recommendation keeps no limit; there is nothing to re-run")
    return own, side


def _meets(figures: RunFigures, target: float) -> bool:
    return max(throttle_ratio(figures), sidecar_ratio(figures)) <= target


def _tune_pod(
    scenario: Scenario,
    workload: Workload,
    layout: Layout,
    policy: Policy,
    options: LabOptions,
    *,
    with_baselines: bool,
    say: Callable[[str], None],
    view: View,
) -> TuneResult:
    """:func:`tune` for a two-container pod (module docstring)."""
    first = scenario.runs[0]
    side_bw = first.sidecar_bandwidth()
    assert side_bw is not None
    period_us = first.bandwidth().period_us
    say(f"measuring today's settings ({first.label()}), sampling both containers every period")
    before, own_samples, side_samples = run_pod_sampled(workload, first, layout, options)
    now = (current_of(first), Current(side_bw.millicores, period_us=period_us,
                                      burst_us=side_bw.burst_us))  # fmt: skip
    rec, side_rec = _recommend_both(before, (own_samples, side_samples), now, policy, view)
    say(f"re-running under the recommendation ({rec.limit_millicores}m and "
        f"{side_rec.limit_millicores}m, the pod their sum)")  # fmt: skip
    after, *after_samples = run_pod_sampled(workload, _pair(first, rec, side_rec), layout, options)
    refined, side_refined = None, None
    if not _meets(before, policy.target_ratio) and _meets(after, policy.target_ratio):
        now = (Current(rec.limit_millicores, period_us=period_us, burst_us=rec.burst_us),
               Current(side_rec.limit_millicores, period_us=period_us,
                       burst_us=side_rec.burst_us))  # fmt: skip
        second, side_second = _recommend_both(
            after, (after_samples[0], after_samples[1]), now, policy, view
        )
        answers = [(r.limit_millicores, r.burst_us) for r in (second, side_second)]
        if answers != [(r.limit_millicores, r.burst_us) for r in (rec, side_rec)]:
            say(f"refining from unthrottled evidence ({second.limit_millicores}m and "
                f"{side_second.limit_millicores}m)")  # fmt: skip
            spec = _pair(first, second, side_second)
            refined = Refinement(second, run_run(workload, spec, layout, options))
            side_refined = side_second
    tried = []
    if with_baselines:
        own_bases = baselines(own_samples.usage_us, own_samples.period_us)
        side_bases = baselines(side_samples.usage_us, side_samples.period_us)
        pairs = zip(own_bases, side_bases, strict=True)
        for base, side_base in pairs:
            say(f"re-running under the {base.name} baseline ({base.limit_millicores}m and "
                f"{side_base.limit_millicores}m)")  # fmt: skip
            spec = spec_for(base.limit_millicores, 0, period_us, first.other_threads,
                            sidecar=_side(first, side_base.limit_millicores, 0))  # fmt: skip
            figures = run_run(workload, spec, layout, options)
            tried.append(Tried(base.name, base.limit_millicores, 0, figures, base.how,
                               side_base.limit_millicores))  # fmt: skip
    return TuneResult(
        scenario=scenario.name,
        target=policy.target_ratio,
        before=before,
        samples=own_samples,
        recommendation=rec,
        after=after,
        baselines=tried,
        refined=refined,
        sidecar=SidecarTune(side_rec, side_refined),
    )
