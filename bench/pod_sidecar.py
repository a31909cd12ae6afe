"""A two-container pod in the lab: ``lab run`` of the demo's batch beside a sidecar, and
``lab tune`` of it (issue 28 §1; docs/model.md, "The pod level").

    sudo .venv/bin/python bench/pod_sidecar.py --repeats 3 --save bench/results/pod-sidecar.json

``scenarios/pod-sidecar-batch.yaml`` (the batch at 1 CPU beside a sidecar at 0.2, the pod
1.2; then 2 CPUs and 0.5, the pod 2.5) and ``scenarios/tune-batch-sidecar.yaml`` (its first
run tuned), each run isolated and with the batch's workers pinned, as the kernel tests
measure. Saved per run: each container's and the pod's counters; per tune: each
container's answer and the ratios of each container and the pod after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import detect_layout
from unthrottle.recommend import Policy
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.runner import LabOptions, run_scenario
from unthrottle_lab.scenario import load_scenario
from unthrottle_lab.tune import TuneResult, tune

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "scenarios" / "pod-sidecar-batch.yaml"
TUNE = ROOT / "scenarios" / "tune-batch-sidecar.yaml"
OPTIONS = LabOptions(isolate=True, pin=True)
POLICY = Policy(target_ratio=0.05, headroom=0.10, min_millicores=10, max_millicores=64_000,
                max_step_up=100.0, max_step_down=0.01)  # fmt: skip
"""As ``lab tune``'s defaults (cli/main.py)."""


def levels(figures: RunFigures) -> dict[str, Any]:
    """The container's, the sidecar's and the pod's counters of one run."""
    run = figures.to_json()
    side, pod = run["sidecar"], run["pod"]
    return {
        "limit_millicores": round(run["limit"]["cpus"] * 1000),
        "sidecar_limit_millicores": round(side["limit"]["cpus"] * 1000),
        **{f"{name}_{key}": level[key] for name, level in
           (("container", run), ("sidecar", side), ("pod", pod))
           for key in ("nr_periods", "nr_throttled", "throttle_ratio", "throttled_ms",
                       "usage_ms")},
        "container_lost_ms": run["lost_ms"],
        "sidecar_lost_ms": side["lost_ms"],
    }  # fmt: skip


def tuned(result: TuneResult) -> dict[str, Any]:
    """A tune's answer for each container and what came of it."""
    rec, after = result.final
    assert result.sidecar is not None
    side = result.sidecar.refined or result.sidecar.recommendation
    return {
        "before": levels(result.before),
        "recommended_millicores": rec.limit_millicores,
        "sidecar_recommended_millicores": side.limit_millicores,
        "refined": result.refined is not None,
        "after": levels(after),
        "baselines": [levels(b.after) | {"name": b.name} for b in result.baselines],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    layout = detect_layout()
    runs, tunes = [], []
    with OtherLoad() as noise:
        for _ in range(args.repeats):
            runs += [levels(f) for f in run_scenario(load_scenario(RUNS), layout, OPTIONS)]
            tunes.append(tuned(tune(load_scenario(TUNE), layout, POLICY, OPTIONS)))
    for item in [*runs, *tunes]:
        print(json.dumps(item))
    print(f"other load: {noise.cores:.2f} cores")
    if args.save:
        command = (f"sudo .venv/bin/python bench/pod_sidecar.py --repeats {args.repeats} "
                   "--save bench/results/pod-sidecar.json")  # fmt: skip
        saved = {"measured": datetime.date.today().isoformat(), "command": command,
                 "other_load_cores": round(noise.cores, 2),
                 "runs": runs, "tunes": tunes}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
