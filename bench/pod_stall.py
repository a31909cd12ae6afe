"""The stall under a pod-level quota: the container's counters, its pod's, its threads' wait.

Against the same container with no pod quota (docs/model.md, "The pod level"; README
"Limits").

    sudo flock /tmp/unthrottle-heavy.lock .venv/bin/python bench/pod_stall.py --repeats 4 \\
        --save bench/results/pod-stall.json

The demo's batch (``scenarios/tune-batch-parallel.yaml``: two parallel 60 ms tasks per
round, back to back) at 1 CPU, ``--rounds`` rounds, run by the lab as ``lab tune`` runs
today's settings (sampled every period of the container's calibrated grid, workers
pinned, the machine's other processes at idle priority), once in a plain cgroup and once
with ``pod_quota: true`` (a pod cgroup whose quota is the same 1 CPU, no burst, as a
kubelet makes a one-container pod). Saved per run: the container's throttled time, the
pod's, their sum, the threads' wait (schedstat run delay), where the run started on the
container's grid and on the pod's, and what the engine recommends (Auto, target 0.05,
as ``lab tune`` asks) from the samples: with the wait read and the pod's throttled time
added to the container's (the sum, uncapped), with the wait and without the pod's, and
from the counters alone (no wait, as cAdvisor's series are) with and without the pod's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from unthrottle.cgroups import detect_layout
from unthrottle.recommend import Policy, recommend
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_sampled
from unthrottle_lab.sampling import PeriodSamples
from unthrottle_lab.scenario import RunSpec, load_scenario
from unthrottle_lab.tune import current_of, evidence_of

ROOT = Path(__file__).resolve().parent.parent
BATCH = ROOT / "scenarios" / "tune-batch-parallel.yaml"


def recommended(samples: PeriodSamples, ratio: float, spec: RunSpec) -> int | None:
    """The engine's limit from a run's samples, as ``lab tune`` asks for it."""
    policy = Policy(target_ratio=0.05, min_millicores=10, max_millicores=64_000,
                    max_step_up=100.0, max_step_down=0.01)  # fmt: skip
    return recommend(evidence_of(samples, ratio), current_of(spec), policy).limit_millicores


def one_run(rounds: int, *, pod_quota: bool) -> dict[str, Any]:
    """The batch once, sampled, with or without the pod quota."""
    scenario = load_scenario(BATCH)
    workload = scenario.workload.model_copy(update={"tasks": rounds}).to_workload()
    spec = RunSpec(cpus=1, pod_quota=pod_quota)
    options = LabOptions(isolate=True, pin=True)
    figures, samples = run_sampled(workload, spec, detect_layout(), options)
    pod = figures.extra.get("pod") or {}
    # The evidence with the pod's throttled time added to the container's (the sum, not
    # capped by the wait), without it, and the counters alone (no wait, as cAdvisor's series
    # give them): with and without the pod's throttled time counted.
    pod_added = samples.throttled_us + (
        samples.pod_throttled_us if samples.pod_throttled_us is not None else 0
    )
    summed = PeriodSamples(samples.usage_us, pod_added, samples.period_us, samples.wait_us,
                           samples.threads)  # fmt: skip
    own_only = PeriodSamples(samples.usage_us, samples.throttled_us, samples.period_us,
                             samples.wait_us, samples.threads)  # fmt: skip
    counters = PeriodSamples(samples.usage_us, samples.throttled_us, samples.period_us,
                             pod_throttled_us=samples.pod_throttled_us)  # fmt: skip
    counters_own = PeriodSamples(samples.usage_us, samples.throttled_us, samples.period_us)
    pod_s = (samples.pod_throttled_us.sum() if samples.pod_throttled_us is not None else 0) / 1e6
    stalled = samples.stalled_us
    wait = samples.wait_us if samples.wait_us is not None else np.zeros_like(stalled)
    ratio = figures.stat.throttle_ratio
    return {
        "pod_quota": pod_quota,
        "container_throttled_s": round(figures.stat.throttled_us / 1e6, 3),
        "container_throttle_ratio": round(ratio, 3),
        "pod_throttled_s": round(pod.get("throttled_ms", 0.0) / 1000, 3),
        "pod_throttle_ratio": pod.get("throttle_ratio", 0.0),
        "sum_throttled_s": round(
            figures.stat.throttled_us / 1e6 + pod.get("throttled_ms", 0.0) / 1000, 3
        ),
        "wait_s": round(figures.stat.wait_us / 1e6, 3),
        "sampled_pod_throttled_s": round(float(pod_s), 3),
        "windows_wait_below_sum": int(np.count_nonzero(wait < 0.9 * stalled)),
        "windows": int(stalled.size),
        "period_phase_ms": figures.extra.get("period_phase_ms"),
        "pod_period_phase_ms": figures.extra.get("pod_period_phase_ms"),
        "recommended_millicores": recommended(summed, ratio, spec),
        "recommended_without_pod_millicores": recommended(own_only, ratio, spec),
        "counters_recommended_millicores": recommended(counters, ratio, spec),
        "counters_recommended_without_pod_millicores": recommended(counters_own, ratio, spec),
        "wall_s": round(figures.wall_ms / 1000, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    with OtherLoad() as noise:
        runs = []
        for _ in range(args.repeats):
            for quota in (False, True):
                runs.append(one_run(args.rounds, pod_quota=quota))
                print(json.dumps(runs[-1]), flush=True)
    print(f"other load: {noise.cores:.2f} cores")
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(),
                 "command": "sudo flock /tmp/unthrottle-heavy.lock .venv/bin/python "
                            f"bench/pod_stall.py --repeats {args.repeats} --rounds {args.rounds} "
                            "--save bench/results/pod-stall.json",
                 "other_load_cores": round(noise.cores, 2), "runs": runs}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
