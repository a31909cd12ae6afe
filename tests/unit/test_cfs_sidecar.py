"""The task model's two-container pod (issue 28 §1): a sidecar beside the run's container,
each with its own bucket, under the pod's, whose quota is the sum of theirs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT
from unthrottle.units import Bandwidth
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.scenario import load_scenario
from unthrottle_lab.sim.tasks import Accounting, Machine, Sidecar, simulate_tasks
from unthrottle_lab.workload import Kind, Workload

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
BATCH = Workload(Kind.BATCH, task_cpu_us=60_000, workers=2, tasks=10)
BUSY_PAIR = Workload(Kind.SERIAL, task_cpu_us=20_000, workers=2, tasks=60)
"""A sidecar of two threads that never rest: it spends its quota at the start of each of
its periods."""
ONE_TASK = Workload(Kind.SERIAL, task_cpu_us=10, tasks=1)
"""A sidecar that uses next to none of its quota: one 10 µs task at the start."""


def side_figures(figures: RunFigures) -> RunFigures:
    return RunFigures.from_json(figures.extra["sidecar"])


class TestASidecarBesideTheContainer:
    def test_a_sidecar_that_uses_none_of_its_quota_changes_nothing_for_the_container(
        self,
    ) -> None:
        """The batch throttled at 1 CPU, alone and beside an idle sidecar at 0.2 CPU in a
        1.2 CPU pod on the same grid: every figure of the container is the same."""
        machine = Machine(cores=4, wakeup_us=150)
        alone = simulate_tasks(BATCH, Bandwidth(100_000), machine)
        beside = simulate_tasks(BATCH, Bandwidth(100_000), machine, pod=Bandwidth(120_000),
                                sidecar=Sidecar(ONE_TASK, Bandwidth(20_000)))  # fmt: skip
        assert alone.stat.nr_throttled > 5
        mine = beside.to_json()
        assert {k: mine[k] for k in alone.to_json()} == alone.to_json()
        assert beside.extra["pod"]["nr_throttled"] == 0

    def test_the_pods_usage_is_both_containers(self) -> None:
        scenario = load_scenario(ROOT / "scenarios" / "pod-sidecar-batch.yaml")
        workload = scenario.workload.to_workload()
        for run in scenario.runs:
            figures = simulate_tasks(workload, run.bandwidth(), Machine(cores=2),
                                     pod=run.pod_bandwidth(),
                                     sidecar=run.task_sidecar())  # fmt: skip
            side = side_figures(figures)
            assert side.stat.usage_us == 300_000  # 20 tasks of 15 ms
            assert figures.extra["pod"]["usage_ms"] == pytest.approx(
                (figures.stat.usage_us + side.stat.usage_us) / 1000, abs=0.002
            )

    def test_a_busy_sidecar_under_the_pods_quota_stalls_the_container(self) -> None:
        """The batch at 2 CPUs is never throttled alone. Beside a sidecar that spends its
        0.5 CPU at the start of each of its periods, 30 ms off the pod's grid, the pod's
        2.5 CPU runs out within some of its periods: the batch's rounds take longer, and its
        own counters show none of it (the pod's do). On the same grid it does not happen."""
        machine = Machine(cores=4, sidecar_phase_us=30_000)
        alone = simulate_tasks(BATCH, Bandwidth(200_000), machine)
        sidecar = Sidecar(BUSY_PAIR, Bandwidth(50_000))
        beside = simulate_tasks(BATCH, Bandwidth(200_000), machine, pod=Bandwidth(250_000),
                                sidecar=sidecar)  # fmt: skip
        assert alone.stat.nr_throttled == 0 and alone.latency.p95 == 60.0
        assert beside.stat.nr_throttled == 0
        assert beside.latency.p95 >= 70.0
        assert beside.extra["pod"]["throttled_ms"] >= 50
        aligned = simulate_tasks(BATCH, Bandwidth(200_000), Machine(cores=4),
                                 pod=Bandwidth(250_000), sidecar=sidecar)  # fmt: skip
        assert aligned.latency == alone.latency and aligned.extra["pod"]["nr_throttled"] == 0

    def test_the_sidecar_is_throttled_by_its_own_quota(self) -> None:
        """Two busy threads at 0.5 CPU: throttled in (nearly) every period it is active."""
        figures = simulate_tasks(BATCH, Bandwidth(200_000), Machine(cores=4),
                                 pod=Bandwidth(250_000),
                                 sidecar=Sidecar(BUSY_PAIR, Bandwidth(50_000)))  # fmt: skip
        side = side_figures(figures)
        assert side.stat.throttle_ratio > 0.95
        assert side.stat.usage_us == 60 * 2 * 20_000


class TestACpuSharedByBothContainers:
    def test_a_sidecar_beside_one_of_the_batchs_two_threads_gets_two_thirds_of_the_cpu(
        self,
    ) -> None:
        """The kernel weighs the containers' groups first: the batch's weight is spread over
        its two CPUs, the sidecar's is all on its one, so on the CPU they share the sidecar
        runs at 2/3 and a 15 ms task takes 22.5 ms (evenly shared, 30). Measured on the
        kernel at 2 CPUs and 0.5: p95 26.0–27.2 ms (bench/results/lab-vs-model-sidecar-first.json)
        and 23.2–23.9 in the two measurements after (lab-vs-model-sidecar.json)."""
        one_task = Sidecar(Workload(Kind.SERIAL, 15_000, tasks=1), Bandwidth(50_000))
        figures = simulate_tasks(BATCH, Bandwidth(None), Machine(cores=2), sidecar=one_task)
        assert side_figures(figures).latency.max == pytest.approx(22.5)
        assert figures.latency.max == pytest.approx(75.0)  # the batch lost the sidecar's 15 ms

    def test_a_batch_worker_waiting_for_its_round_still_weighs_on_its_cpu(self) -> None:
        """The kernel's group weights follow load averages, which lag: the batch's worker
        that ends its task first and waits for the other still weighs on its CPU for a
        while, so the sidecar keeps 2/3 of the CPU it shares with the other. A 60 ms task
        beside the batch: 40 ms done by the time the first worker waits (60 ms), the rest
        at 2/3, 90 ms (at 1/2 once the waiting worker weighed nothing, 100). Measured with
        the sidecar pinned beside the batch's first worker: its tasks 23.2-24.0 ms at p95
        against 27.9 when the weight moved at once (bench/results/lab-vs-model-sidecar.json)."""
        long_task = Sidecar(Workload(Kind.SERIAL, 60_000, tasks=1), Bandwidth(200_000))
        figures = simulate_tasks(BATCH, Bandwidth(None), Machine(cores=2), sidecar=long_task)
        assert side_figures(figures).latency.max == pytest.approx(90.0)

    def test_a_pinned_sidecar_stays_beside_the_batch_where_a_free_one_takes_an_idle_cpu(
        self,
    ) -> None:
        """A sidecar's task that wakes while one CPU is idle runs there when its thread is
        free to move, and beside the batch's worker it is pinned with when it is not
        (``lab run --pin --pin-sidecar``): one round of the batch, the sidecar's second
        task due at 72.5 ms, as the first worker's task has 2.5 ms left. Free, that worker
        ends at 75 ms; beside the sidecar, at 1/3 of its CPU for a while, at 80."""
        batch = Workload(Kind.BATCH, task_cpu_us=60_000, workers=2, tasks=1)
        two_tasks = Workload(Kind.SERIAL, 15_000, tasks=2, think_us=50_000)
        rounds = [
            simulate_tasks(batch, Bandwidth(None), Machine(cores=2),
                           sidecar=Sidecar(two_tasks, Bandwidth(200_000), pinned=pinned))
            for pinned in (False, True)
        ]  # fmt: skip
        assert [r.latency.max for r in rounds] == [pytest.approx(75.0), pytest.approx(80.0)]


class TestCountersReadAsTheLabReadsThem:
    def test_a_container_that_ends_first_counts_the_idle_period_after_its_end(self) -> None:
        """The lab reads both containers' counters once both have ended, and takes out the
        period holding a container's end; the idle one after it stays (the kernel's timer
        counts it before it stops). A sidecar that runs on past the batch adds that one
        period to the batch's count, and nothing to what was throttled."""
        machine = Machine(cores=4)
        long_side = Sidecar(Workload(Kind.SERIAL, 10_000, tasks=40, think_us=40_000),
                            Bandwidth(50_000))  # fmt: skip
        alone = simulate_tasks(BATCH, Bandwidth(100_000), machine)
        beside = simulate_tasks(BATCH, Bandwidth(100_000), machine, pod=Bandwidth(10_000_000),
                                sidecar=long_side)  # fmt: skip
        assert side_figures(beside).wall_ms > alone.wall_ms + 200
        assert beside.stat.nr_periods == alone.stat.nr_periods + 1
        assert beside.stat.nr_throttled == alone.stat.nr_throttled
        assert beside.latency == alone.latency


ONE_CONTAINER_BEFORE: list[tuple[str, float, int, Bandwidth | None, Machine, dict[str, Any]]] = [
    ("seed-000-serial-30ms", 0.3, 15_000, None, Machine(cores=2), {
        "limit": {"cpus": 0.3}, "latency_ms": {"p50": 100.0, "p95": 100.0, "p99": 100.0,
        "max": 100.0}, "wall_ms": 9915.0, "nr_periods": 99, "nr_throttled": 99,
        "throttled_ms": 6914.85, "nr_bursts": 1, "burst_ms": 15.0, "throttle_ratio": 1.0,
        "usage_ms": 3000.0, "wait_ms": 6914.85, "period_phase_ms": 0.0, "hz": 250}),
    ("pod-quota-batch", 1.0, 0, Bandwidth(100_000), Machine(cores=2, pod_phase_us=61_000), {
        "limit": {"cpus": 1.0}, "latency_ms": {"p50": 110.0, "p95": 160.0, "p99": 160.0,
        "max": 160.0}, "wall_ms": 1150.0, "nr_periods": 11, "nr_throttled": 11,
        "throttled_ms": 1097.0, "nr_bursts": 0, "burst_ms": 0.0, "throttle_ratio": 1.0,
        "usage_ms": 1200.0, "wait_ms": 1097.0, "period_phase_ms": 0.0, "hz": 250,
        "pod": {"nr_periods": 12, "nr_throttled": 0, "throttled_ms": 0.0,
                "throttle_ratio": 0.0}, "pod_period_phase_ms": 61.0}),
    ("seed-004-open-pool", 0.6, 0, Bandwidth(90_000, 100_000, 20_000),
     Machine(cores=2, other_threads=1, period_phase_us=37_000, pod_phase_us=61_000,
             accounting=Accounting.TICK), {
        "limit": {"cpus": 0.6}, "latency_ms": {"p50": 10.104, "p95": 62.294, "p99": 94.876,
        "max": 122.104}, "wall_ms": 4846.378, "nr_periods": 48, "nr_throttled": 21,
        "throttled_ms": 1002.335, "nr_bursts": 0, "burst_ms": 0.0, "throttle_ratio": 0.4375,
        "usage_ms": 2400.0, "wait_ms": 1658.335, "period_phase_ms": 37.0, "hz": 250,
        "pod": {"nr_periods": 49, "nr_throttled": 0, "throttled_ms": 0.0,
                "throttle_ratio": 0.0}, "pod_period_phase_ms": 61.0}),
]  # fmt: skip
"""Figures of main's model before the sidecar, to the µs (``tick_phase_us`` 1.3 ms,
``wakeup_us`` 150 µs): the commit that added the sidecar compared 13,776 such runs."""


@pytest.mark.parametrize(
    ("name", "cpus", "burst_us", "pod", "machine", "before"),
    ONE_CONTAINER_BEFORE,
    ids=[case[0] for case in ONE_CONTAINER_BEFORE],
)
def test_one_container_runs_are_what_they_were(
    name: str,
    cpus: float,
    burst_us: int,
    pod: Bandwidth | None,
    machine: Machine,
    before: dict[str, Any],
) -> None:
    workload = load_scenario(ROOT / "scenarios" / f"{name}.yaml").workload.to_workload()
    quota = round(cpus * 100_000)
    machine = dataclasses.replace(machine, tick_phase_us=1300, wakeup_us=150)
    figures = simulate_tasks(workload, Bandwidth(quota, 100_000, burst_us), machine,
                             limit={"cpus": cpus}, pod=pod)  # fmt: skip
    assert json.dumps(figures.to_json()) == json.dumps(before)


def test_simulate_predicts_both_containers_and_the_pod() -> None:
    """``unthrottle-lab simulate`` of the two-container scenario: the sidecar's own figures and
    the pod's usage, both containers', in each run (the table prints the sidecar's row)."""
    out = subprocess.run([str(UNTHROTTLE_LAB), "simulate", "--json", "--cores", "2",
                          str(ROOT / "scenarios" / "pod-sidecar-batch.yaml")],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    runs = json.loads(out.stdout)["runs"]
    assert [r["sidecar"]["limit"] for r in runs] == [{"cpus": 0.2}, {"cpus": 0.5}]
    for run in runs:
        both = run["usage_ms"] + run["sidecar"]["usage_ms"]
        assert run["pod"]["usage_ms"] == pytest.approx(both, abs=0.002)
    throttled, roomy = runs
    assert throttled["throttle_ratio"] > 0.5 and throttled["sidecar"]["throttle_ratio"] > 0.5
    assert roomy["throttle_ratio"] == 0 and roomy["sidecar"]["throttle_ratio"] == 0
