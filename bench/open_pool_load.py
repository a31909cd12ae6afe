"""The open pool beside other load, isolated or not (README "Requirements and limits",
docs/benchmarks.md §3 "Other load").

    sudo .venv/bin/python bench/open_pool_load.py --repeats 2 \
        --save bench/results/open-pool-load.json

``scenarios/seed-004-open-pool.yaml`` without a limit and at 1.2 CPU, ``--repeats`` times
each: beside nothing the bench starts, beside one CPU hog (a busy process in this
process's cgroup, as a neighbour on the node is), and beside two hogs with the lab's
``--isolate`` (the machine's other processes in the root cgroup at idle priority while
a run measures). The hogs are no children of the bench, and are ended by PID after each
setting. Saved: each run's p95
(ms) and how busy the rest of the machine was over each setting (cores, the hogs
included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import detect_layout
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
POOL = ROOT / "scenarios" / "seed-004-open-pool.yaml"
SETTINGS = (("beside nothing", 0, False), ("beside one hog", 1, False),
            ("beside two hogs, isolated", 2, True))  # fmt: skip


def hog() -> int:
    """A busy process that is not this one's child (started through a shell that exits):
    the lab's isolation leaves its own descendants where they are, as it must its
    workers, and a neighbour on a node is no child of the lab."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' "
                          ">/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return int(out.stdout)


def measure(repeats: int) -> list[dict[str, Any]]:
    scenario = load_scenario(POOL)
    workload = scenario.workload.to_workload()
    specs = [run for run in scenario.runs if run.cpus in (None, 1.2)]
    layout = detect_layout()
    out = []
    for name, hogs, isolate in SETTINGS:
        pids = [hog() for _ in range(hogs)]
        try:
            with OtherLoad() as noise:
                p95 = {spec.label(): [round(run_run(workload, spec, layout,
                                                    LabOptions(isolate=isolate)).latency.p95, 1)
                                      for _ in range(repeats)]
                       for spec in specs}  # fmt: skip
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        out.append({"setting": name, "hogs": hogs, "isolated": isolate, "p95_ms": p95,
                    "other_load_cores": round(noise.cores, 2)})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    settings = measure(args.repeats)
    for row in settings:
        print(f"{row['setting']} ({row['other_load_cores']} cores of other load): "
              + "; ".join(f"{k} p95 {v} ms" for k, v in row["p95_ms"].items()))  # fmt: skip
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(),
                 "command": f"sudo .venv/bin/python bench/open_pool_load.py --repeats "
                            f"{args.repeats} --save bench/results/open-pool-load.json",
                 "settings": settings}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
