"""Compare the CFS model with the real kernel, run by run.

    python bench/lab_vs_model.py                     # runs the lab (root), then compares
    python bench/lab_vs_model.py --from FILE.jsonl   # compares a saved `lab run --json`

Each run is simulated at the period and tick phase the lab measured for it, on
this machine's cores and HZ. Agreement (issue 2): throttle ratio within ±0.05
absolute, p50 and p95 within 15 % or 3 ms. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from unthrottle.cfs.tasks import DEFAULT_HZ, Machine, simulate_tasks
from unthrottle.lab.kernel import kernel_hz
from unthrottle.model.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def close(measured: float, predicted: float) -> bool:
    """Within 15 % or 3 ms."""
    return abs(measured - predicted) <= max(3.0, 0.15 * measured)


def compare(lab: list[dict[str, Any]], cores: int, hz: int) -> tuple[list[str], int]:
    rows = [
        "| scenario | run | p50 lab / model | p95 lab / model | ratio lab / model "
        "| throttled ms lab / model | agree |",
        "|---|---|---|---|---|---|---|",
    ]
    misses = 0
    by_name = {load_scenario(p).name: load_scenario(p) for p in SCENARIOS}
    for entry in lab:
        scenario = by_name[entry["name"]]
        workload = scenario.workload.to_workload()
        for spec, run in zip(scenario.runs, entry["runs"], strict=True):
            machine = Machine(
                cores=cores,
                hz=run.get("hz") or hz,
                period_phase_us=round((run.get("period_phase_ms") or 0) * 1000),
                tick_phase_us=round((run.get("tick_phase_ms") or 0) * 1000),
            )
            sim = simulate_tasks(workload, spec.bandwidth(), machine).to_json()
            lat, slat = run["latency_ms"], sim["latency_ms"]
            ok = (
                abs(run["throttle_ratio"] - sim["throttle_ratio"]) <= 0.05
                and close(lat["p50"], slat["p50"])
                and close(lat["p95"], slat["p95"])
            )
            misses += not ok
            rows.append(
                f"| {scenario.name} | {spec.label()} "
                f"| {lat['p50']:.1f} / {slat['p50']:.1f} | {lat['p95']:.1f} / {slat['p95']:.1f} "
                f"| {run['throttle_ratio']:.2f} / {sim['throttle_ratio']:.2f} "
                f"| {run['throttled_ms']:.0f} / {sim['throttled_ms']:.0f} "
                f"| {'yes' if ok else 'NO'} |"
            )
    return rows, misses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a saved `lab run --json` file")
    parser.add_argument("--save", type=Path, help="also save the lab's JSON lines here")
    args = parser.parse_args()
    if args.source:
        text = args.source.read_text()
    else:
        exe = Path(sys.executable).with_name("unthrottle")
        out = subprocess.run(
            [str(exe), "lab", "run", "--json", *map(str, SCENARIOS)],
            check=True,
            capture_output=True,
            text=True,
        )
        text = out.stdout
        if args.save:
            args.save.write_text(text)
    lab = [json.loads(line) for line in text.splitlines() if line.strip()]
    rows, misses = compare(lab, len(os.sched_getaffinity(0)), kernel_hz() or DEFAULT_HZ)
    print("\n".join(rows))
    print(f"\n{misses} run(s) outside the tolerance")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
