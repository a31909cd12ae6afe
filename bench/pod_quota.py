"""One container under a pod-level quota equal to its own, against the same container with
no pod quota (README "Requirements and limits", "Pod-level quota is not seen").

    sudo .venv/bin/python bench/pod_quota.py --repeats 3 --save bench/results/pod-quota.json

The demo's batch (``scenarios/tune-batch-parallel.yaml`` with 80 tasks, as ``make demo``
runs it: two parallel 60 ms tasks per round) at 1 CPU, in a container cgroup made as a
kubelet makes one (cgroupfs driver): below a pod cgroup that has, or has not, a quota of
its own, the sum of its containers' limits (here the one container's, 1 CPU). Each run is
isolated (the machine's other processes in the root cgroup at idle priority while it
measures). Saved per run: the container's throttled time and throttle ratio, which is
what the agent and cAdvisor export for it, and the pod cgroup's throttled time, which
they do not count in the container's demand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import Cgroup, Layout, detect_layout
from unthrottle.units import Bandwidth
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
BATCH = ROOT / "scenarios" / "tune-batch-parallel.yaml"
TASKS = 80  # as demo/loop.py's apps() runs the batch
ONE_CPU = Bandwidth(100_000, 100_000)


def one_run(layout: Layout, *, pod_quota: bool) -> dict[str, Any]:
    """The batch once, in a fresh pod cgroup (with or without its quota) and container."""
    scenario = load_scenario(BATCH)
    workload = scenario.workload.model_copy(update={"tasks": TASKS}).to_workload()
    pod = Cgroup(layout, f"unthrottle-bench-{os.getpid()}-pod")
    container = Cgroup(layout, f"{pod.path}/container")
    pod.create()
    try:
        if pod_quota:
            pod.write_bandwidth(ONE_CPU)
        container.create()
        try:
            container.write_bandwidth(ONE_CPU)
            before = pod.read_stat()
            options = LabOptions(cgroup_name=container.path, existing_cgroup=True, isolate=True)
            figures = run_run(workload, None, layout, options)
            pod_stat = pod.read_stat() - before
        finally:
            container.remove()
    finally:
        pod.remove()
    return {
        "pod_quota": pod_quota,
        "container_throttled_s": round(figures.stat.throttled_us / 1e6, 2),
        "container_throttle_ratio": round(figures.stat.throttle_ratio, 2),
        "pod_throttled_s": round(pod_stat.throttled_us / 1e6, 2),
        "wall_s": round(figures.wall_ms / 1000, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    layout = detect_layout()
    with OtherLoad() as noise:
        runs = [one_run(layout, pod_quota=quota)
                for _ in range(args.repeats) for quota in (False, True)]  # fmt: skip
    for run in runs:
        print(json.dumps(run))
    print(f"other load: {noise.cores:.2f} cores")
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(),
                 "command": f"sudo .venv/bin/python bench/pod_quota.py --repeats {args.repeats} "
                            "--save bench/results/pod-quota.json",
                 "other_load_cores": round(noise.cores, 2), "runs": runs}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
