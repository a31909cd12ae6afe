"""Where the scheduler puts a run's two workers, pinned apart or left to it; and how far
the open pool's knife-edge run spreads either way.

    sudo .venv/bin/python bench/placement.py --runs 15 --save bench/results/placement.json

Runs ``scenarios/seed-000-batch-parallel.yaml`` (two workers, 60 ms tasks in rounds
of two) without a limit and at 2 CPU, ``--runs`` times each, isolated, first with the
workers left to the scheduler and then pinned apart (``LabOptions.pin``). A round
whose two workers shared one CPU takes about 120 ms instead of 60: the run's worst
round tells. Then ``seed-004-open-pool.yaml`` at 0.6 CPU, ``--runs`` // 2 times each
way: its p95 and throttle ratio, against the model's. Run it beside the load it is
meant to show (a CPU hog, say); the results file records how much other load there
was. docs/benchmarks.md §3 and the open pool's scenario file quote it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import Layout, detect_layout
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import load_scenario
from unthrottle_lab.sim.tasks import Machine, simulate_tasks

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "seed-000-batch-parallel.yaml"
POOL = ROOT / "scenarios" / "seed-004-open-pool.yaml"
STACKED_MS = 90.0
"""A round this long had its two 60 ms tasks on one CPU for a good part of it."""


def measure(runs: int) -> dict[str, Any]:
    """The worst round of each run, unpinned and pinned."""
    scenario = load_scenario(SCENARIO)
    workload = scenario.workload.to_workload()
    specs = [run for run in scenario.runs if run.cpus in (None, 2)]
    layout = detect_layout()
    out: dict[str, Any] = {}
    with OtherLoad() as noise:
        for pin in (False, True):
            options = LabOptions(isolate=True, pin=pin)
            worst = [run_run(workload, spec, layout, options).latency.max
                     for spec in specs for _ in range(runs)]  # fmt: skip
            out["pinned" if pin else "unpinned"] = {
                "runs": len(worst),
                "stacked_runs": sum(w > STACKED_MS for w in worst),
                "worst_round_ms": round(max(worst), 1),
                "median_worst_round_ms": round(sorted(worst)[len(worst) // 2], 1),
            }
        out["open_pool"] = pool(max(1, runs // 2), layout)
    out["other_load_cores"] = round(noise.cores, 2)
    return out


def pool(runs: int, layout: Layout) -> dict[str, Any]:
    """The open pool at 0.6 CPU: p95 and throttle ratio over ``runs``, each placement."""
    scenario = load_scenario(POOL)
    workload = scenario.workload.to_workload()
    (spec,) = [run for run in scenario.runs if run.cpus == 0.6]
    model = simulate_tasks(workload, spec.bandwidth(), Machine(cores=len(os.sched_getaffinity(0))))
    out: dict[str, Any] = {"model_p95_ms": round(model.latency.p95, 1),
                           "model_ratio": round(model.stat.throttle_ratio, 2)}  # fmt: skip
    for pin in (False, True):
        figures = [run_run(workload, spec, layout, LabOptions(isolate=True, pin=pin))
                   for _ in range(runs)]  # fmt: skip
        out["pinned" if pin else "unpinned"] = {
            "p95_ms": sorted(round(f.latency.p95, 1) for f in figures),
            "ratio": sorted(round(f.stat.throttle_ratio, 2) for f in figures),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per setting and placement")
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    found = measure(args.runs)
    for name in ("unpinned", "pinned"):
        row = found[name]
        print(f"{name}: {row['stacked_runs']} of {row['runs']} runs had a round over "
              f"{STACKED_MS:.0f} ms; worst round {row['worst_round_ms']} ms, median of the "
              f"runs' worst {row['median_worst_round_ms']} ms")  # fmt: skip
    opened = found["open_pool"]
    for name in ("unpinned", "pinned"):
        print(f"open pool at 0.6 CPU, {name}: p95 {opened[name]['p95_ms']} ms, ratio "
              f"{opened[name]['ratio']} (model {opened['model_p95_ms']} ms, "
              f"{opened['model_ratio']})")  # fmt: skip
    print(f"other load: {found['other_load_cores']} cores")
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(),
                 "command": f"sudo .venv/bin/python bench/placement.py --runs {args.runs} "
                            "--save bench/results/placement.json",
                 **found}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
