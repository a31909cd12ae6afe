"""Peaks in runs against peaks apart: `lab tune` from what the operator reads, on the kernel.

    sudo .venv/bin/python bench/clustered_peaks.py [--repeat 1] \
        [--save bench/results/clustered-peaks.json]

Runs the real command, ``unthrottle-lab tune --json --isolate --pin --no-baselines
--evidence VIEW``, on two scenarios:

- ``scenarios/tune-batch-runs.yaml``: the demo's batch with its peaks in runs of seconds
  (two cores busy for 0.8 s, then a 1.6 s pause), throttled today at one CPU;
- ``scenarios/seed-002-burst.yaml``: seed 002's burst, a 20 ms task every 93 ms, so a
  window now and then holds two, throttled today at 0.25 CPU;

each with ``--evidence agent`` (the agent's histogram and backlog series, as the operator
reads them) and ``--evidence histogram`` (the histogram alone: an agent without the backlog
series, the engine before issue 28 §2). Saved per run: the recommendation (limit, burst,
expected ratio), the throttle ratio the kernel measured under it, and the same for the
refined recommendation where `lab tune` made one. docs/benchmarks.md §4 and the README's
"Limits" quote the file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
SCENARIOS = ("tune-batch-runs", "seed-002-burst")
VIEWS = ("agent", "histogram")


def summary(rec: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "limit_millicores": rec["limit_millicores"],
        "burst_us": rec["burst_us"],
        "expected_throttle_ratio": rec["expected_throttle_ratio"],
        "kernel_throttle_ratio": round(after["throttle_ratio"], 4),
        "nr_periods": after["nr_periods"],
        "nr_throttled": after["nr_throttled"],
    }


def tune(scenario: str, view: str) -> dict[str, Any]:
    path = ROOT / "scenarios" / f"{scenario}.yaml"
    argv = [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", "--pin", "--no-baselines",
            "--evidence", view, str(path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(done.stdout)
    refined = result["refined"]
    return {
        "scenario": scenario,
        "view": view,
        "before_throttle_ratio": round(result["before"]["throttle_ratio"], 4),
        "recommendation": summary(result["recommendation"], result["after"]),
        "refined": None
        if refined is None
        else summary(refined["recommendation"], refined["after"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        for scenario in SCENARIOS:
            for view in VIEWS:
                run = tune(scenario, view)
                final = run["refined"] or run["recommendation"]
                print(f"{scenario} ({view}): {final['limit_millicores']}m, burst "
                      f"{final['burst_us'] / 1000:g} ms, expected "
                      f"{final['expected_throttle_ratio']}, kernel "
                      f"{final['kernel_throttle_ratio']}", flush=True)  # fmt: skip
                runs.append(run)
    if args.save:
        out = {"measured": datetime.date.today().isoformat(),
               "command": "bench/clustered_peaks.py", "target": 0.05, "runs": runs}  # fmt: skip
        args.save.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
