"""What the kernel's run delay holds: throttled time, the wait behind other processes, or both.

    sudo .venv/bin/python bench/wait_facts.py --save bench/results/wait-facts.json

One busy thread in a fresh cgroup for ``--seconds`` (2 s), pinned to one CPU, four
ways: no limit or 0.5 CPU, alone or beside a busy process pinned to the same CPU
(outside the cgroup). Each reports the cgroup's usage and throttled time and the
thread's ``/proc/<pid>/schedstat`` run delay over the same span
(``unthrottle.cgroups.waits``). Cgroups and processes are removed by PID after
each case. docs/benchmarks.md §4 quotes the table; ``cgroups/waits.py`` explains
what follows from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from unthrottle.cgroups import Cgroup, detect_layout
from unthrottle.cgroups.waits import WaitReader
from unthrottle.units import Bandwidth

SPIN = [sys.executable, "-I", "-S", "-c", "while True: pass"]


def case(quota_us: int | None, beside: bool, seconds: float, cpu: int) -> dict[str, Any]:
    """One thread's usage, throttled time and run delay over ``seconds``."""
    layout = detect_layout()
    cg = Cgroup(layout, f"unthrottle-bench-wait-{os.getpid()}")
    cg.create()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cg.write_bandwidth(Bandwidth(quota_us, 100_000))
        thread = subprocess.Popen(["taskset", "-c", str(cpu), *SPIN])
        procs.append(thread)
        cg.add_process(thread.pid)
        if beside:
            procs.append(subprocess.Popen(["taskset", "-c", str(cpu), *SPIN]))
        time.sleep(0.3)
        waits = WaitReader(layout, cg.path)
        s0, w0, t0 = cg.read_stat(), waits.wait_us(), time.monotonic()
        time.sleep(seconds)
        s1, w1, t1 = cg.read_stat(), waits.wait_us(), time.monotonic()
        waits.close()
        delta = s1 - s0
        return {
            "limit": "no limit" if quota_us is None else f"{quota_us / 100_000:g} CPU",
            "beside": "a busy process on its CPU" if beside else "alone on its CPU",
            "wall_s": round(t1 - t0, 3),
            "usage_s": round(delta.usage_us / 1e6, 3),
            "throttled_s": round(delta.throttled_us / 1e6, 3),
            "run_delay_s": round((w1 - w0) / 1e6, 3),
        }
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        cg.remove()


def table(cases: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md §4 ("What the run delay holds")."""
    lines = ["| limit | beside | usage s | throttled s | run delay s |", "|---|---|---|---|---|"]
    for c in cases:
        lines.append(f"| {c['limit']} | {c['beside']} | {c['usage_s']:.2f} "
                     f"| {c['throttled_s']:.2f} | {c['run_delay_s']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU both are pinned to")
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    cases = [case(q, b, args.seconds, args.cpu) for b in (False, True) for q in (None, 50_000)]
    print(table(cases))
    if args.save:
        args.save.write_text(json.dumps({
            "measured": datetime.date.today().isoformat(),
            "command": f"bench/wait_facts.py --seconds {args.seconds:g} --cpu {args.cpu}",
            "kernel": platform.release(),
            "layout": str(detect_layout().version),
            "cases": cases,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
