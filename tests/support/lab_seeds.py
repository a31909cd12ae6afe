"""What test_lab_seeds.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from support.machine import KERNEL_LAYOUT
from support.paths import SCENARIOS
from unthrottle_lab.agreement import LEFT_ALONE_LOST_MS, RunAgreement
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_scenario
from unthrottle_lab.scenario import RunSpec, load_scenario
from unthrottle_lab.workload import Kind, Workload

CORES = len(os.sched_getaffinity(0))
SLICE_US = 5_000  # sched_cfs_bandwidth_slice_us: runtime a CPU may carry into a period
TICK_US = 4_000  # 1/HZ at HZ 250: how far a thread may overrun before it is stopped
REPEATS = 2


REMEASURE_LOST_MS = LEFT_ALONE_LOST_MS
"""What the host took from a run's tasks (steal, ``lost_ms``) above which a measurement is
the host's as much as the kernel's: the model's agreement sets it aside, and judges the
rest. Once, on CI, the open pool at 0.6 CPU measured 27 of 48 periods throttled in both
repeats (the model: 22–24, 14 runs beside a hog 21–25) while the host took 146 and 205 ms
from its tasks; the runs it took under 50 ms from agreed. (Later it measured 27 of 48 with
18 ms taken, on a host that charged 8.22–8.28 ms a task: not the host's steal but the
worker's own cost, which the model's band now reaches; ``unthrottle_lab.agreement``.)"""
MORE_REPEATS = 2
LEFT_ALONE_SHARE = 0.10
"""The share of a run's CPU time (usage) the host may take from its tasks for the run to
show a phenomenon of CFS's rather than the host's. A task slowed by steal uses less of its
quota, and delays the tasks queued behind it: once on CI the host took 640 ms from an
unlimited open pool (about a quarter of its usage), whose p95 read 46 ms less what was taken
(13.5–15.5 ms in six measurements from which it took 0.3–145 ms, up to 5 %); beside a hog it
took 806 ms of a burst seed's 1.21 s, which then never reached its quota."""


def left_alone(runs: list[RunFigures]) -> bool:
    """The host took under :data:`LEFT_ALONE_SHARE` of its usage from every run."""
    return all(
        float(r.extra.get("lost_ms") or 0.0) * 1000 < LEFT_ALONE_SHARE * r.stat.usage_us
        for r in runs
    )


@dataclass
class Lab:
    """Every seed scenario's runs, measured REPEATS times (and again where the host took
    from them, :meth:`measure_again`), and the machine's other load."""

    repeats: list[dict[str, list[RunFigures]]]
    noise: OtherLoad
    again: dict[str, list[list[RunFigures]]] = field(default_factory=dict)

    def __getitem__(self, name: str) -> list[list[RunFigures]]:
        """Every measurement of a scenario: one list of runs per repeat."""
        return [runs[name] for runs in self.repeats] + self.again.get(name, [])

    def measure_again(self, name: str) -> None:
        """One more measurement of a scenario, kept for every test after."""
        assert KERNEL_LAYOUT is not None
        scenario = next(s for s in map(load_scenario, SCENARIOS) if s.name == name)
        runs = run_scenario(scenario, KERNEL_LAYOUT, LabOptions(isolate=True, pin=True))
        self.again.setdefault(name, []).append(runs)

    def judged(self, name: str) -> list[list[RunFigures]]:
        """The measurements of a scenario the host left alone (:func:`left_alone`), the
        scenario measured again (at most :data:`MORE_REPEATS` times) while there is none.
        A phenomenon is held in each of them; none at all fails, saying why."""
        for _ in range(MORE_REPEATS):
            if any(left_alone(runs) for runs in self[name]):
                break
            print(f"{name}: measured again, the host took from every measurement of it")
            self.measure_again(name)
        judged = [runs for runs in self[name] if left_alone(runs)]
        lost = [
            [f"{r.extra.get('lost_ms') or 0} of {r.stat.usage_us / 1000:.0f} ms" for r in runs]
            for runs in self[name]
        ]
        assert judged, (
            f"{name}: the host took ≥ {LEFT_ALONE_SHARE:.0%} of a run's CPU time from every "
            f"measurement (lost_ms by run: {lost})"
        )
        return judged


def bounds_missed(workload: Workload, spec: RunSpec, fig: RunFigures) -> list[str]:
    """What the kernel guarantees of a run whatever else the machine does; the misses."""
    stat, misses = fig.stat, []
    tasks = workload.tasks * (1 if workload.kind is Kind.OPEN else workload.workers)
    work_us = tasks * workload.task_cpu_us  # each task burns this much of its thread's CPU
    parallel = min(workload.workers, CORES)
    wall_us = fig.wall_ms * 1000
    checks = [
        ("nr_throttled ≤ nr_periods", stat.nr_throttled <= stat.nr_periods),
        ("usage covers the work burnt", stat.usage_us >= 0.995 * work_us),
        ("usage is the work and a little overhead", stat.usage_us <= 1.1 * work_us + 50_000),
        ("no run uses more CPUs than there are", stat.usage_us <= parallel * wall_us * 1.02),
        ("throttled time is per waiting CPU", stat.throttled_us <= parallel * wall_us * 1.02),
    ]
    bandwidth = spec.bandwidth()
    if bandwidth.quota_us is None:
        checks.append(("no limit, no throttling", stat.nr_throttled == stat.throttled_us == 0))
    else:
        quota, period, burst = bandwidth.quota_us, bandwidth.period_us, bandwidth.burst_us
        slack = parallel * (SLICE_US + TICK_US)
        # The bucket starts full (quota + burst), then gives at most a quota per period.
        checks += [
            ("usage within the quota of its active periods",
             stat.usage_us <= (stat.nr_periods + 1) * quota + burst + slack),
            # The run's first and last periods are cut by its span, each may hold a quota
            # (CI beside a hog: batch-parallel at 0.5 CPU ran 11 ms faster than one allows).
            ("no faster than the quota lets it run",
             wall_us >= (stat.usage_us - 2 * quota - burst - slack) * period / quota),
            ("active periods fit in the wall time", stat.nr_periods <= wall_us / period + 2),
        ]  # fmt: skip
    for name, ok in checks:
        if not ok:
            misses.append(f"{name} (usage {stat.usage_us} µs, work {work_us} µs, "
                          f"wall {wall_us:.0f} µs, periods {stat.nr_periods}/"
                          f"{stat.nr_throttled} throttled, {stat.throttled_us} µs)")  # fmt: skip
    return misses


def disturbed(run: RunAgreement) -> bool:
    """It disagrees, and the host took from its tasks in every measurement of it (none was
    left for the agreement to judge alone)."""
    return not run.agrees and run.disturbed
