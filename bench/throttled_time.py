"""What ``cpu.stat`` throttled time reads while the CPUs also run idle-priority work.

    sudo .venv/bin/python bench/throttled_time.py --save bench/results/throttled-time.json

One thread with 30 ms tasks back to back at 0.5 CPU, with a 100 ms and a 10 ms
period, measured by the lab with ``--isolate``: on a quiet machine, beside one CPU
hog and beside two, which the isolation keeps at idle priority (``cpu.idle``). In
every case the thread waits out about half of each period; its schedstat run delay
(``wait``) says so. The cgroup's throttled time does too, but for the short period
beside two hogs (every CPU running idle-priority work). The hogs are started
through a shell that exits at once (so they are not this process's children, and
are isolated like any other process) and killed by PID. docs/benchmarks.md §3
quotes the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import detect_layout
from unthrottle_lab.children import foreign_hogs
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import parse_scenario

SCENARIO = parse_scenario({
    "name": "serial-30ms-long",
    "workload": {"kind": "serial", "task_cpu_ms": 30, "workers": 1, "tasks": 100},
    "runs": [{"cpus": 0.5}, {"cpus": 0.5, "period_ms": 10}],
})  # fmt: skip


BESIDE = {0: "nothing", 1: "one idle-priority hog", 2: "two idle-priority hogs"}


def measure(repeats: int) -> list[dict[str, Any]]:
    layout, options = detect_layout(), LabOptions(isolate=True)
    workload = SCENARIO.workload.to_workload()
    rows = []
    for count, beside in BESIDE.items():
        for spec in SCENARIO.runs:
            for _ in range(repeats):
                with foreign_hogs(count):
                    stat = run_run(workload, spec, layout, options).stat
                rows.append({
                    "period_ms": spec.bandwidth().period_us / 1000,
                    "beside": beside,
                    "usage_s": round(stat.usage_us / 1e6, 2),
                    "throttled_s": round(stat.throttled_us / 1e6, 2),
                    "wait_s": round(stat.wait_us / 1e6, 2),
                    "nr_throttled": stat.nr_throttled,
                    "nr_periods": stat.nr_periods,
                })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md §3."""
    lines = ["| period | beside | usage s | throttled s (cpu.stat) | wait s (schedstat) "
             "| periods throttled |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['period_ms']:g} ms | {r['beside']} | {r['usage_s']:.2f} "
                     f"| {r['throttled_s']:.2f} | {r['wait_s']:.2f} "
                     f"| {r['nr_throttled']} of {r['nr_periods']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    rows = measure(args.repeats)
    print(table(rows))
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(), "kernel": platform.release(),
                 "command": "sudo .venv/bin/python bench/throttled_time.py --save "
                            "bench/results/throttled-time.json",
                 "rows": rows}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
