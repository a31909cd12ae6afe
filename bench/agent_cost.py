"""What the agent costs: sampling 200 real cgroups every 100 ms, and rendering a scrape.

    sudo .venv/bin/python bench/agent_cost.py [--cgroups 200] [--seconds 10]

Creates N idle cgroups with a quota below unthrottle-bench-PID (removed at the
end), samples them in this process for S seconds and reports the process's CPU
time as a share of one core (goal ≤ 1 %). Then renders /metrics for all of them
50 times and reports CPU per container per scrape (goal ≤ 0.2 ms).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from unthrottle.agent.discovery import discover_standalone
from unthrottle.agent.exposition import render
from unthrottle.agent.sampling import Sampler
from unthrottle.cfs import Bandwidth
from unthrottle.cgroups import Cgroup, detect_layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroups", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    layout = detect_layout()
    root = Cgroup(layout, f"unthrottle-bench-{os.getpid()}")
    children = [Cgroup(layout, f"{root.path}/c{i:03d}") for i in range(args.cgroups)]
    root.create()
    try:
        for cg in children:
            cg.create()
            cg.write_bandwidth(Bandwidth(50_000))
        sampler = Sampler(layout, lambda known: discover_standalone(layout, root.path, known))
        sampler.refresh()
        assert len(sampler.series) == args.cgroups
        stop = threading.Event()
        thread = threading.Thread(target=sampler.run, args=(stop,))
        cpu0, wall0 = time.process_time(), time.monotonic()
        thread.start()
        time.sleep(args.seconds)
        stop.set()
        thread.join()
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        print(f"sampling {args.cgroups} cgroups every 100 ms for {wall:.1f} s: "
              f"{sampler.windows} windows, CPU {cpu:.3f} s = {100 * cpu / wall:.2f} % of one core "
              f"(goal ≤ 1 %); {1e6 * cpu / sampler.windows / args.cgroups:.1f} µs per cgroup "
              "per window (includes the periodic rediscovery)")  # fmt: skip
        render(sampler.snapshot())  # warm up
        cpu0 = time.process_time()
        for _ in range(50):
            body = render(sampler.snapshot())  # reads every cgroup's counters, as a scrape does
        per = (time.process_time() - cpu0) / 50
        lines = body.count(b"\n")
        print(f"rendering /metrics for {args.cgroups} containers: {1000 * per:.2f} ms CPU per "
              f"scrape = {1000 * per / args.cgroups:.3f} ms per container (goal ≤ 0.2 ms); "
              f"{len(body) // 1024} KiB, {lines} lines")  # fmt: skip
        sampler.close()
    finally:
        for cg in reversed(children):
            cg.remove()
        root.remove()


if __name__ == "__main__":
    main()
