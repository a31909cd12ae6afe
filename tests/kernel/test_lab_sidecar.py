"""A two-container pod in the lab (issue 28 §1): a run's ``sidecar`` beside its workload,
each container under its own limit, the pod's quota the sum of theirs (root).

``scenarios/pod-sidecar-batch.yaml``: the demo's batch beside a lighter sidecar, first both
throttled (1 CPU and 0.2, the pod 1.2), then both with room (2 CPUs and 0.5, the pod 2.5),
the batch's workers pinned and the rest of the machine at idle priority. ``lab tune`` of
``scenarios/tune-batch-sidecar.yaml`` recommends for each container from its own evidence
and its share of the pod's throttled time, and proves the pair with the pod's quota their
sum. Bounds from bench/results/pod-sidecar.json (docs/model.md, "The pod level").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import worker_pids
from support.lab_seeds import (
    MORE_REPEATS,
    disturbed,
)
from support.lab_tune import (
    MET,
    OVER,
    judged,
)
from support.machine import KERNEL_LAYOUT
from support.paths import ROOT
from unthrottle.cgroups import Layout
from unthrottle.evidence.pods import share_pod_throttling
from unthrottle_lab.agreement import agreement
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.sampling import pod_share_us
from unthrottle_lab.scenario import load_scenario

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
POD_SIDECAR = ROOT / "scenarios" / "pod-sidecar-batch.yaml"
TUNE_SIDECAR = ROOT / "scenarios" / "tune-batch-sidecar.yaml"
REPEATS = 2
HEADROOM = 0.10
"""``lab tune``'s headroom (its default): added to the limit the evidence needs."""


def ints(*values: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.asarray(values, dtype=np.int64)


class TestEachContainersShareOfThePodsStall:
    """Window by window, the operator's rule (time in proportion to usage)."""

    def test_the_pods_throttled_time_goes_by_usage_and_adds_up(self) -> None:
        pod, own, other = (
            ints(10_000, 0, 30_000, 8_000),
            ints(30_000, 0, 10_000, 0),
            ints(10_000, 0, 30_000, 0),
        )
        mine, theirs = pod_share_us(pod, own, other), pod_share_us(pod, other, own)
        assert list(mine) == [7_500, 0, 7_500, 4_000]  # none ran in the last: equal shares
        assert list(mine + theirs) == list(pod)

    def test_a_window_is_shared_as_the_operators_evidence_shares_a_span(self) -> None:
        found = share_pod_throttling(1.0, 0.0, 9_000.0, {"a": (20_000.0, 1), "b": (40_000.0, 1)})
        assert pod_share_us(ints(9_000), ints(20_000), ints(40_000))[0] == round(found["a"][1])

    def test_windows_past_the_others_last_reading_keep_the_whole(self) -> None:
        assert list(pod_share_us(ints(6_000, 5_000), ints(1_000, 1_000), ints(1_000))) == [
            3_000,
            5_000,
        ]


def lab(*args: str) -> str:
    out = subprocess.run([str(UNTHROTTLE_LAB), *args], capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def leftovers() -> set[str]:
    assert KERNEL_LAYOUT is not None
    return {p.name for p in KERNEL_LAYOUT.cpu_root.glob("unthrottle-lab-*")}


@pytest.fixture(scope="module")
def measured() -> list[list[dict[str, Any]]]:
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    before = leftovers()
    runs = []
    for _ in range(REPEATS):
        line = lab("run", "--json", "--isolate", "--pin", "--pin-sidecar", str(POD_SIDECAR))
        runs.append(json.loads(line)["runs"])
    assert leftovers() <= before, "a run's container, sidecar or pod cgroup was left behind"
    return runs


@pytest.mark.kernel
def test_lab_run_reports_each_containers_counters_and_the_pods(
    measured: list[list[dict[str, Any]]],
) -> None:
    for runs in measured:
        for run in runs:
            side, pod = run["sidecar"], run["pod"]
            assert side["limit"]["cpus"] in (0.2, 0.5) and run["limit"]["sidecar"]
            # the pod's usage is its two containers' (the same counters, read together)
            both = run["usage_ms"] + side["usage_ms"]
            assert abs(pod["usage_ms"] - both) <= 0.01 * both + 1, (pod, both)
            # The pod's timer ran while the batch did: the batch draws ~100 ms a period from
            # the pod's pool, far more than a CPU holds (a 5 ms slice). Not always while the
            # sidecar alone did: the kernel's period timer stops after a period in which no
            # CPU drew runtime from the pool (cfs_b->idle), and restarts later without
            # counting the periods it skipped; the sidecar, alone after the batch ends, may
            # run a period of the pod's grid on runtime its CPU already held. Measured: the
            # pod one period short of the sidecar in 8 of 22 saved throttled runs, two short
            # once (13 against the sidecar's 15 and the batch's 13).
            assert pod["nr_periods"] >= run["nr_periods"] - 1
            assert pod["nr_periods"] <= max(run["nr_periods"], side["nr_periods"]) + 1
            for level in (run, side, pod):
                assert 0 <= level["nr_throttled"] <= level["nr_periods"]
            # a stall booked is time the threads waited
            for level in (run, side):
                assert level["throttled_ms"] <= 1.02 * level["wait_ms"] + 1, level
            assert side["lost_ms"] >= 0 and run["lost_ms"] >= 0


@pytest.mark.kernel
def test_the_pod_is_throttled_when_its_containers_want_more_than_the_sum(
    measured: list[list[dict[str, Any]]],
) -> None:
    """At 1 CPU and 0.2 the batch (2 CPUs in its rounds) and the sidecar (0.3) want more
    than the pod's 1.2: each is throttled by its own quota, and the pod's quota, on a grid
    of its own, runs out too; at 2 CPUs and 0.5 (the pod 2.5, more than the machine's two
    cores) the batch is not throttled, and neither is the pod."""
    tight = [runs[0] for runs in measured]
    roomy = [runs[1] for runs in measured]
    for run in tight:
        assert run["throttle_ratio"] >= 0.5 and run["sidecar"]["nr_throttled"] >= 1, run
        # each container used no more than its quota allowed, the pod no more than its own
        assert run["usage_ms"] <= 100 * (run["nr_periods"] + 1)
        assert run["sidecar"]["usage_ms"] <= 20 * (run["sidecar"]["nr_periods"] + 1) * 1.05
        assert run["pod"]["usage_ms"] <= 120 * (run["pod"]["nr_periods"] + 1)
    assert max(run["pod"]["throttled_ms"] for run in tight) > 0, "the pod's quota never ran out"
    for run in roomy:
        assert run["nr_throttled"] <= 1 and run["pod"]["nr_throttled"] <= 1, run


@pytest.mark.kernel
def test_the_model_agrees_with_the_two_container_pod_that_has_room(
    measured: list[list[dict[str, Any]]],
) -> None:
    """The task model's two-container pod against the kernel's, by the rules of
    test_lab_seeds, with the sidecar's thread pinned where the model places it (beside the
    batch's first worker: --pin-sidecar): at 2 CPUs and 0.5, each container's ratio and
    latencies, the sidecar's 15 ms tasks at 2/3 of the CPU it shares (p95 23.2-24.0 ms on
    the kernel, 22.6 in the model). Measured again, at most MORE_REPEATS times, where the
    host took REMEASURE_LOST_MS or more from every measurement of it. The throttled run
    (1 CPU and 0.2) is held by the next test, a known gap."""
    assert KERNEL_LAYOUT is not None
    scenario = load_scenario(POD_SIDECAR)
    repeats = [[RunFigures.from_json(run) for run in runs] for runs in measured]
    found = agreement(scenario, repeats, cores=2)
    for _ in range(MORE_REPEATS):
        if not disturbed(found[1]):
            break
        print("measured again, the host took from every measurement of the run")
        line = lab("run", "--json", "--isolate", "--pin", "--pin-sidecar", str(POD_SIDECAR))
        repeats.append([RunFigures.from_json(run) for run in json.loads(line)["runs"]])
        found = agreement(scenario, repeats, cores=2)
    tight, roomy = found
    assert tight.spec.cpus == 1 and roomy.spec.cpus == 2
    print(f"the throttled run: {tight.describe()}")
    assert all(c.sidecar is not None for c in roomy.comparisons)
    assert roomy.agrees, roomy.describe()


@pytest.mark.kernel
@pytest.mark.xfail(
    reason="known gap (docs/benchmarks.md §3): in the throttled two-container pod the "
    "kernel's sidecar is slower than the model's and throttled otherwise (its p50 27.2-52.1 "
    "ms against 22.6-39.5); the model agreed in 1 of 18 pinned measurements, and neither "
    "the grids' phases nor a fixed share of the CPU explains it",
    strict=False,
)
def test_the_model_agrees_with_the_throttled_two_container_pod(
    measured: list[list[dict[str, Any]]],
) -> None:
    """The throttled run (1 CPU and 0.2, the pod's quota their sum) by the same rules as
    the run with room: at least half of the measurements the host left alone."""
    scenario = load_scenario(POD_SIDECAR)
    repeats = [[RunFigures.from_json(run) for run in runs] for runs in measured]
    tight = agreement(scenario, repeats, cores=2)[0]
    assert tight.spec.cpus == 1
    assert tight.agrees, tight.describe()


@pytest.mark.kernel
def test_an_interrupted_two_container_run_leaves_no_cgroup_and_no_worker(
    layout: Layout, tmp_path: Path
) -> None:
    """SIGTERM while both workloads run: the lab's cleanup ends both containers' workers
    (the sidecar's driver thread with them) and removes the sidecar's, the container's and
    the pod's cgroups (the layout fixture asserts that none is left)."""
    long = tmp_path / "long.yaml"
    long.write_text(
        "name: long\nworkload: {kind: serial, task_cpu_ms: 20, workers: 2, tasks: 500}\n"
        "runs: [{cpus: 0.3, sidecar: {cpus: 0.1, workload: {kind: serial, task_cpu_ms: 5, "
        "tasks: 500}}}]\n"
    )
    before = worker_pids()
    proc = subprocess.Popen([str(UNTHROTTLE_LAB), "run", str(long)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not list(layout.cpu_root.glob("unthrottle-lab-*")):
            time.sleep(0.05)
        assert list(layout.cpu_root.glob("unthrottle-lab-*-pod")), "the run never started"
        time.sleep(2.0)  # past the calibrations: both drivers run
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert b"interrupted" in err
    assert worker_pids() <= before


def final_of(result: dict[str, Any]) -> tuple[int, int, dict[str, Any]]:
    """Our last answer for the container and the sidecar, and the run of it."""
    side = result["sidecar"]
    if result["refined"]:
        return (result["refined"]["recommendation"]["limit_millicores"],
                side["refined"]["limit_millicores"], result["refined"]["after"])  # fmt: skip
    return (result["recommendation"]["limit_millicores"],
            side["recommendation"]["limit_millicores"], result["after"])  # fmt: skip


def meets(run: dict[str, Any]) -> bool:
    """The target met in each container's periods and the pod's, each compared no finer
    than one period of the run (a tune's run is short: test_lab_pod_quota)."""
    levels = (run, run["sidecar"], run["pod"])
    return all(r["throttle_ratio"] <= MET or r["nr_throttled"] <= 1 for r in levels)


def misses(result: dict[str, Any]) -> bool:
    return not meets(final_of(result)[2])


def demand_rate(before: dict[str, Any]) -> float:
    """The demand today's run showed over the wall time the host left it, millicores."""
    demand = before["usage_ms"] + max(before["throttled_ms"], before["wait_ms"])
    return 1000 * demand / (before["wall_ms"] - before["lost_ms"])


def need_of(before: dict[str, Any], tried: list[tuple[int, dict[str, Any]]]) -> float:
    """What the test measured a container to need (test_lab_tune.needed_millicores): the
    demand today's run showed, or a smaller limit it saw meet the target with the pod's
    quota the sum, whichever is less."""
    return min([demand_rate(before), *(limit for limit, run in tried if meets(run))])


@pytest.mark.kernel
@pytest.mark.slow
def test_tune_sizes_each_container_so_that_the_pod_meets_the_target_too() -> None:
    """``lab tune`` of the batch beside a sidecar: every run of the tune is a two-container
    pod whose quota is the sum of the two limits; the answer meets the target in each
    container's periods and the pod's, and each container's answer is no bigger than
    ``OVER`` × what the test measured it to need: every answer of the batch's (as
    test_lab_tune's), and the sidecar's last one. The sidecar's first, sized from throttled
    data whose wait holds the batch's contention too, is given as a range (230-580m once,
    beside 2x-average's 374m meeting the target): its bottom is at most that need, and its top
    less the headroom is within ``OVER`` × the demand today's run showed. The top is
    sized to the windows, not their mean: 592m + 10 % beside a mean of 535m once, and
    680m against 536m once, which failed a bound of ``OVER`` × the mean with the headroom
    in it."""
    result = judged(lambda: json.loads(lab("tune", "--json", "--isolate", "--pin",
                                           str(TUNE_SIDECAR))), misses)  # fmt: skip
    runs = [result["before"], result["after"], *(b["after"] for b in result["baselines"])]
    for run in runs:
        side = run["limit"]["sidecar"]["cpus"]
        assert "pod" in run and run["sidecar"]["limit"]["cpus"] == side
    own, side, after = final_of(result)
    assert meets(after), (own, side, after)
    assert after["limit"]["cpus"] * 1000 == own and after["sidecar"]["limit"]["cpus"] * 1000 == side
    first = (result["recommendation"]["limit_millicores"],
             result["sidecar"]["recommendation"]["limit_millicores"])  # fmt: skip
    tried = [(b["limit_millicores"], b["sidecar_limit_millicores"], b["after"])
             for b in result["baselines"]]  # fmt: skip
    tried += [(*first, result["after"]), (own, side, after)]
    own_need = need_of(result["before"], [(o, run) for o, _, run in tried])
    side_need = need_of(result["before"]["sidecar"], [(s, run) for _, s, run in tried])
    for limit in {first[0], own}:
        assert limit <= OVER * own_need, (limit, f"need {own_need:.0f}m")
    assert side <= OVER * side_need, (side, f"sidecar's need {side_need:.0f}m")
    side_demand = demand_rate(result["before"]["sidecar"])
    low = result["sidecar"]["recommendation"]["lower_limit_millicores"]
    # the range's bottom at most that need (its top is always above it once the first answer
    # met, the need then being at most that answer: not a check)
    assert low <= side_need, (low, first[1], f"sidecar's need {side_need:.0f}m")
    top = first[1] / (1 + HEADROOM)
    assert top <= OVER * side_demand, (first[1], f"sidecar's demand {side_demand:.0f}m")
