"""Does the run delay hold the pod's throttled time? (issue 28 §1, the agent's demand)

    sudo .venv/bin/python bench/pod_wait.py --save bench/results/pod-wait.json

The agent's per-window demand is usage + max(throttled, wait) (``agent/sampling.py``
``window_demand_us``), the wait being the container's threads' schedstat run delay
(``cgroups/waits.py``). When the pod cgroup's quota runs out first, the container's own
``throttled_time`` does not move; this measures whether the run delay does. One busy
thread pinned to one CPU in a container cgroup below a pod cgroup (as a kubelet makes
them, cgroupfs driver) for ``--seconds`` (2 s), three ways: the pod at 0.5 CPU and the
container without a quota (only the pod throttles), both at 0.5 CPU (a one-container pod
as the kubelet makes it), and the container at 0.5 CPU in a pod without a quota (the
reference: wait_facts.py's case). Each reports the container's usage and throttled time,
the pod's throttled time and the thread's run delay over the same span. Cgroups and
processes are removed by PID after each case.
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
HALF = 50_000
CASES = (  # (pod quota µs, container quota µs), period 100 ms
    (HALF, None),
    (HALF, HALF),
    (None, HALF),
)


def case(pod_quota: int | None, quota: int | None, seconds: float, cpu: int) -> dict[str, Any]:
    """One thread's usage, throttled times (its container's, its pod's) and run delay."""
    layout = detect_layout()
    pod = Cgroup(layout, f"unthrottle-bench-podwait-{os.getpid()}")
    container = Cgroup(layout, f"{pod.path}/container")
    pod.create()
    container.create()
    thread = None
    try:
        pod.write_bandwidth(Bandwidth(pod_quota, 100_000))
        container.write_bandwidth(Bandwidth(quota, 100_000))
        thread = subprocess.Popen(["taskset", "-c", str(cpu), *SPIN])
        container.add_process(thread.pid)
        time.sleep(0.3)
        waits = WaitReader(layout, container.path)
        c0, p0, w0, t0 = container.read_stat(), pod.read_stat(), waits.wait_us(), time.monotonic()
        time.sleep(seconds)
        c1, p1, w1, t1 = container.read_stat(), pod.read_stat(), waits.wait_us(), time.monotonic()
        waits.close()
        own, of_pod = c1 - c0, p1 - p0
        return {
            "pod": "no quota" if pod_quota is None else f"{pod_quota / 100_000:g} CPU",
            "container": "no quota" if quota is None else f"{quota / 100_000:g} CPU",
            "wall_s": round(t1 - t0, 3),
            "usage_s": round(own.usage_us / 1e6, 3),
            "container_throttled_s": round(own.throttled_us / 1e6, 3),
            "pod_throttled_s": round(of_pod.throttled_us / 1e6, 3),
            "run_delay_s": round((w1 - w0) / 1e6, 3),
        }
    finally:
        if thread is not None:
            thread.kill()
            thread.wait()
        container.remove()
        pod.remove()


def table(cases: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md ("The pod's throttled time and the run delay")."""
    lines = ["| pod quota | container quota | usage s | container throttled s "
             "| pod throttled s | run delay s |", "|---|---|---|---|---|---|"]  # fmt: skip
    for c in cases:
        lines.append(f"| {c['pod']} | {c['container']} | {c['usage_s']:.2f} "
                     f"| {c['container_throttled_s']:.2f} | {c['pod_throttled_s']:.2f} "
                     f"| {c['run_delay_s']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU the thread is pinned to")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    cases = [case(p, q, args.seconds, args.cpu) for _ in range(args.repeats) for p, q in CASES]
    print(table(cases))
    if args.save:
        args.save.write_text(json.dumps({
            "measured": datetime.date.today().isoformat(),
            "command": f"bench/pod_wait.py --seconds {args.seconds:g} --cpu {args.cpu} "
                       f"--repeats {args.repeats}",
            "kernel": platform.release(),
            "layout": str(detect_layout().version),
            "cases": cases,
        }, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
