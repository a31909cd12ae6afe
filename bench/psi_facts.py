"""What cgroup v2's CPU pressure (PSI) holds beside the run delay: throttled time, the wait
behind other processes, or both.

    sudo .venv/bin/python bench/psi_facts.py --save bench/results/psi-facts.json

The kubelet's ``container_pressure_cpu_waiting_seconds_total`` (Kubernetes 1.36, cgroup v2)
is the cgroup's ``cpu.pressure`` "some" line: wall time in which at least one of its
threads waited for a CPU. These machines run cgroup v1 for the CPU controller, with a
cgroup2 hierarchy (``/sys/fs/cgroup/unified``) that has no controllers but keeps PSI per
cgroup (the kernel runs with ``psi=1``): a process put in a v1 cgroup with a quota and in
a v2 cgroup of its own is throttled by the first and its pressure read in the second.

Busy threads in a fresh cgroup for ``--seconds`` (2 s), pinned to one CPU: no limit or
0.5 CPU, alone or beside a busy process pinned to the same CPU (outside the cgroup), one
thread or two. Each reports usage, throttled time, the threads' run delay
(``unthrottle.cgroups.waits``) and the v2 cgroup's ``cpu.pressure`` some and full over the
same span. docs/recommend.md ("Busy nodes") says what follows from it.
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
UNIFIED = Path("/sys/fs/cgroup/unified")


def pressure(folder: Path) -> dict[str, int]:
    """``{"some": µs, "full": µs}``: the totals of a cgroup's ``cpu.pressure``."""
    out = {}
    for line in (folder / "cpu.pressure").read_text().splitlines():
        kind, *fields = line.split()
        out[kind] = int(dict(f.split("=") for f in fields)["total"])
    return out


def case(quota_us: int | None, beside: bool, threads: int, seconds: float, cpu: int
         ) -> dict[str, Any]:  # fmt: skip
    """Busy threads' usage, throttled time, run delay and PSI over ``seconds``."""
    layout = detect_layout()
    cg = Cgroup(layout, f"unthrottle-bench-psi-{os.getpid()}")
    v2 = UNIFIED / f"unthrottle-bench-psi-{os.getpid()}"
    cg.create()
    v2.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cg.write_bandwidth(Bandwidth(quota_us, 100_000))
        for _ in range(threads):
            thread = subprocess.Popen(["taskset", "-c", str(cpu), *SPIN])
            procs.append(thread)
            cg.add_process(thread.pid)
            (v2 / "cgroup.procs").write_text(str(thread.pid))
        if beside:
            procs.append(subprocess.Popen(["taskset", "-c", str(cpu), *SPIN]))
        time.sleep(0.3)
        waits = WaitReader(layout, cg.path)
        s0, w0, p0, t0 = cg.read_stat(), waits.wait_us(), pressure(v2), time.monotonic()
        time.sleep(seconds)
        s1, w1, p1, t1 = cg.read_stat(), waits.wait_us(), pressure(v2), time.monotonic()
        waits.close()
        delta = s1 - s0
        return {
            "limit": "no limit" if quota_us is None else f"{quota_us / 100_000:g} CPU",
            "beside": "a busy process on its CPU" if beside else "alone on its CPU",
            "threads": threads,
            "wall_s": round(t1 - t0, 3),
            "usage_s": round(delta.usage_us / 1e6, 3),
            "throttled_s": round(delta.throttled_us / 1e6, 3),
            "run_delay_s": round((w1 - w0) / 1e6, 3),
            "psi_some_s": round((p1["some"] - p0["some"]) / 1e6, 3),
            "psi_full_s": round((p1.get("full", 0) - p0.get("full", 0)) / 1e6, 3),
        }
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        cg.remove()
        v2.rmdir()


def table(cases: list[dict[str, Any]]) -> str:
    """The Markdown table docs/benchmarks.md §4 quotes."""
    lines = ["| limit | beside | threads | usage s | throttled s | run delay s | PSI some s "
             "| PSI full s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        lines.append(f"| {c['limit']} | {c['beside']} | {c['threads']} | {c['usage_s']:.2f} "
                     f"| {c['throttled_s']:.2f} | {c['run_delay_s']:.2f} "
                     f"| {c['psi_some_s']:.2f} | {c['psi_full_s']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU all are pinned to")
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    if not (UNIFIED / "cgroup.procs").exists():
        print(f"no cgroup2 hierarchy at {UNIFIED}: nothing to read PSI from")
        return 1
    cases = [case(q, b, n, args.seconds, args.cpu)
             for n in (1, 2) for b in (False, True) for q in (None, 50_000)]  # fmt: skip
    print(table(cases))
    if args.save:
        args.save.write_text(json.dumps({
            "measured": datetime.date.today().isoformat(),
            "command": f"bench/psi_facts.py --seconds {args.seconds:g} --cpu {args.cpu}",
            "kernel": platform.release(),
            "cases": cases,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
