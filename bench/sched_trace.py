"""Trace the two-container pod's threads on the kernel: how the sidecar shares its CPU.

    sudo .venv/bin/python bench/sched_trace.py --repeats 5 --isolate --pin --pin-sidecar \\
        --save bench/results/sched-trace-sidecar.json
    .venv/bin/python bench/sched_trace.py --from bench/results/sched-trace-sidecar.json

Runs ``unthrottle-lab run --json`` of ``scenarios/pod-sidecar-batch.yaml`` ``--repeats``
times with the kernel's scheduler events on (tracefs: ``sched_switch``, ``sched_wakeup``,
``sched_migrate_task``, ``cgroup_attach_task``, on the ``mono`` clock), and reads from the
trace what ``cpu.stat`` cannot say: while the sidecar's thread and one of the batch's took
turns on one CPU (each switched out runnable, straight to the other), how long each ran.
The model gives the sidecar 2/3 of such a CPU (the groups' weights, docs/model.md). It
also keeps each turn's length: the kernel preempts at ticks, so a turn lasts about one
tick or a few in a row, and a side's turns are counted by that (``sidecar_turns``,
``batch_turns``: how many, their median, how many of one tick). Each measurement is also
held to the model as ``bench/lab_vs_model.py --sidecar`` holds it.

Which thread is whose comes from ``cgroup_attach_task`` (the lab's ``…-pod/container`` and
``…-pod/sidecar``); a run's span is the sidecar's ``wall_ms`` up to its thread's last sleep
(the lab calibrates the grids before it with the same threads, and those turns are not
counted). The tracefs settings are put back afterwards, also on errors. Needs root and a
kernel with tracefs; events only, no function tracing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_vs_model import agreements
from unthrottle_lab.noise import OtherLoad

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "pod-sidecar-batch.yaml"
TRACEFS = Path("/sys/kernel/tracing")
EVENTS = ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_migrate_task",
          "cgroup:cgroup_attach_task"]  # fmt: skip
BUFFER_KB = 32768

_SWITCH = re.compile(r"\[(\d+)\].*?\s(\d+\.\d+): sched_switch: .*prev_pid=(\d+) prev_prio=\d+ "
                     r"prev_state=(\S+) ==> .*next_pid=(\d+)")  # fmt: skip
_ATTACH = re.compile(r"cgroup_attach_task: .*dst_path=(\S+) pid=(\d+)")
_POD = re.compile(r"-(\d+)-pod$")


@dataclass(frozen=True, slots=True)
class Switch:
    cpu: int
    t: float
    prev: int
    prev_state: str
    next: int


def switches(lines: Iterable[str]) -> list[Switch]:
    """The trace's ``sched_switch`` events, in order."""
    out = []
    for line in lines:
        m = _SWITCH.search(line)
        if m:
            out.append(Switch(int(m.group(1)), float(m.group(2)), int(m.group(3)), m.group(4),
                              int(m.group(5))))  # fmt: skip
    return out


def pods(lines: Iterable[str]) -> dict[int, dict[str, list[int]]]:
    """The lab's pods by run index (``…-<i>-pod``): their threads' pids by container
    (``container``, ``sidecar``), from ``cgroup_attach_task``."""
    found: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        m = _ATTACH.search(line)
        if not m:
            continue
        parent, _, role = m.group(1).rpartition("/")
        run = _POD.search(parent)
        if run and role in ("container", "sidecar"):
            pids = found[int(run.group(1))][role]
            if int(m.group(2)) not in pids:
                pids.append(int(m.group(2)))
    return {i: dict(roles) for i, roles in found.items()}


def last_sleep(events: list[Switch], pid: int) -> float:
    """When ``pid`` last went to sleep (its last task's end): its run's end."""
    return max(e.t for e in events if e.prev == pid and e.prev_state.startswith("S"))


@dataclass(frozen=True, slots=True)
class Turns:
    """Seconds the sidecar's thread and the batch's ran while taking turns on a CPU, and
    the part of each while another of the batch's threads ran on another CPU (the batch's
    load spread over two CPUs: its group's weight is then half on each, and the model gives
    the sidecar 2/3 of the CPU they share)."""

    sidecar: float = 0.0
    batch: float = 0.0
    sidecar_beside: float = 0.0
    batch_beside: float = 0.0
    sidecar_turns: tuple[float, ...] = ()
    """Each of the sidecar's turns, s, in order (one turn: from a switch to it to the
    switch back; the kernel preempts at ticks, so a turn is about a tick or a few)."""
    batch_turns: tuple[float, ...] = ()


def turns(events: list[Switch], side: int, others: set[int], start: float, end: float) -> Turns:
    """:class:`Turns` between ``start`` and ``end``: an interval counts where one was
    switched in as the other was switched out runnable, and left the CPU runnable to that
    other again (a preemption both ways). ``events`` in time order, as the trace has them."""
    mine = others | {side}
    ran = defaultdict(float)
    each: dict[str, list[float]] = {"sidecar": [], "batch": []}
    current: dict[int, int] = {}
    opened: dict[int, tuple[Switch, bool]] = {}
    for e in events:
        a, beside = opened.get(e.cpu, (e, False))
        if start <= a.t and e.t <= end:
            handed_back = a.next == e.prev and e.next == a.prev and a.prev != a.next
            ours = {a.prev, a.next} <= mine and side in (a.prev, a.next)
            runnable = a.prev_state.startswith("R") and e.prev_state.startswith("R")
            if handed_back and ours and runnable:
                who = "sidecar" if a.next == side else "batch"
                ran[who] += e.t - a.t
                ran[who + "_beside"] += (e.t - a.t) if beside else 0.0
                each[who].append(e.t - a.t)
        current[e.cpu] = e.next
        beside = any(pid in others and cpu != e.cpu for cpu, pid in current.items())
        opened[e.cpu] = (e, beside)
    return Turns(**ran, sidecar_turns=tuple(each["sidecar"]), batch_turns=tuple(each["batch"]))


def _ticks(turns: tuple[float, ...], hz: int) -> dict[str, Any]:
    """How long a side's turns were: their median, ms, and how many lasted about one tick
    (less than 1.5) and how many longer."""
    tick = 1.0 / hz
    return {
        "turns": len(turns),
        "median_ms": round(statistics.median(turns) * 1000, 2) if turns else None,
        "one_tick": sum(t < 1.5 * tick for t in turns),
        "longer": sum(t >= 1.5 * tick for t in turns),
    }


def _share(mine: float, theirs: float) -> float | None:
    return round(mine / (mine + theirs), 3) if mine + theirs else None


def shares(lines: list[str], runs: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Per lab run (in order): the sidecar's and the batch's ms while taking turns, the
    sidecar's share of them, and its share while another of the batch's threads ran on
    another CPU; None for a run without a sidecar."""
    events, found = switches(lines), pods(lines)
    out: list[dict[str, Any] | None] = []
    for i, run in enumerate(runs):
        roles = found.get(i, {})
        if "sidecar" not in run or not roles.get("sidecar"):
            out.append(None)
            continue
        side = roles["sidecar"][0]
        end = last_sleep(events, side)
        start = end - run["sidecar"]["wall_ms"] / 1000
        t = turns(events, side, set(roles.get("container", [])), start, end)
        out.append({
            "sidecar_ms": round(t.sidecar * 1000, 1),
            "batch_ms": round(t.batch * 1000, 1),
            "sidecar_share": _share(t.sidecar, t.batch),
            "beside_ms": round((t.sidecar_beside + t.batch_beside) * 1000, 1),
            "sidecar_share_beside": _share(t.sidecar_beside, t.batch_beside),
            "sidecar_turns": _ticks(t.sidecar_turns, int(run.get("hz") or 250)),
            "batch_turns": _ticks(t.batch_turns, int(run.get("hz") or 250)),
        })  # fmt: skip
    return out


@contextmanager
def tracing() -> Iterator[Path]:
    """The scheduler events on, into a cleared buffer; every setting put back after."""
    if not (TRACEFS / "trace").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
    names = ["tracing_on", "buffer_size_kb", "set_event"]
    saved = {n: (TRACEFS / n).read_text() for n in names}
    clock = re.search(r"\[(\w+)\]", (TRACEFS / "trace_clock").read_text())
    try:
        (TRACEFS / "tracing_on").write_text("0")
        (TRACEFS / "trace_clock").write_text("mono")
        (TRACEFS / "buffer_size_kb").write_text(str(BUFFER_KB))
        (TRACEFS / "trace").write_text("")
        (TRACEFS / "set_event").write_text("\n".join(EVENTS) + "\n")
        (TRACEFS / "tracing_on").write_text("1")
        yield TRACEFS / "trace"
    finally:
        (TRACEFS / "tracing_on").write_text("0")
        (TRACEFS / "set_event").write_text("")
        for event in saved["set_event"].split():
            with (TRACEFS / "set_event").open("a") as f:
                f.write(event + "\n")
        (TRACEFS / "trace").write_text("")
        (TRACEFS / "trace_clock").write_text(clock.group(1) if clock else "local")
        (TRACEFS / "buffer_size_kb").write_text(saved["buffer_size_kb"].split()[0])
        (TRACEFS / "tracing_on").write_text(saved["tracing_on"].strip())


def measure(
    repeats: int, flags: list[str], save: Path = Path("bench/results/sched-trace-sidecar.json")
) -> dict[str, Any]:
    """``repeats`` traced ``lab run``s: the results file's content (lab_vs_model's shape,
    with each measurement's ``turns`` beside its runs)."""
    exe = Path(sys.executable).with_name("unthrottle-lab")
    cmd = [str(exe), "run", "--json", *flags, str(SCENARIO)]
    measurements = []
    for _ in range(repeats):
        with OtherLoad() as noise, tracing() as trace:
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            lines = trace.read_text().splitlines()
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        measurements.append({"other_load_cores": round(noise.cores, 2),
                             "seconds": round(noise.seconds, 1), "scenarios": entries,
                             "turns": shares(lines, entries[0]["runs"])})  # fmt: skip
    return {
        "command": "sudo .venv/bin/python bench/sched_trace.py "
        f"--repeats {repeats} {' '.join(flags)} --save {save}",
        "measured": datetime.date.today().isoformat(),
        "cores": len(os.sched_getaffinity(0)),
        "measurements": measurements,
        "sidecar": True,
    }


def report(results: dict[str, Any]) -> str:
    """A line per run per measurement: its turns and the sidecar's p50 against the model."""
    found = agreements(results)
    lines = []
    for index, a in enumerate(found):
        for m, c in zip(results["measurements"], a.comparisons, strict=True):
            turn = m["turns"][index]
            if turn is None or c.sidecar is None:
                continue
            lines.append(
                f"{a.spec.label()}: turns {turn['sidecar_ms']:.1f} / {turn['batch_ms']:.1f} ms, "
                f"sidecar share {turn['sidecar_share']}, {turn['sidecar_share_beside']} "
                f"while the batch's other thread ran ({turn['beside_ms']:.1f} ms); sidecar p50 "
                f"{c.sidecar.measured.latency.p50:.1f} vs {c.sidecar.predicted.latency.p50:.1f} "
                f"ms; {'agrees' if not c.misses else 'no: ' + '; '.join(c.misses)}"
                + "".join(_turn_lengths(turn, who) for who in ("sidecar", "batch"))
            )
    return "\n".join(lines)


def _turn_lengths(turn: dict[str, Any], who: str) -> str:
    """``; sidecar's turns: 30, median 4.00 ms, 20 of one tick`` (where measured)."""
    found = turn.get(f"{who}_turns")
    if not found or not found["turns"]:
        return ""
    return (f"; {who}'s turns: {found['turns']}, median {found['median_ms']:.2f} ms,"
            f" {found['one_tick']} of one tick")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a saved results file")
    parser.add_argument("--save", type=Path, help="write the results file here")
    parser.add_argument("--repeats", type=int, default=5, help="traced measurements")
    for flag in ("--isolate", "--pin", "--pin-sidecar"):
        parser.add_argument(flag, action="store_true", help=f"`lab run {flag}`")
    args = parser.parse_args()
    if args.source:
        results = json.loads(args.source.read_text())
    else:
        flags = [f for f, on in (("--isolate", args.isolate), ("--pin", args.pin),
                                 ("--pin-sidecar", args.pin_sidecar)) if on]  # fmt: skip
        results = measure(args.repeats, flags, *([args.save] if args.save else []))
        if args.save:
            args.save.write_text(json.dumps(results, indent=1) + "\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
