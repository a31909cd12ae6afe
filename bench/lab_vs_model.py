"""Compare the CFS model with the real kernel, run by run, over repeated measurements.

    sudo .venv/bin/python bench/lab_vs_model.py --repeats 2 --isolate --pin \\
        --save bench/results/lab-vs-model.json       # measures (root), then compares
    .venv/bin/python bench/lab_vs_model.py --from bench/results/lab-vs-model.json

``--from`` may be given more than once, for measurements of one set saved on different
days: they are pooled, each run held over all of them (the rule is "at least one of the
kernel's measurements", and the verdict says in how many it agreed).

Each scenario in scenarios/seed-*.yaml is measured ``--repeats`` times by
``unthrottle-lab run --json`` (``--isolate``: the machine's other processes at
idle priority meanwhile; ``--pin``: each worker on a CPU of its own where there
are two or more and no more than CPUs, as the model places them). Each run is simulated
at the period and tick phase the lab measured for it, on this machine's cores
and HZ, and held to the rules of ``unthrottle_lab.agreement`` (docs/model.md,
"Agreement"). Prints a Markdown table: the lab's figures over the repeats, the
model's, the kernel's own spread, and the verdict. ``--save`` writes every
measurement, with how busy the rest of the machine was, to a results file that
``tests/unit/test_lab_replay.py`` replays through the model and
``docs/benchmarks.md`` §3 quotes.

``--pod`` measures the pod-quota scenarios instead (scenarios/pod-quota-*.yaml: runs in a
pod cgroup with a quota of its own, as a kubelet makes one), into their own results file;
their table has the pod's throttle ratio beside the container's:

    sudo .venv/bin/python bench/lab_vs_model.py --pod --repeats 2 --isolate --pin \
        --save bench/results/lab-vs-model-pod.json

``--sidecar`` measures the two-container pod scenarios (scenarios/pod-sidecar-*.yaml: the run's
container beside a sidecar, the pod's quota the sum of theirs), into their own results file;
their table has a row for each container (the sidecar's held to the same rules) and the pod's
ratio beside them:

    sudo .venv/bin/python bench/lab_vs_model.py --sidecar --repeats 2 --isolate --pin \
        --pin-sidecar --save bench/results/lab-vs-model-sidecar.json

``--pin-sidecar`` pins the sidecar's thread where the model places it (`lab run
--pin-sidecar`); without it the scheduler places it, as a pod's, and moves it where the
model does not (docs/benchmarks.md §3).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from unthrottle_lab.agreement import Comparison, RunAgreement, agreement, cfs_latency
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.noise import OtherLoad
from unthrottle_lab.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SETS = {
    "seed": (sorted((ROOT / "scenarios").glob("seed-*.yaml")), "lab-vs-model.json"),
    "pod": (sorted((ROOT / "scenarios").glob("pod-quota-*.yaml")), "lab-vs-model-pod.json"),
    "sidecar": (sorted((ROOT / "scenarios").glob("pod-sidecar-*.yaml")),
                "lab-vs-model-sidecar.json"),
}  # fmt: skip
"""The scenarios each option measures, and the results file they are saved in."""


def measure(
    repeats: int, isolate: bool, pin: bool, *, which: str = "seed", pin_sidecar: bool = False
) -> dict[str, Any]:
    """Run the lab ``repeats`` times over every scenario of a set (``SETS``: the seeds, the
    pod-quota ones, the two-container ones); the results file's content."""
    exe = Path(sys.executable).with_name("unthrottle-lab")
    flags = [*(["--isolate"] if isolate else []), *(["--pin"] if pin else [])]
    flags += ["--pin-sidecar"] if pin_sidecar else []
    paths, saved = SETS[which]
    cmd = [str(exe), "run", "--json", *flags, *map(str, paths)]
    measurements = []
    for _ in range(repeats):
        with OtherLoad() as noise:
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        measurements.append({"other_load_cores": round(noise.cores, 2),
                             "seconds": round(noise.seconds, 1), "scenarios": entries})  # fmt: skip
    option = "" if which == "seed" else f"--{which} "
    return {
        "command": f"sudo .venv/bin/python bench/lab_vs_model.py {option}"
        f"--repeats {repeats} {' '.join(flags)} --save bench/results/{saved}".replace("  ", " "),
        "measured": datetime.date.today().isoformat(),
        "cores": len(os.sched_getaffinity(0)),
        "isolated": isolate,
        "pinned": pin,
        "measurements": measurements,
        **({which: True} if which != "seed" else {}),
    }


def pooled(saved: list[dict[str, Any]]) -> dict[str, Any]:
    """Several results files of one set (``SETS``), measured on the same number of cores, as
    one: their measurements in the order given, and every file's command."""
    sets = {next((w for w in SETS if r.get(w)), "seed") for r in saved}
    cores = {int(r["cores"]) for r in saved}
    if len(sets) != 1 or len(cores) != 1:
        raise ValueError("--from: results of one set, measured on as many cores, pool")
    if len(saved) == 1:
        return saved[0]
    which = sets.pop()
    return {
        "commands": [r["command"] for r in saved],
        "measured": ", ".join(sorted({str(r["measured"]) for r in saved})),
        "cores": cores.pop(),
        "measurements": [m for r in saved for m in r["measurements"]],
        **({which: True} if which != "seed" else {}),
    }


def agreements(results: dict[str, Any]) -> list[RunAgreement]:
    """Every run of every scenario in a results file, against the model."""
    out = []
    which = next((w for w in SETS if results.get(w)), "seed")
    for path in SETS[which][0]:
        scenario = load_scenario(path)
        repeats = [
            [RunFigures.from_json(run) for run in entry["runs"]]
            for m in results["measurements"]
            for entry in m["scenarios"]
            if entry["name"] == scenario.name
        ]
        if repeats:
            out += agreement(scenario, repeats, int(results["cores"]))
    return out


def _span(values: list[float], digits: int) -> str:
    low, high = min(values), max(values)
    return f"{low:.{digits}f}" if round(low, digits) == round(high, digits) else \
        f"{low:.{digits}f}–{high:.{digits}f}"  # fmt: skip


def _pod_ratio(figures: RunFigures) -> float:
    return float((figures.extra.get("pod") or {}).get("throttle_ratio", 0.0))


def table(found: list[RunAgreement]) -> str:
    """The Markdown table of docs/benchmarks.md §3 (with the pod's ratio where a run has a
    pod quota: reported, not held to a rule; a run with a sidecar has a second row, the
    sidecar's, held as the run's is and agreeing in the same measurement)."""
    pods = any(a.spec.in_pod for a in found)
    pod_head = (" pod ratio lab / model |", "---|") if pods else ("", "")
    lines = ["| scenario | run | p50 ms lab / model | p95 ms lab / model | ratio lab / model "
             f"|{pod_head[0]} agrees |", f"|---|---|---|---|---|{pod_head[1]}---|"]  # fmt: skip
    for a in found:
        ms, ps = [c.measured for c in a.comparisons], [c.predicted for c in a.comparisons]
        # a run agrees with at least half the measurements the host left alone
        # (lab.agreement); a pooled run's misses are too many for a cell: the prose has them
        verdict = "yes" if a.agrees else "**no**"
        if len(a.comparisons) > 1:
            verdict += f", in {a.agreeing} of {len(a.comparisons)}"
        if not a.agrees and len(a.comparisons) <= 2:
            verdict += ": " + "; ".join(m for c in a.comparisons for m in c.misses)
        if a.spec.cpus is None:
            verdict += " (p95: the machine's reference)"
        widened = [f"ratio ±{a.spec.ratio_tolerance:g}"] if a.spec.ratio_tolerance else []
        if a.spec.latency_tolerance:
            widened.append(f"latency ±{a.spec.latency_tolerance:.0%}")
        if widened:
            verdict += f" ({', '.join(widened)}, from the scenario file)"
        pod = (f" {_span([_pod_ratio(m) for m in ms], 2)} / "
               f"{_span([_pod_ratio(p) for p in ps], 2)} |" if pods else "")  # fmt: skip
        lines.append(f"| {a.scenario} | {a.spec.label()} | {_cells(a.comparisons)} |{pod}"
                     f" {verdict} |")  # fmt: skip
        sides = tuple(c.sidecar for c in a.comparisons if c.sidecar is not None)
        if a.spec.sidecar is not None and sides:
            lines.append(f"| | sidecar, {a.spec.sidecar.cpus:g} CPU | {_cells(sides)} |"
                         f"{' |' if pods else ''} (in the run's verdict) |")  # fmt: skip
    return "\n".join(lines)


def _cells(comparisons: tuple[Comparison, ...]) -> str:
    """p50, p95 and the ratio, the lab's over the measurements against the model's."""
    ms, ps = [c.measured for c in comparisons], [c.predicted for c in comparisons]
    lab = [cfs_latency(m) for m in ms]  # less what the host took, as compared
    return (f"{_span([m.p50 for m in lab], 1)} / {_span([p.latency.p50 for p in ps], 1)} "
            f"| {_span([m.p95 for m in lab], 1)} / {_span([p.latency.p95 for p in ps], 1)} "
            f"| {_span([m.stat.throttle_ratio for m in ms], 2)} / "
            f"{_span([r for c in comparisons for r in c.band], 2)}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="sources", type=Path, action="append",
                        help="a saved results file (again: pooled with the others)")  # fmt: skip
    parser.add_argument("--save", type=Path, help="write the results file here")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per scenario")
    parser.add_argument("--isolate", action="store_true", help="`lab run --isolate`")
    parser.add_argument("--pin", action="store_true", help="`lab run --pin`")
    parser.add_argument("--pin-sidecar", action="store_true", help="`lab run --pin-sidecar`")
    parser.add_argument("--pod", action="store_true", help="the pod-quota scenarios instead")
    parser.add_argument("--sidecar", action="store_true",
                        help="the two-container pod scenarios instead")  # fmt: skip
    args = parser.parse_args()
    which = "pod" if args.pod else "sidecar" if args.sidecar else "seed"
    if args.sources:
        results = pooled([json.loads(path.read_text()) for path in args.sources])
    else:
        results = measure(args.repeats, args.isolate, args.pin, which=which,
                          pin_sidecar=args.pin_sidecar)  # fmt: skip
        if args.save:
            args.save.write_text(json.dumps(results, indent=1) + "\n")
    for m in results["measurements"]:
        print(f"while the lab measured: other processes used {m['other_load_cores']:.2f} cores "
              f"on average over {m['seconds']:.0f} s")  # fmt: skip
    found = agreements(results)
    print("\n" + table(found))
    misses = sum(not a.agrees for a in found)
    print(f"\n{len(found) - misses} of {len(found)} runs agree")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
