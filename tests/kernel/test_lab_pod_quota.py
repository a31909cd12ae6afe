"""Runs under a pod-level quota on the kernel (issue 28 §1): the pod's counters beside the
container's, the model's agreement, and ``lab tune`` meeting the target in a pod (root).

The batch of the demo (two parallel 60 ms tasks per round) at 1 CPU, once alone and once
in a one-container pod whose quota is the same 1 CPU (``scenarios/pod-quota-batch.yaml``),
with the workers pinned and the rest of the machine at idle priority, as the seed tests
measure. Bounds from bench/results/pod-quota.json (docs/model.md, "The pod level").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.lab_seeds import (
    MORE_REPEATS,
    disturbed,
)
from support.lab_tune import (
    MET,
    assert_small,
    judged,
)
from support.machine import KERNEL_LAYOUT
from support.paths import ROOT
from unthrottle.cfs.pod import stalled_us
from unthrottle_lab.agreement import agreement
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.runner import LabOptions, run_scenario
from unthrottle_lab.scenario import load_scenario

pytestmark = pytest.mark.kernel

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
POD_BATCH = ROOT / "scenarios" / "pod-quota-batch.yaml"
REPEATS = 2
POD_OPTIONS = LabOptions(isolate=True, pin=True)
"""As the seed tests measure: the workers pinned, the machine's other processes idle."""
STALL_LOW, STALL_HIGH = 0.45, 1.25
"""The stall the evidence counts in the pod, against the same container's throttled time
alone: 0.52-1.09x in bench/results/pod-stall.json, 0.90-1.07x in six runs of this test,
and a margin for the kernel's spread. The two levels' sum without the wait's cap read
1.31x and 1.35x in two of those six (both cgroups booked one stall)."""


def leftovers() -> set[str]:
    """Lab cgroups under the CPU hierarchy's root, pod cgroups among them."""
    assert KERNEL_LAYOUT is not None
    return {p.name for p in KERNEL_LAYOUT.cpu_root.glob("unthrottle-lab-*")}


@pytest.fixture(scope="module")
def measured() -> list[list[RunFigures]]:
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    before = leftovers()
    scenario = load_scenario(POD_BATCH)
    runs = [run_scenario(scenario, KERNEL_LAYOUT, POD_OPTIONS) for _ in range(REPEATS)]
    assert leftovers() <= before, "a run's container or pod cgroup was left behind"
    return runs


def test_the_pods_counters_are_measured_beside_the_containers(
    measured: list[list[RunFigures]],
) -> None:
    for free, alone, in_pod in measured:
        assert "pod" not in free.extra and "pod" not in alone.extra
        pod = in_pod.extra["pod"]
        # the pod's quota was in force: its period timer ran through the run
        assert pod["nr_periods"] >= in_pod.stat.nr_periods - 1
        assert 0 <= pod["nr_throttled"] <= pod["nr_periods"]


def test_the_pods_stall_is_what_the_containers_counters_miss(
    measured: list[list[RunFigures]],
) -> None:
    """The pod's throttled time is booked in the pod's counters, not the container's. Each
    level's booking is time the threads waited; the two together can pass the wait, since
    both cgroups book a stall when their quotas run out together (equal quotas, grids a few
    ms apart: 1.16× in bench/results/pod-stall.json, 1.33× once on CI over 12 periods), so
    the evidence caps the sum by the wait (cfs.pod.stalled_us) and never counts less than
    either level. What it counts is held to the same container's throttled time alone in
    the same repeat (:data:`STALL_LOW`, :data:`STALL_HIGH`): in bench/results/pod-stall.json
    the two levels' sum read 0.52-1.15x of it and the count 0.52-1.09x: a count without
    the wait's cap leaves the span where both levels booked one stall (1.31x and 1.35x in
    two of six runs of this test), and one without the pod's stall where the pod's quota
    ran out first for most of the run (the container's own counter read 0.08-0.94x).

    Where the pod's quota runs out first depends on where the kernel put its grid against
    the container's, which no setting chooses: over 18 runs (10 beside a hog) the pod was
    throttled 2-795 ms, in 1-12 of 12 periods, and once on CI both runs of this test 0 (the
    pod's grid 87 ms after the container's). So the scenario is measured again, at most
    MORE_REPEATS times, while no run has shown the pod's stall."""
    assert KERNEL_LAYOUT is not None
    repeats = list(measured)
    for _ in range(MORE_REPEATS):
        if any(in_pod.extra["pod"]["throttled_ms"] > 0 for _, _, in_pod in repeats):
            break
        print("measured again: the pod's quota never ran out first on the kernel's grids")
        repeats.append(run_scenario(load_scenario(POD_BATCH), KERNEL_LAYOUT, POD_OPTIONS))
    pods = [in_pod.extra["pod"]["throttled_ms"] for _, _, in_pod in repeats]
    assert max(pods) > 0, f"the pod's quota never ran out first in {len(pods)} runs"
    for _, alone, in_pod in repeats:
        wait, own = in_pod.stat.wait_us, in_pod.stat.throttled_us
        pod = round(in_pod.extra["pod"]["throttled_ms"] * 1000)
        assert own <= 1.02 * wait and pod <= 1.02 * wait, (own, pod, wait)
        counted = stalled_us(own, pod, wait)
        single = alone.stat.throttled_us
        print(f"counted {counted} µs (own {own}, pod {pod}, wait {wait}) against {single} "
              f"alone: {counted / single:.2f}x")  # fmt: skip
        assert STALL_LOW * single <= counted <= STALL_HIGH * single, (counted, own, pod, wait,
                                                                        single)  # fmt: skip


def test_the_model_agrees_with_every_run_of_the_pod_scenario(
    measured: list[list[RunFigures]],
) -> None:
    """By the rules of test_lab_seeds: measured again, at most MORE_REPEATS times, while a
    run disagrees only in measurements the host took REMEASURE_LOST_MS or more from (beside
    a hog the pod run read 0.83 and 0.39 of its periods throttled against the model's 1.00
    while the host took 209 and 427 ms from it)."""
    assert KERNEL_LAYOUT is not None
    scenario = load_scenario(POD_BATCH)
    repeats = list(measured)
    found = agreement(scenario, repeats, cores=2)
    for _ in range(MORE_REPEATS):
        if not any(disturbed(run) for run in found):
            break
        print("measured again, the host took from every measurement of a run that disagrees")
        repeats.append(run_scenario(scenario, KERNEL_LAYOUT, POD_OPTIONS))
        found = agreement(scenario, repeats, cores=2)
    misses = [a.describe() for a in found if not a.agrees]
    assert not misses, "\n".join(misses)


def tune(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", "--pin", str(path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def final_of(result: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    if result["refined"]:
        return result["refined"]["recommendation"]["limit_millicores"], result["refined"]["after"]
    return result["recommendation"]["limit_millicores"], result["after"]


def meets(run: dict[str, Any]) -> bool:
    """The target met in the container's periods and the pod's, each compared no finer
    than one period of the run (below)."""
    pod = run["pod"]
    return all(r["throttle_ratio"] <= MET or r["nr_throttled"] <= 1 for r in (run, pod))


def misses(result: dict[str, Any]) -> bool:
    return not meets(final_of(result)[1])


def used_millicores(run: dict[str, Any]) -> float:
    """What a run used over its wall time, from its own counters (``usage_ms / wall_ms``),
    millicores: what ``lab tune`` gives the engine as the evidence's ``usage_cores``."""
    return 1000 * run["usage_ms"] / run["wall_ms"]


FLOOR_REASON = "its usage counter measured over the window"
"""The words of the engine's reason where the refinement floor held the answer up
(printed: a floor that held shows the windows read less than the counters)."""


def assert_not_refined_below_what_it_used(result: dict[str, Any]) -> None:
    """The product's rule (recommend.engine, the refinement floor): a refinement of an
    answer that met the target is no lower than what that answer's run used over its wall
    time, or it is that answer; where the floor held it, the reason says so. On CI, before
    the rule, a tune answered 2,140m (met), then refined to 1,850m + 43 ms from windows that
    read less than the run's counters (about 1.93 cores), and the kernel throttled it."""
    refined = result["refined"]
    if not refined:
        return
    first = result["recommendation"]["limit_millicores"]
    limit = refined["recommendation"]["limit_millicores"]
    used = used_millicores(result["after"])
    held = any(FLOOR_REASON in r for r in refined["recommendation"]["reasons"])
    print(f"refined {first}m to {limit}m; its run used {used:.0f}m; the floor held it: {held}")
    assert limit >= min(first, used), (
        f"refined {first}m (met) to {limit}m, below the {used:.0f}m its run used",
        refined["recommendation"]["reasons"],
    )


@pytest.mark.slow
def test_tune_meets_the_target_in_a_pod_with_what_it_recommends_alone() -> None:
    """``lab tune`` of the batch in a pod with a quota: every run of the tune keeps the pod
    quota; the answer meets the target in the container's periods and the pod's, is no
    bigger than the test measured the batch to need, and is what the same tune answers
    without the pod quota in this run, within the kernel's spread. A tune is run again by
    :func:`judged`'s rules only (the host took from a run the answer was sized from), and a
    refinement never answers below what the run it refined from used
    (:func:`assert_not_refined_below_what_it_used`)."""
    in_pod = judged(lambda: tune(ROOT / "scenarios" / "tune-batch-pod-quota.yaml"), misses)
    assert_not_refined_below_what_it_used(in_pod)
    limit, after = final_of(in_pod)
    for tried in [in_pod["before"], in_pod["after"], *(b["after"] for b in in_pod["baselines"])]:
        assert tried["limit"].get("pod_quota") is True and "pod" in tried
    # the container's periods and the pod's, each compared no finer than one period of the
    # run (a tune's run is short: 6-7 periods, a ratio in steps of 0.14-0.17). The kernel's
    # own minimum for this batch is 1,980-2,000m (bench/results/tune-sweep.md), and an
    # answer there throttled 1 of 6 periods beside a hog (1,980m, the host taking nothing);
    # once 1 of the pod's 7 throttled, beside 1.9 s of host steal. An answer short of the
    # need throttles most of them (VPA's 1,150m: 10 of 10).
    assert meets(after), (limit, after, in_pod)
    assert_small(in_pod)
    # this run's answer alone, within the kernel's spread (ALONE_SPREAD); tuned alone again
    # by judged's rules only: one CI run beside 3.7 s of host steal answered 1,490m alone,
    # and 1,950m in the pod
    alone = judged(lambda: tune(ROOT / "scenarios" / "tune-batch-parallel.yaml"),
                   lambda tuned: not within_the_spread(limit, final_of(tuned)[0]))  # fmt: skip
    alone_limit, _ = final_of(alone)
    assert within_the_spread(limit, alone_limit), (limit, alone_limit, alone["before"])


ALONE_SPREAD = 0.15
"""How far the answer in a pod may be from the same tune's answer alone: the kernel's own
minimum for the batch is 1,980-2,000m (bench/results/tune-sweep.md), and the answers of
bench/results/pod-stall.json, alone and in the pod, 1,920-2,270m."""


def within_the_spread(in_pod: int, alone: int) -> bool:
    return (1 - ALONE_SPREAD) * alone <= in_pod <= (1 + ALONE_SPREAD) * alone
