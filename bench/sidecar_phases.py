"""The two-container pod's sidecar in the model at every phase: can the phases explain a miss?

    .venv/bin/python bench/sidecar_phases.py --from bench/results/lab-vs-model-sidecar.json \\
        [--from …] [--step-ms 5] [--save bench/results/sidecar-phases.json]

The model runs a two-container pod at the phases the lab calibrated for each measurement
(the sidecar's grid and the pod's, against the batch's; ``unthrottle_lab.agreement``). Those
are measured, within a tick. This sweeps both over a whole period in ``--step-ms`` steps,
for each measurement of each run with a sidecar in the results files given (pooled as
``bench/lab_vs_model.py`` pools them), and prints what the model's sidecar does over the
sweep beside the kernel's: its p50 and throttle ratio, lowest and highest, and at how many
of the phase pairs the sidecar is within the rules of "Agreement" of the measurement (at
the measured wake-up). A kernel figure outside the model's whole range is a miss no
calibration of the phases would mend (docs/benchmarks.md §3). Model only: no root, no
kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from lab_vs_model import SETS, agreements, pooled
from unthrottle_lab.agreement import (
    Comparison,
    cfs_latency,
    latency_close,
    machine_for,
    sidecar_for,
)
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.scenario import RunSpec, Scenario, load_scenario
from unthrottle_lab.sim.tasks import Machine, simulate_tasks

NEAR_US = 2000
"""How far around the measured phases the near sweep goes, µs: half a tick at HZ=250, and
more than a calibration is off by (a grid's boundary is the earliest resume after a
throttle, an hrtimer's expiry: tens of µs late)."""
NEAR_STEP_US = 500


def sweep(
    spec: RunSpec, scenario: Scenario, measured: RunFigures, cores: int, step_us: int
) -> dict[str, Any]:
    """One measurement of a two-container run against the model at every pair of phases
    (the sidecar's grid, the pod's) ``step_us`` apart over a period."""
    machine = machine_for(measured, cores, spec.other_threads)
    side = sidecar_for(spec, measured)
    if side is None or spec.cpus is None:
        raise ValueError(f"{spec.label()}: not a limited run with a sidecar")
    workload = scenario.workload.to_workload()
    kernel = RunFigures.from_json(measured.extra["sidecar"])

    def sidecar_at(at: Machine) -> RunFigures:
        run = simulate_tasks(workload, spec.bandwidth(), at, limit=spec.as_given(),
                             pod=spec.pod_bandwidth(), sidecar=side)  # fmt: skip
        return RunFigures.from_json(run.extra["sidecar"])

    def agrees(predicted: RunFigures) -> bool:
        ratio = predicted.stat.throttle_ratio
        return not Comparison(kernel, predicted, (ratio, ratio)).misses

    period = side.bandwidth.period_us
    whole = [(s, p) for s in range(0, period, step_us) for p in range(0, period, step_us)]
    near = [((machine.sidecar_phase_us + s) % period, (machine.pod_phase_us + p) % period)
            for s in range(-NEAR_US, NEAR_US + 1, NEAR_STEP_US)
            for p in range(-NEAR_US, NEAR_US + 1, NEAR_STEP_US)]  # fmt: skip
    measured_p50 = cfs_latency(kernel).p50

    def over(pairs: list[tuple[int, int]]) -> dict[str, Any]:
        found = [sidecar_at(dataclasses.replace(machine, sidecar_phase_us=s, pod_phase_us=p))
                 for s, p in pairs]  # fmt: skip
        p50s = [g.latency.p50 for g in found]
        ratios = [g.stat.throttle_ratio for g in found]
        return {
            "p50_ms": [round(min(p50s), 1), round(max(p50s), 1)],
            "throttle_ratio": [round(min(ratios), 3), round(max(ratios), 3)],
            "p50_close": sum(latency_close(measured_p50, p) for p in p50s),
            "agreeing": sum(map(agrees, found)),
            "of": len(found),
        }

    here = sidecar_at(machine)
    phases = {"sidecar": machine.sidecar_phase_us / 1000, "pod": machine.pod_phase_us / 1000}
    return {
        "run": spec.label(),
        "phases_ms": phases,
        "kernel": {
            "p50_ms": round(measured_p50, 1),
            "throttle_ratio": round(kernel.stat.throttle_ratio, 3),
        },
        "model": {
            "p50_ms": round(here.latency.p50, 1),
            "throttle_ratio": round(here.stat.throttle_ratio, 3),
            "agrees": agrees(here),
        },
        "near_phases": over(near),
        "over_phases": over(whole),
    }


def sweeps(results: dict[str, Any], step_us: int) -> list[dict[str, Any]]:
    """Every measurement of every run with a sidecar in a (pooled) results file, swept."""
    out = []
    for found in agreements(results):
        if found.spec.sidecar is None or found.spec.cpus is None:
            continue
        scenario = _scenario(found.scenario)
        out += [sweep(found.spec, scenario, c.measured, int(results["cores"]), step_us)
                for c in found.comparisons]  # fmt: skip
    return out


def _scenario(name: str) -> Scenario:
    return next(s for s in map(load_scenario, SETS["sidecar"][0]) if s.name == name)


def report(found: list[dict[str, Any]]) -> str:
    """A line per measurement, then what they add up to, per run."""
    lines = []
    for run in dict.fromkeys(f["run"] for f in found):
        mine = [f for f in found if f["run"] == run]
        lines.append(f"{run}:")
        for f in mine:
            k, m = f["kernel"], f["model"]
            lines.append(
                f"  kernel p50 {k['p50_ms']:5.1f} ms ratio {k['throttle_ratio']:.3f} | model at its"
                f" phases {m['p50_ms']:5.1f} ms {m['throttle_ratio']:.3f}"
                f" {'agrees' if m['agrees'] else 'misses'} | {_over(f['near_phases'])} within"
                f" {NEAR_US / 1000:g} ms | {_over(f['over_phases'])} over the period"
            )
        for key, said in (("near_phases", f"within {NEAR_US / 1000:g} ms of its phases"),
                          ("over_phases", "at some phase")):  # fmt: skip
            somewhere = sum(f[key]["agreeing"] > 0 for f in mine)
            reach = sum(f[key]["p50_close"] > 0 for f in mine)
            lines.append(f"  {said}: the sidecar agrees in {somewhere} of {len(mine)},"
                         f" its p50 within reach in {reach}")  # fmt: skip
    return "\n".join(lines)


def _over(swept: dict[str, Any]) -> str:
    p50, ratio = swept["p50_ms"], swept["throttle_ratio"]
    return (f"p50 {p50[0]:.1f}–{p50[1]:.1f} ms, ratio {ratio[0]:.3f}–{ratio[1]:.3f},"
            f" agrees at {swept['agreeing']} of {swept['of']}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from",
        dest="sources",
        type=Path,
        action="append",
        required=True,
        help="a saved results file of the two-container set (again: pooled)",
    )
    parser.add_argument("--step-ms", type=int, default=5, help="the phases' step, ms")
    parser.add_argument("--save", type=Path, help="write the sweep here")
    args = parser.parse_args()
    results = pooled([json.loads(path.read_text()) for path in args.sources])
    if not results.get("sidecar"):
        parser.error("--from: results of the two-container set (lab_vs_model.py --sidecar)")
    found = sweeps(results, args.step_ms * 1000)
    print(report(found))
    if args.save:
        sources = " ".join(f"--from {path}" for path in args.sources)
        saved = {
            "command": f".venv/bin/python bench/sidecar_phases.py {sources} "
            f"--step-ms {args.step_ms} --save {args.save}",
            "computed": datetime.date.today().isoformat(),
            "measurements": found,
        }
        args.save.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
