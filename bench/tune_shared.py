"""`lab tune` on a shared node: the first answer and its range against the kernel's minimum.

    sudo .venv/bin/python bench/tune_shared.py --spread 5 \
        --save bench/results/tune-shared.json

For each scenario whose first run has other threads beside it (default: the request pool
beside one busy thread, ``tune-open-pool-neighbour``, and the busy thread beside two,
``tune-serial-busy``): ``lab tune`` (Auto, the CLI's policy, isolated) ``--tunes`` times,
each first answer with its limit range and expected throttle ratio range, and the ratio
the kernel measured under it beside the same threads. Then, beside the same threads:

- the **kernel's minimum**: the smallest limit (10m steps) whose measured ratio meets the
  target, binary-searched, once without burst and once with the first answer's burst
  as a share of its quota (as bench/tune_sweep.py); the smaller is the minimum;
- the **kernel's spread**: the first answer of the first tune run ``--spread`` times more,
  and the minimum without burst as many times (where the ratio is sensitive to the
  limit), the measured ratios' range.

Issue 41's goal: the first answer within 1.25 × the minimum, or the top of a range whose
bottom is (min / 1.25 ≤ bottom ≤ 1.25 × min); the measured ratio inside the expected range
widened by the spread. docs/benchmarks.md §4 ("Shared nodes") quotes the tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

from unthrottle.cgroups import detect_layout
from unthrottle.recommend import Policy
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import Scenario, load_scenario
from unthrottle_lab.tune import spec_for, throttle_ratio, tune

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "scenarios" / "tune-open-pool-neighbour.yaml",
           ROOT / "scenarios" / "tune-serial-busy.yaml"]  # fmt: skip
GOAL = 1.25
OPTIONS = LabOptions(isolate=True)


def policy(target: float) -> Policy:
    """``lab tune``'s policy (cli/main.py): Auto, 10 % headroom, no step limits."""
    return Policy(target_ratio=target, min_millicores=10, max_millicores=64_000,
                  max_step_up=100.0, max_step_down=0.01)  # fmt: skip


def measured(scenario: Scenario, millicores: int, burst_us: int) -> dict[str, Any]:
    """One run beside the scenario's other threads: its ratio and counts."""
    first = scenario.runs[0]
    spec = spec_for(millicores, burst_us, first.bandwidth().period_us, first.other_threads)
    fig = run_run(scenario.workload.to_workload(), spec, detect_layout(), OPTIONS)
    return {"limit_millicores": millicores, "burst_us": burst_us,
            "throttle_ratio": throttle_ratio(fig), "nr_periods": fig.stat.nr_periods,
            "nr_throttled": fig.stat.nr_throttled,
            "lost_ms": fig.extra.get("lost_ms", 0.0)}  # fmt: skip


def minimum(scenario: Scenario, target: float, share: float, hi: int) -> dict[str, Any]:
    """The smallest limit (10m steps, up to ``hi``) meeting the target beside the same
    threads, each with a burst of ``share`` × its quota; every run tried, kept."""
    period = scenario.runs[0].bandwidth().period_us
    tried = []
    lo = 100
    while lo < hi:
        mid = max(lo, (lo + hi) // 2 // 10 * 10)
        run = measured(scenario, mid, round(mid * period / 1000 * share))
        tried.append(run)
        if run["throttle_ratio"] <= target:
            hi = mid
        else:
            lo = mid + 10
    return {"burst_share": share, "limit_millicores": hi, "tried": tried}


def quota_end(reasons: list[str]) -> int | None:
    """What the answer's reason says the container asks for beside the same neighbours
    (usage + throttled time: ``about 850m asked``); None without a shared node's reason."""
    found = re.search(r"about (\d+)m asked", " ".join(reasons))
    return int(found.group(1)) if found else None


def one(path: Path, target: float, tunes: int, spread: int) -> dict[str, Any]:
    scenario = load_scenario(path)
    answers = []
    for _ in range(tunes):
        result = tune(scenario, detect_layout(), policy(target), OPTIONS, with_baselines=False)
        rec = result.recommendation
        answers.append({
            "before_ratio": throttle_ratio(result.before),
            "before_wait_ms": result.before.stat.wait_us / 1000,
            "before_throttled_ms": result.before.stat.throttled_us / 1000,
            "limit_millicores": rec.limit_millicores, "burst_us": rec.burst_us,
            "lower_limit_millicores": rec.lower_limit_millicores,
            "expected_throttle_ratio": rec.expected_throttle_ratio,
            "expected_throttle_ratio_range": rec.expected_throttle_ratio_range,
            "measured_ratio": throttle_ratio(result.after),
            "refined_millicores": None if result.refined is None
            else result.refined.recommendation.limit_millicores,
            "refined_ratio": None if result.refined is None
            else throttle_ratio(result.refined.after),
            "quota_end_millicores": quota_end(rec.reasons),
            "reasons": rec.reasons,
        })  # fmt: skip
    first = answers[0]
    again = [measured(scenario, first["limit_millicores"], first["burst_us"])
             for _ in range(spread)]  # fmt: skip
    ratios = [first["measured_ratio"], *(r["throttle_ratio"] for r in again)]
    top = max(a["limit_millicores"] for a in answers)
    share = first["burst_us"] / (first["limit_millicores"] * 100) if first["burst_us"] else 0.0
    sweeps = [minimum(scenario, target, 0.0, round(top * 1.5))]
    if share:
        sweeps.append(minimum(scenario, target, share, round(top * 1.5)))
    # where the ratio is sensitive: the no-burst minimum, run again
    edge = [measured(scenario, sweeps[0]["limit_millicores"], 0) for _ in range(spread)]
    at_edge = [r["throttle_ratio"] for r in edge]
    return {"scenario": scenario.name, "other_threads": scenario.runs[0].other_threads,
            "answers": answers, "spread": {"runs": again, "low": min(ratios),
                                           "high": max(ratios)},
            "spread_at_minimum": {"runs": edge, "low": min(at_edge), "high": max(at_edge)},
            "sweeps": sweeps,
            "minimum_millicores": min(s["limit_millicores"] for s in sweeps)}  # fmt: skip


def over(limit: int | None, mins: list[int]) -> str:
    """``1.42 / 0.97``: a limit over each of the kernel's minimums."""
    return "–" if limit is None else " / ".join(f"{limit / m:.2f}" for m in mins)


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md §4 ("Shared nodes"): each first answer, its
    range's bottom and the quota's end, against the kernel's minimum without burst and with
    the first answer's burst share."""
    lines = ["| scenario | first answer | bottom | beside the same (quota's end) "
             "| expected ratio | measured | kernel minimum, no burst / with its burst share "
             "| first / min | bottom / min | quota's end / min |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        mins = [s["limit_millicores"] for s in row["sweeps"]]
        floors = "/".join(f"{m}m" for m in mins)
        for a in row["answers"]:
            top, bottom, end = (a["limit_millicores"], a["lower_limit_millicores"],
                                a["quota_end_millicores"])  # fmt: skip
            low, high = a["expected_throttle_ratio_range"] or (a["expected_throttle_ratio"],) * 2

            lines.append(
                f"| {row['scenario']} | {top}m + {a['burst_us'] / 1000:g} ms "
                f"| {'–' if bottom is None else f'{bottom}m'} "
                f"| {'–' if end is None else f'{end}m'} | {low:.3f}–{high:.3f} "
                f"| {a['measured_ratio']:.3f} | {floors} | {over(top, mins)} "
                f"| {over(bottom, mins)} | {over(end, mins)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--tunes", type=int, default=3)
    parser.add_argument("--spread", type=int, default=4)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    rows = [one(p, args.target, args.tunes, args.spread) for p in args.scenarios]
    print(table(rows))
    for row in rows:
        edge = row["spread_at_minimum"]
        print(f"{row['scenario']}: the kernel's spread at the first answer "
              f"{row['spread']['low']:.3f}–{row['spread']['high']:.3f}, at the minimum "
              f"without burst {edge['low']:.3f}–{edge['high']:.3f}")  # fmt: skip
    if args.save:
        saved = {"measured": datetime.date.today().isoformat(),
                 "command": f"sudo .venv/bin/python bench/tune_shared.py --tunes {args.tunes} "
                 f"--spread {args.spread} --save bench/results/tune-shared.json",
                 "rows": rows}  # fmt: skip
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
