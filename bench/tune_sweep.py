"""Is our limit no larger than needed? Sweep limits on the kernel and compare.

    sudo .venv/bin/python bench/tune_sweep.py [--target 0.05] [SCENARIO.yaml …]

For each scenario whose first run is throttled (default: scenarios/tune-*.yaml
and seed-002-burst): run `lab tune` (Auto and LimitOnly). Then, on the kernel,
binary-search the smallest limit (10m steps) whose measured throttle ratio
meets the target, without burst, and with the burst ours chose. Goal
(issue 3): our limit ≤ 1.25 × the swept one, and our measured ratio ≤
target + 0.02. Prints a Markdown table; the figures go in docs/benchmarks.md.

A second table (issue 13) sets the first recommendation — made from throttled
evidence, so the top of a range — and the range's bottom against the swept
minimum: how far the first estimate overshoots, and whether the kernel's
minimum lies in the range the reviewer is shown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from unthrottle.cgroups import detect_layout
from unthrottle.recommend import Policy, Strategy
from unthrottle_lab.runner import LabOptions, run_run
from unthrottle_lab.scenario import Scenario, load_scenario
from unthrottle_lab.tune import spec_for, tune

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [*sorted(p for p in (ROOT / "scenarios").glob("tune-*.yaml")
                  # two containers: bench/pod_sidecar.py; beside a neighbour, swept beside
                  # it: bench/tune_shared.py
                  if p.stem not in {"tune-batch-sidecar", "tune-open-pool-neighbour"}),
           ROOT / "scenarios" / "seed-002-burst.yaml"]  # fmt: skip
NOISE = 0.02


def smallest_meeting(scenario: Scenario, target: float, burst_of: object, hi: int) -> int:
    """Smallest limit (10m steps, up to ``hi``) whose measured ratio ≤ target on the kernel."""
    assert callable(burst_of)
    layout, options = detect_layout(), LabOptions()
    workload = scenario.workload.to_workload()
    period = scenario.runs[0].bandwidth().period_us
    lo = 10
    while lo < hi:
        mid = (lo + hi) // 2 // 10 * 10 or 10
        mid = max(lo, mid)
        fig = run_run(workload, spec_for(mid, burst_of(mid), period), layout, options)
        if fig.stat.throttle_ratio <= target:
            hi = mid
        else:
            lo = mid + 10
    return hi


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--target", type=float, default=0.05)
    parser.add_argument("--save", type=Path, help="save the tune results as JSON lines")
    args = parser.parse_args()
    layout = detect_layout()
    rows, ranges, failures, saved = [], [], 0, []
    for path in args.scenarios:
        scenario = load_scenario(path)
        for strategy in (Strategy.AUTO, Strategy.LIMIT_ONLY):
            policy = Policy(target_ratio=args.target, strategy=strategy, min_millicores=10,
                            max_millicores=64_000, max_step_up=100, max_step_down=0.01)  # fmt: skip
            result = tune(scenario, layout, policy, with_baselines=strategy is Strategy.AUTO)
            saved.append({"strategy": strategy.value, **result.to_json()})
            rec, after = result.final
            first = result.recommendation
            assert rec.limit_millicores is not None
            hi = max(rec.limit_millicores * 2, 100)
            ratio = rec.burst_us / rec.quota_us if rec.quota_us else 0.0
            swept = smallest_meeting(
                scenario,
                args.target,
                lambda m, r=ratio, p=rec.period_us: round(m * p / 1000 * r),
                hi,
            )
            ok = (rec.limit_millicores <= 1.25 * swept
                  and after.stat.throttle_ratio <= args.target + NOISE)  # fmt: skip
            failures += not ok
            base = "; ".join(
                f"{b.name} {b.limit_millicores}m → {b.after.stat.throttle_ratio:.2f}"
                for b in result.baselines
            )
            burst_ms = rec.burst_us / 1000
            ours = f"{first.limit_millicores}m → {rec.limit_millicores}m + {burst_ms:g} ms"
            verdict = "yes" if ok else "NO"
            # The range claims to hold what the demand itself asks for: the refined
            # recommendation, from the unthrottled run (another run: noise of a few %).
            # The kernel's minimum has no headroom; it is set beside it for scale.
            top, bottom = first.limit_millicores or 0, first.lower_limit_millicores
            low = top if bottom is None else bottom
            refined = rec.limit_millicores
            ranges.append(
                f"| {scenario.name} | {strategy.value} | {result.before.stat.throttle_ratio:.2f} "
                f"| {'–' if bottom is None else f'{bottom}m'} | {top}m | {refined}m "
                f"| {'yes' if low <= refined <= top else f'NO ({refined / top:.2f} × top)'} "
                f"| {swept}m | {'yes' if low <= swept <= top else 'NO'} | {top / swept:.2f} |"
            )
            rows.append(
                f"| {scenario.name} | {strategy.value} | {result.before.stat.throttle_ratio:.2f} "
                f"| {ours} | {after.stat.throttle_ratio:.3f} | {swept}m "
                f"| {rec.limit_millicores / swept:.2f} | {base or '-'} | {verdict} |"
            )
    print("| scenario | strategy | ratio today | ours (first → refined) | ratio after "
          "| swept minimum | ours / swept | baselines (limit → ratio after) "
          "| meets goal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("| scenario | strategy | ratio today | range bottom | first (top) "
          "| refined | refined in range | kernel minimum | minimum in range "
          "| first / minimum |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(ranges))
    if args.save:
        args.save.write_text("".join(json.dumps(s) + "\n" for s in saved))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
