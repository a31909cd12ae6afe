"""The task-level model reproduces the seeds' phenomena, and holds its invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unthrottle.units import Bandwidth
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.sim.tasks import Accounting, Machine, simulate_tasks
from unthrottle_lab.workload import Kind, Workload

TWO_CORES = Machine(cores=2)


def run(workload: Workload, bw: Bandwidth, machine: Machine = TWO_CORES) -> RunFigures:
    return simulate_tasks(workload, bw, machine)


SERIAL_30 = Workload(Kind.SERIAL, task_cpu_us=30_000, workers=1, tasks=100)
SERIAL_5 = Workload(Kind.SERIAL, task_cpu_us=5_000, workers=1, tasks=100)
BATCH = Workload(Kind.BATCH, task_cpu_us=60_000, workers=2, tasks=10)
BURSTY = Workload(Kind.SERIAL, task_cpu_us=20_000, workers=1, tasks=60, think_us=73_000)
OPEN = Workload(Kind.OPEN, task_cpu_us=8_000, workers=2, tasks=300, rate_per_s=60, seed=7)


class TestSeedPhenomena:
    @pytest.mark.parametrize("workload", [SERIAL_30, SERIAL_5, BATCH], ids=["30ms", "5ms", "batch"])
    def test_without_a_limit_latency_is_the_task_cpu_time(self, workload: Workload) -> None:
        fig = run(workload, Bandwidth())
        assert fig.latency.p50 == pytest.approx(workload.task_cpu_us / 1000)
        assert fig.latency.max == pytest.approx(workload.task_cpu_us / 1000)
        assert fig.stat.nr_throttled == 0

    def test_30ms_tasks_under_half_a_cpu_wait_out_the_period(self) -> None:
        fig = run(SERIAL_30, Bandwidth(50_000))
        assert fig.latency.p50 > 60
        assert fig.stat.throttle_ratio > 0.9
        # one thread throttled for ~half of each period, ~60 periods
        assert 2_500_000 < fig.stat.throttled_us < 3_500_000

    def test_a_10ms_period_lowers_p50_and_keeps_the_throttled_time(self) -> None:
        long = run(SERIAL_30, Bandwidth(50_000, 100_000))
        short = run(SERIAL_30, Bandwidth(5_000, 10_000))
        assert short.latency.p50 < long.latency.p50
        assert short.stat.throttled_us == pytest.approx(long.stat.throttled_us, rel=0.1)

    def test_5ms_tasks_have_a_low_p50_and_a_high_p95(self) -> None:
        fig = run(SERIAL_5, Bandwidth(50_000))
        assert fig.latency.p50 == pytest.approx(5, abs=0.5)
        assert fig.latency.p95 > 40

    def test_a_batch_is_slowed_by_a_limit_under_its_parallelism_and_not_over_it(self) -> None:
        free = run(BATCH, Bandwidth())
        half, one, two = (run(BATCH, Bandwidth(q)) for q in (50_000, 100_000, 200_000))
        assert half.latency.p50 > one.latency.p50 > 1.5 * free.latency.p50
        assert two.latency.p50 == pytest.approx(free.latency.p50)
        assert two.stat.nr_throttled == 0

    def test_burst_removes_throttling_when_the_average_is_under_the_quota(self) -> None:
        plain = run(BURSTY, Bandwidth(25_000))
        burst = run(BURSTY, Bandwidth(25_000, burst_us=25_000))
        assert plain.stat.nr_throttled > 0
        assert burst.stat.nr_throttled < plain.stat.nr_throttled
        assert burst.stat.nr_bursts > 0
        assert burst.latency.p95 <= plain.latency.p95

    def test_an_open_pool_queues_behind_a_tight_limit_and_not_a_loose_one(self) -> None:
        tight = run(OPEN, Bandwidth(60_000))
        loose = run(OPEN, Bandwidth(120_000))
        assert tight.latency.p95 > 3 * loose.latency.p95
        assert tight.stat.throttle_ratio > 0.3
        assert loose.stat.throttle_ratio < 0.05


class TestKernelDetails:
    def test_a_thread_that_only_computes_is_stopped_at_a_tick_and_repays_the_overrun(
        self,
    ) -> None:
        # One busy thread, 50 ms quota, ticks every 4 ms starting with the period:
        # the kernel stops it after 52 ms, then 48 ms (repaying 2 ms), alternately,
        # as measured on this project's machines. 52 + 48 + 52 by 300 ms, 48 more.
        work = Workload(Kind.SERIAL, task_cpu_us=200_000, workers=1, tasks=1)
        fig = run(work, Bandwidth(50_000), Machine(cores=1, hz=250, accounting=Accounting.TICK))
        assert fig.wall_ms == pytest.approx(348)

    def test_a_thread_making_syscalls_is_stopped_as_soon_as_the_runtime_is_spent(self) -> None:
        work = Workload(Kind.SERIAL, task_cpu_us=200_000, workers=1, tasks=1)
        fig = run(work, Bandwidth(50_000), Machine(cores=1))
        assert fig.wall_ms == pytest.approx(350)  # 50 ms in each of four periods

    def test_a_sleeping_thread_keeps_1ms_of_runtime_across_the_refill(self) -> None:
        # A 12.6 ms task, a boundary while it sleeps, then two more (25.2 ms) in one 25 ms
        # period: they fit only with the 1 ms its CPU kept (measured: 25.98 ms used of 25).
        work = Workload(Kind.SERIAL, task_cpu_us=12_600, workers=1, tasks=3, think_us=10_000)
        machine = Machine(cores=1, period_phase_us=80_000)  # first boundary 20 ms in
        kept = run(work, Bandwidth(25_000), machine)
        bare = run(work, Bandwidth(25_000), replace(machine, retained_us=0))
        assert kept.stat.nr_throttled == 0
        assert bare.stat.nr_throttled == 1
        assert bare.latency.max > 50

    def test_a_higher_tick_rate_means_less_overrun(self) -> None:
        work = Workload(Kind.SERIAL, task_cpu_us=200_000, workers=1, tasks=1)
        machine = Machine(cores=1, hz=1000, accounting=Accounting.TICK)
        fig = run(work, Bandwidth(50_000), machine)
        assert fig.wall_ms == pytest.approx(350, abs=1)

    def test_the_period_phase_moves_the_throttling(self) -> None:
        work = Workload(Kind.SERIAL, task_cpu_us=40_000, workers=1, tasks=1)
        on_boundary = run(work, Bandwidth(30_000), Machine(cores=1, period_phase_us=0))
        late = run(work, Bandwidth(30_000), Machine(cores=1, period_phase_us=90_000))
        assert on_boundary.latency.p50 > 100  # 30 ms, wait, 10 ms
        assert late.latency.p50 < 45  # 10 ms before the boundary refills the bucket

    def test_more_workers_than_cores_share_them(self) -> None:
        fig = run(Workload(Kind.BATCH, 10_000, workers=4, tasks=1), Bandwidth(), Machine(cores=2))
        assert fig.latency.p50 == pytest.approx(20)

    def test_parallel_threads_drain_the_shared_quota_faster(self) -> None:
        one = run(Workload(Kind.BATCH, 40_000, workers=1, tasks=5), Bandwidth(100_000))
        two = run(Workload(Kind.BATCH, 40_000, workers=2, tasks=5), Bandwidth(100_000))
        assert one.stat.nr_throttled == 0
        assert two.stat.nr_throttled > 0


class TestBatchThinkTime:
    """``think_us`` for a batch is the idle time between rounds (0: back to back)."""

    def test_rounds_start_think_time_after_the_last_one_ended(self) -> None:
        paced = replace(BATCH, think_us=50_000)
        fig = run(paced, Bandwidth())
        assert fig.wall_ms == pytest.approx(10 * 60 + 9 * 50)
        assert fig.latency.max == pytest.approx(60)  # the idle time is not latency
        assert run(BATCH, Bandwidth()).wall_ms == pytest.approx(10 * 60)  # 0: back to back

    def test_idle_time_between_rounds_refills_the_bucket(self) -> None:
        # 2 × 60 ms per round under 1 CPU: back to back, every round finds the bucket
        # drained; with 200 ms between rounds each starts on a full one.
        back_to_back = run(BATCH, Bandwidth(100_000))
        paced = run(replace(BATCH, think_us=200_000), Bandwidth(100_000))
        assert paced.latency.p95 < back_to_back.latency.p95
        assert paced.stat.throttled_us < back_to_back.stat.throttled_us


workloads = st.builds(
    Workload,
    kind=st.sampled_from(list(Kind)),
    task_cpu_us=st.integers(500, 50_000),
    workers=st.integers(1, 4),
    tasks=st.integers(1, 30),
    think_us=st.integers(0, 50_000),
    rate_per_s=st.floats(1, 200),
    seed=st.integers(0, 100),
)


class TestInvariants:
    @settings(max_examples=300, deadline=None)
    @given(workloads, st.integers(1_000, 300_000), st.integers(1, 4), st.integers(0, 99_999))
    def test_every_task_gets_its_cpu_and_no_more(
        self, workload: Workload, quota: int, cores: int, phase: int
    ) -> None:
        fig = simulate_tasks(
            workload, Bandwidth(quota), Machine(cores=cores, period_phase_us=phase)
        )
        total = workload.task_cpu_us * workload.workers * workload.tasks
        if workload.kind is not Kind.SERIAL:
            total = workload.task_cpu_us * (workload.workers if workload.kind is Kind.BATCH else 1)
            total *= workload.tasks
        assert fig.stat.usage_us == pytest.approx(total, abs=2)
        assert fig.latency.p50 >= workload.task_cpu_us / 1000 / max(1, workload.workers) - 1e-6
        assert fig.stat.nr_throttled <= fig.stat.nr_periods

    @settings(max_examples=200, deadline=None)
    @given(workloads, st.integers(1, 4))
    def test_a_quota_over_every_core_plus_their_slices_never_throttles(
        self, workload: Workload, cores: int
    ) -> None:
        # Exactly every core is not enough when all are busy: runtime a CPU holds at a
        # boundary (up to one 5 ms slice) came out of the pool, as in the kernel.
        machine = Machine(cores=cores)
        quota = cores * (100_000 + machine.slice_us)
        fig = simulate_tasks(workload, Bandwidth(quota), machine)
        assert fig.stat.nr_throttled == 0
