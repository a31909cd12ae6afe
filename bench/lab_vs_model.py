"""Compare the CFS model with the real kernel, run by run.

    python bench/lab_vs_model.py                     # runs the lab (root), then compares
    python bench/lab_vs_model.py --from FILE.jsonl   # compares a saved `lab run --json`

Each run is simulated at the period and tick phase the lab measured for it, on
this machine's cores and HZ (unthrottle.lab.agreement). Prints a Markdown table,
and how busy the rest of the machine was while the lab measured: latencies are
a measurement only on a quiet machine (unthrottle.lab.noise), which is why the
latency agreement lives here and not in a pass/fail test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from unthrottle.cfs.figures import CpuStatDelta, Latency, RunFigures
from unthrottle.lab.agreement import RATIO_TOLERANCE, compare
from unthrottle.lab.noise import QUIET_CORES, OtherLoad
from unthrottle.model.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("seed-*.yaml"))
_FIGURE_KEYS = {"limit", "latency_ms", "wall_ms", "nr_periods", "nr_throttled", "throttled_ms",
                "nr_bursts", "burst_ms", "throttle_ratio", "usage_ms"}  # fmt: skip


def figures_from_json(run: dict[str, object]) -> RunFigures:
    """A run as `lab run --json` printed it, back into figures."""
    lat = run["latency_ms"]
    assert isinstance(lat, dict)
    return RunFigures(
        limit=dict(run["limit"]),  # type: ignore[call-overload]
        latency=Latency(lat["p50"], lat["p95"], lat["p99"], lat["max"]),
        wall_ms=float(run["wall_ms"]),  # type: ignore[arg-type]
        stat=CpuStatDelta(
            nr_periods=int(run["nr_periods"]),  # type: ignore[call-overload]
            nr_throttled=int(run["nr_throttled"]),  # type: ignore[call-overload]
            throttled_us=round(float(run["throttled_ms"]) * 1000),  # type: ignore[arg-type]
            nr_bursts=int(run["nr_bursts"]),  # type: ignore[call-overload]
            burst_us=round(float(run["burst_ms"]) * 1000),  # type: ignore[arg-type]
        ),
        extra={k: v for k, v in run.items() if k not in _FIGURE_KEYS},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a saved `lab run --json` file")
    parser.add_argument("--save", type=Path, help="also save the lab's JSON lines here")
    args = parser.parse_args()
    if args.source:
        text = args.source.read_text()
    else:
        exe = Path(sys.executable).with_name("unthrottle")
        cmd = [str(exe), "lab", "run", "--json", *map(str, SCENARIOS)]
        with OtherLoad() as noise:
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        quiet = "quiet" if noise.quiet else f"NOT quiet (over {QUIET_CORES} cores)"
        print(f"While the lab measured, {noise.describe()}: {quiet}.\n")
        if args.save:
            args.save.write_text(text)
    scenarios = {s.name: s for s in map(load_scenario, SCENARIOS)}
    cores = len(os.sched_getaffinity(0))
    print("| scenario | run | p50 ms lab / model | p95 ms lab / model | ratio lab / model "
          "| throttled ms lab / model | agree |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    misses = 0
    for line in filter(str.strip, text.splitlines()):
        entry = json.loads(line)
        scenario = scenarios[entry["name"]]
        workload = scenario.workload.to_workload()
        for spec, run in zip(scenario.runs, entry["runs"], strict=True):
            c = compare(workload, spec, figures_from_json(run), cores, scenario=scenario.name)
            m, p = c.measured, c.predicted
            misses += bool(c.misses)
            marginal = c.ratio_tolerance > RATIO_TOLERANCE
            verdict = "; ".join(c.misses) or ("yes (marginal, ±0.10)" if marginal else "yes")
            print(
                f"| {scenario.name} | {spec.label()} "
                f"| {m.latency.p50:.1f} / {p.latency.p50:.1f} "
                f"| {m.latency.p95:.1f} / {p.latency.p95:.1f} "
                f"| {m.stat.throttle_ratio:.2f} / {p.stat.throttle_ratio:.2f} "
                f"| {m.stat.throttled_us / 1000:.0f} / {p.stat.throttled_us / 1000:.0f} "
                f"| {verdict} |"
            )
    print(f"\n{misses} run(s) outside the tolerance")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
