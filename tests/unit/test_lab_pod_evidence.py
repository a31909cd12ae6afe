"""The lab under a pod quota, without the kernel: the evidence ``lab tune`` recommends from,
the runs a tune makes, and the tables (issue 28 §1)."""

from __future__ import annotations

import numpy as np
from rich.console import Console

from unthrottle.units import Bandwidth
from unthrottle_lab.output import figures_table
from unthrottle_lab.sampling import PeriodSamples
from unthrottle_lab.scenario import parse_scenario
from unthrottle_lab.sim.tasks import Machine, simulate_tasks
from unthrottle_lab.tune import spec_for, throttle_ratio
from unthrottle_lab.workload import Kind, Workload

BATCH = Workload(Kind.BATCH, task_cpu_us=60_000, workers=2, tasks=10)
ONE_CPU = Bandwidth(100_000, 100_000)


class TestTheLabsEvidenceUnderAPodQuota:
    """What ``lab tune`` recommends from: a window the pod was throttled in wanted more."""

    def samples(self, pod: list[int] | None, wait: list[int] | None = None) -> PeriodSamples:
        return PeriodSamples(
            usage_us=np.array([100_000, 100_000, 40_000], dtype=np.int64),
            throttled_us=np.array([60_000, 0, 0], dtype=np.int64),
            period_us=100_000,
            wait_us=None if wait is None else np.array(wait, dtype=np.int64),
            threads=2,
            pod_throttled_us=None if pod is None else np.array(pod, dtype=np.int64),
        )

    def test_the_pods_throttled_time_is_demand_the_container_did_not_get(self) -> None:
        assert self.samples(None).demand_us.tolist() == [160_000, 100_000, 40_000]
        assert self.samples([20_000, 50_000, 0]).demand_us.tolist() == [180_000, 150_000, 40_000]

    def test_a_wait_above_both_stalls_is_taken_and_a_sum_above_the_wait_is_capped(self) -> None:
        samples = self.samples([20_000, 50_000, 0], wait=[90_000, 40_000, 0])
        assert samples.demand_us.tolist() == [190_000, 140_000, 40_000]
        assert samples.contention_us.tolist() == [10_000, 0, 0]


class TestATuneInAPod:
    def test_every_run_of_a_tune_keeps_the_pod_quota(self) -> None:
        spec = spec_for(1980, 0, 100_000, pod_quota=True)
        assert spec.pod_bandwidth() == Bandwidth(198_000, 100_000)
        assert spec_for(1980, 0, 100_000).pod_bandwidth() is None

    def test_the_target_holds_for_the_pods_periods_too(self) -> None:
        figures = simulate_tasks(BATCH, Bandwidth(200_000), Machine(cores=2), pod=ONE_CPU)
        assert figures.stat.throttle_ratio == 0
        assert throttle_ratio(figures) == 1.0


class TestTheTablesShowThePod:
    def test_lab_runs_table_has_the_pods_counters_beside_the_containers(self) -> None:
        workload = {"kind": "batch", "task_cpu_ms": 60, "workers": 2, "tasks": 10}
        runs_given = [{"cpus": 1}, {"cpus": 1, "pod_quota": True}]
        scenario = parse_scenario({"name": "p", "workload": workload, "runs": runs_given})
        runs = [simulate_tasks(BATCH, run.bandwidth(), Machine(cores=2),
                               pod=run.pod_bandwidth()) for run in scenario.runs]  # fmt: skip
        console = Console(width=250, record=True)
        console.print(figures_table("t", [(scenario, runs)]))
        lines = console.export_text().splitlines()
        assert "pod throttled" in "".join(lines)
        in_pod = next(line for line in lines if "pod quota" in line)
        assert in_pod.split("│")[-2].strip() == "0"  # the pod's throttled ms: none here
