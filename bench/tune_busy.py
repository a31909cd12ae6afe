"""`lab tune` on a busy node: the recommendation with and without the wait, each proven.

    sudo .venv/bin/python bench/tune_busy.py --save bench/results/tune-busy.json

One thread with 50 ms tasks back to back (``scenarios/tune-serial-busy.yaml``),
throttled today at 0.4 CPU, measured on a quiet machine and beside two busy
threads of other processes (both cores busy, each thread in a cgroup of its own),
each run isolated from the rest of the machine's load. From each measurement, two
recommendations (LimitOnly, the default 10 % headroom, target 0.05): from usage +
throttled time, as before issue 21, and from usage + the larger of throttled time
and wait. Each is then run under the same contention as the measurement it came
from, and on a quiet node (where the thread gets a core of its own, as when the
node's load moves away). docs/benchmarks.md §4 quotes the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import detect_layout
from unthrottle.recommend import PeriodEvidence, Policy, Strategy, recommend
from unthrottle_lab.runner import LabOptions, run_run, run_sampled
from unthrottle_lab.scenario import load_scenario
from unthrottle_lab.tune import current_of, evidence_of, spec_for

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "tune-serial-busy.yaml"
POLICY = Policy(strategy=Strategy.LIMIT_ONLY, max_step_up=100, min_millicores=10)


def node(other_threads: int) -> dict[str, Any]:
    """Measure at today's limit beside ``other_threads``; recommend both ways; prove each."""
    scenario = load_scenario(SCENARIO)
    layout, options = detect_layout(), LabOptions(isolate=True)
    workload = scenario.workload.to_workload()
    today = scenario.runs[0].model_copy(update={"other_threads": other_threads})
    before, samples = run_sampled(workload, today, layout, options)
    current = current_of(today)
    ratio = before.stat.throttle_ratio
    seen = before.stat
    out: dict[str, Any] = {
        "other_threads": other_threads,
        "today": {
            "cpus": today.cpus,
            "throttled_ms": seen.throttled_us / 1000,
            "wait_ms": seen.wait_us / 1000,
            "usage_ms": seen.usage_us / 1000,
            "throttle_ratio": ratio,
        },
    }
    blind = PeriodEvidence(
        samples.usage_us + samples.throttled_us, samples.period_us, observed_throttle_ratio=ratio
    )
    ways = (("usage + throttled", blind), ("with the wait", evidence_of(samples, ratio)))
    for name, evidence in ways:
        rec = recommend(evidence, current, POLICY)
        assert rec.limit_millicores is not None
        spec = spec_for(rec.limit_millicores, rec.burst_us, current.period_us, other_threads)
        after = run_run(workload, spec, layout, options).stat
        # the same limit once the node is quiet: the thread then gets a core of its own
        calm = spec_for(rec.limit_millicores, rec.burst_us, current.period_us)
        quiet = run_run(workload, calm, layout, options).stat
        out[name] = {
            "limit_millicores": rec.limit_millicores,
            "after_throttle_ratio": after.throttle_ratio,
            "after_periods": after.nr_periods,
            "after_throttled": after.nr_throttled,
            "quiet_throttle_ratio": quiet.throttle_ratio,
            "quiet_periods": quiet.nr_periods,
            "quiet_throttled": quiet.nr_throttled,
        }
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md §4 ("Busy nodes")."""
    cpus = rows[0]["today"]["cpus"]
    lines = [f"| node | throttled ms seen at {cpus} CPU | wait ms | sized from | recommended "
             "| throttled after, same node | throttled after, node quiet |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        label = "quiet" if not row["other_threads"] else "both cores busy"
        today = row["today"]
        for name in ("usage + throttled", "with the wait"):
            r = row[name]
            lines.append(
                f"| {label} | {today['throttled_ms']:,.0f} | {today['wait_ms']:,.0f} | {name} "
                f"| {r['limit_millicores']}m | {r['after_throttle_ratio']:.0%} "
                f"({r['after_throttled']} of {r['after_periods']}) "
                f"| {r['quiet_throttle_ratio']:.0%} "
                f"({r['quiet_throttled']} of {r['quiet_periods']}) |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    rows = [node(0), node(2)]
    print(table(rows))
    if args.save:
        saved = {
            "measured": datetime.date.today().isoformat(),
            "command": "sudo .venv/bin/python bench/tune_busy.py --save "
            "bench/results/tune-busy.json",
            "rows": rows,
        }
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
