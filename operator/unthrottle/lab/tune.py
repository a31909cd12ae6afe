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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unthrottle.cfs.figures import RunFigures
from unthrottle.cgroups import Layout
from unthrottle.lab.agentview import View, as_read
from unthrottle.lab.runner import LabOptions, run_run, run_sampled
from unthrottle.lab.sampling import PeriodSamples
from unthrottle.model.scenario import RunSpec, Scenario
from unthrottle.recommend import (
    Current,
    PeriodEvidence,
    Policy,
    Recommendation,
    Waits,
    recommend,
)
from unthrottle.recommend.baselines import baselines


@dataclass(frozen=True, slots=True)
class Tried:
    """Settings that were run on the kernel, and what came of them."""

    name: str
    limit_millicores: int
    burst_us: int
    after: RunFigures
    how: str = ""


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
            "baselines": [
                {
                    "name": b.name,
                    "limit_millicores": b.limit_millicores,
                    "burst_us": b.burst_us,
                    "how": b.how,
                    "after": b.after.to_json(),
                }
                for b in self.baselines
            ],
        }


def spec_for(
    limit_millicores: int,
    burst_us: int,
    period_us: int,
    other_threads: int = 0,
    *,
    pod_quota: bool = False,
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
    return spec.model_copy(update=update) if update else spec


def throttle_ratio(figures: RunFigures) -> float:
    """A run's throttle ratio as the target holds it: the container's, or its pod's where
    the pod has a quota and was throttled more often (its stalls are the container's)."""
    pod = figures.extra.get("pod") or {}
    return max(figures.stat.throttle_ratio, float(pod.get("throttle_ratio", 0.0)))


def evidence_of(samples: PeriodSamples, ratio: float) -> PeriodEvidence:
    """The engine's evidence from a run's period samples: the demand with the wait in it,
    and where the threads waited (on the quota, or behind other processes)."""
    waits = Waits(float(samples.throttled_us.sum()) / 1e6,
                  float(samples.contention_us.sum()) / 1e6)  # fmt: skip
    return PeriodEvidence(
        samples.demand_us, samples.period_us, observed_throttle_ratio=ratio, waits=waits
    )


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
    them (:mod:`unthrottle.lab.agentview`)."""
    say = on_step or (lambda _: None)
    options = options or LabOptions()
    workload = scenario.workload.to_workload()
    first = scenario.runs[0]
    say(f"measuring today's settings ({first.label()}), sampling every period")
    before, samples = run_sampled(workload, first, layout, options)
    current = current_of(first)
    evidence = as_read(evidence_of(samples, throttle_ratio(before)), view)
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
        evidence = as_read(evidence_of(after_samples, throttle_ratio(after)), view)
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
