"""Late readings: a throttled run read late, against its truth (docs/benchmarks.md §3).

    sudo .venv/bin/python bench/late_readings.py --late-ms 0 --repeats 1 \
        --save bench/results/late-booked.json
    sudo .venv/bin/python bench/late_readings.py --late-ms 60 --repeats 4   # read late

``tests/kernel/test_censoring.py``'s workload (two threads, 40 ms tasks back to back), measured
unlimited (the truth) and at 0.5 CPU, isolated, ``--repeats`` pairs of runs. Beside the
lab's own sampler, a second reader samples the same cgroup on the same grid, 1 ms after
each boundary, except for ``--late`` readings, each taken ``--late-ms`` after its
boundary, as a sampler thread that waits its turn on a busy machine takes them: the
counters are the kernel's at that moment. With ``--late-ms 0`` nothing is read late on
purpose, and what the machine does of itself is recorded (a period timer, or a CPU's
unthrottle, that comes after the reading books a period's stall in the next window).

Saved: every reading (ns from the run's start; usage, throttled time and wait, µs; the
kernel's count of periods), the grid, and the recommendation (LimitOnly, target 0.05, no
headroom, as in test_censoring) from each run's windows as read and as attributed by
their refills (``unthrottle_lab.sampling.attribute``). ``tests/unit/test_late_readings.py``
replays them; ``--from FILE`` recomputes the recommendations from saved readings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unthrottle.cgroups import Cgroup, CpuStat, detect_layout
from unthrottle.recommend import Current, PeriodEvidence, Policy, Strategy, recommend
from unthrottle.units import Bandwidth
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_sampled
from unthrottle_lab.sampling import (
    AFTER_BOUNDARY_NS,
    CountersAndWaits,
    PeriodSamples,
    Reading,
    Refills,
    attribute,
    grant_of,
)
from unthrottle_lab.scenario import RunSpec, parse_scenario
from unthrottle_lab.schedule import ScheduledReader

SCENARIO = parse_scenario(
    {
        "name": "censoring",
        "workload": {"kind": "batch", "task_cpu_ms": 40, "workers": 2, "tasks": 24},
        "runs": [{}, {"cpus": 0.5}],
    }
)
POLICY = Policy(strategy=Strategy.LIMIT_ONLY, headroom=0, max_step_up=100, min_millicores=10)


@dataclass
class LateSchedule(ScheduledReader):
    """A :class:`ScheduledReader` whose readings number ``late_ns`` (from 0) are taken that
    much later than due."""

    late_ns: dict[int, int] = field(default_factory=dict)

    def _run(self) -> None:
        at, index = self.start_ns + self.phase_ns, 0
        while not self._stop.wait(
            max(0.0, (at + self.late_ns.get(index, 0) - time.monotonic_ns()) / 1e9)
        ):
            self.readings.append((time.monotonic_ns(), self.reader.read()))
            at += self.step_ns
            index += 1


def measure(spec: RunSpec, late_ns: dict[int, int]) -> dict[str, Any]:
    """One run, read late where ``late_ns`` says, with its grid and its readings."""
    layout = detect_layout()
    seen: dict[str, Any] = {}

    def watch(cgroup: Cgroup, start_ns: int, period_ns: int) -> Any:
        reader = CountersAndWaits(layout, cgroup.path)
        schedule = LateSchedule(reader, start_ns + period_ns, period_ns, AFTER_BOUNDARY_NS,
                                baseline=True, late_ns=late_ns)  # fmt: skip
        schedule.start()
        seen.update(start_ns=start_ns, period_ns=period_ns, schedule=schedule, reader=reader)

        def stop() -> None:
            schedule.stop()
            reader.close()

        return stop

    figures, _ = run_sampled(SCENARIO.workload.to_workload(), spec, layout,
                             LabOptions(isolate=True), watch=watch)  # fmt: skip
    start, readings = seen["start_ns"], seen["schedule"].readings
    bandwidth = spec.bandwidth()
    return {
        "limit": spec.as_given(),
        "period_ns": seen["period_ns"],
        # the lab starts a limited run on one of the kernel's period boundaries (phase 0)
        "boundary_ns": 0,
        "quota_us": bandwidth.quota_us,
        "cpus": len(os.sched_getaffinity(0)),
        "threads": seen["reader"].most_threads,
        "late_ms": {str(k): v / 1e6 for k, v in late_ns.items()},
        "throttle_ratio": figures.stat.throttle_ratio,
        "readings": [
            [t - start, r.usage_us, r.throttled_us, r.wait_us, r.nr_periods] for t, r in readings
        ],
    }


def readings_of(run: dict[str, Any]) -> list[Reading]:
    """The saved readings, as the sampler holds them (times from the run's start)."""
    return [(t, CpuStat(usage_us=u, nr_periods=periods, nr_throttled=0, throttled_us=th,
                        nr_bursts=0, burst_us=0, wait_us=w))
            for t, u, th, w, periods in run["readings"]]  # fmt: skip


def refills_of(run: dict[str, Any]) -> Refills:
    """Where the saved run's quota was refilled, and what one refill could grant."""
    bandwidth = Bandwidth(quota_us=run["quota_us"], period_us=run["period_ns"] // 1000)
    return Refills(0, run["period_ns"], run["boundary_ns"], grant_of(bandwidth))


def demand_as_read(run: dict[str, Any]) -> np.ndarray:
    """Each window as one period, as the sampler took it before (no scaling under 1.5
    periods), through the product's demand (usage + the larger of throttled time and
    wait, the wait up to what the threads can wait in a period)."""
    d = np.diff(np.asarray(run["readings"], dtype=np.int64)[:, 1:4], axis=0)
    return demand_of(run, d[:, 0], d[:, 1], d[:, 2])


def demand_attributed(run: dict[str, Any]) -> np.ndarray:
    """Per period, the counters attributed by the refills each window holds."""
    usage, throttled, wait = attribute(readings_of(run), refills_of(run), run["threads"])
    return demand_of(run, np.asarray(usage), np.asarray(throttled), np.asarray(wait))


def demand_of(
    run: dict[str, Any], usage: np.ndarray, throttled: np.ndarray, wait: np.ndarray
) -> np.ndarray:
    period_us, i64 = run["period_ns"] // 1000, np.int64
    samples = PeriodSamples(usage.astype(i64), throttled.astype(i64), period_us,
                            wait.astype(i64), run["threads"])  # fmt: skip
    return samples.demand_us


def limit_from(demand: np.ndarray, current: int | None) -> int:
    rec = recommend(PeriodEvidence(demand.astype(np.int64)), Current(current), POLICY)
    assert rec.limit_millicores is not None
    return rec.limit_millicores


def summary(truth: dict[str, Any], late: dict[str, Any]) -> dict[str, Any]:
    """The recommendations from the truth and from the late-read run, both ways."""
    from_truth = limit_from(demand_attributed(truth), None)
    as_read = limit_from(demand_as_read(late), 500)
    attributed = limit_from(demand_attributed(late), 500)
    largest = sorted((demand_as_read(late) // 1000).tolist(), reverse=True)
    truth_demand = demand_attributed(truth)
    return {
        # test_censoring holds its truth to two busy threads: a median window over 150 ms
        "truth_median_window_ms": int(np.median(truth_demand[truth_demand > 0]) // 1000),
        "from_truth_millicores": from_truth,
        "as_read_millicores": as_read,
        "attributed_millicores": attributed,
        "as_read_ratio": round(as_read / from_truth, 3),
        "attributed_ratio": round(attributed / from_truth, 3),
        "largest_windows_as_read_ms": largest[:4],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--late", type=int, nargs="+", default=[4, 8, 12, 16, 20, 24],
                        help="which readings of the throttled run are late (from 0)")  # fmt: skip
    parser.add_argument("--late-ms", type=float, default=60.0, help="0: none read late")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--from", dest="saved", type=Path,
                        help="recompute from a saved run; measure nothing")  # fmt: skip
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    if args.saved:
        result = json.loads(args.saved.read_text())
    else:
        late_ns = {k: round(args.late_ms * 1e6) for k in args.late} if args.late_ms else {}
        runs = []
        for _ in range(args.repeats):
            with OtherLoad() as noise:
                truth = measure(SCENARIO.runs[0], {})
                late = measure(SCENARIO.runs[1], late_ns)
            runs.append({"other_load_cores": round(noise.cores, 2), "truth": truth, "late": late})
        result = {
            "measured": datetime.date.today().isoformat(),
            "command": " ".join(["sudo .venv/bin/python bench/late_readings.py", *sys.argv[1:]]),
            "runs": runs,
        }
    for run in result["runs"]:
        run.update(summary(run["truth"], run["late"]))
        shown = {k: v for k, v in run.items() if k not in ("truth", "late")}
        print(json.dumps(shown))
    if args.save:
        args.save.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
