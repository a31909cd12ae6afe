"""``unthrottle-lab``: the laboratory's commands, apart from the product's ``unthrottle``.

``run`` and ``tune`` measure scenarios in fresh cgroups on this kernel (root), ``workload``
repeats a scenario's workload in a container (the real node's workload image), ``simulate``
predicts them with the task simulator. They were ``unthrottle lab …`` and ``unthrottle
simulate`` before the product and the laboratory were shipped apart (CONTRIBUTING.md)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from json import dumps
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from unthrottle import __version__
from unthrottle.cgroups import CgroupError, Layout, detect_layout
from unthrottle.cli import checks
from unthrottle.cli.common import err, fail, run_guarded
from unthrottle.cli.text import styled
from unthrottle.recommend import Policy, PolicyError, Strategy
from unthrottle_lab.agentview import View
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.kernel import kernel_hz
from unthrottle_lab.looping import loop
from unthrottle_lab.output import print_json, print_table, print_tune
from unthrottle_lab.processes import LabError
from unthrottle_lab.runner import LabOptions, run_scenario
from unthrottle_lab.scenario import Scenario, ScenarioError, load_scenario
from unthrottle_lab.sim.tasks import DEFAULT_HZ, Accounting, Machine, simulate_tasks
from unthrottle_lab.tune import tune

app = typer.Typer(
    help="unthrottle's laboratory: run workloads in real cgroups on this machine, or "
    "predict them with the task simulator.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


ScenarioFiles = Annotated[
    list[Path], typer.Argument(help="Scenario files (see scenarios/README.md).", show_default=False)
]
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print one JSON object per scenario instead of a table.")
]
IsolateFlag = Annotated[
    bool,
    typer.Option(
        "--isolate",
        help="Keep this machine's other processes at idle priority while each run measures "
        "(those in the root cgroup; moved back afterwards), so their load does not move the "
        "figures.",
    ),
]
PinFlag = Annotated[
    bool,
    typer.Option(
        "--pin",
        help="Put each worker on a CPU of its own when there are two or more and no more "
        "than CPUs, as the model places them, so the scheduler's placement does not move "
        "the figures.",
    ),
]
PinSidecarFlag = Annotated[
    bool,
    typer.Option(
        "--pin-sidecar",
        help="With --pin: a sidecar's workers too, each on the CPU the model places it on "
        "(beside the run's workers in turn); otherwise the scheduler places them, as a pod's.",
    ),
]
MAX_PHASE_MS = 1000.0
"""Phases and wake-up delays, ms: a CFS period is at most 1 s, and so is any sane delay."""
PhaseMs = Annotated[
    float,
    typer.Option("--phase-ms", help="Start each run this long after a CFS period boundary."),
]
MIN_HZ, MAX_HZ = 100, 1000
"""CONFIG_HZ is 100, 250, 300 or 1000 on x86 (200 and 500 elsewhere)."""
MAX_CORES = 1024
"""Cores of a simulated machine: as many as the largest limit a scenario may ask for."""


def _phase_us(value: float, option: str) -> int:
    return round(checks.number(value, option, 0, MAX_PHASE_MS, " ms") * 1000)


def _load_all(paths: list[Path]) -> list[Scenario]:
    """Validate every file before anything runs."""
    scenarios, problems = [], []
    for path in paths:
        try:
            scenarios.append(load_scenario(path))
        except ScenarioError as error:
            problems.append(str(error))
    if problems:
        raise fail("\n".join(problems) + "\nnothing was run", 2)
    return scenarios


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def _lab_session(command: str) -> Iterator[Layout]:
    """What every lab command needs: root, the cgroup layout, and SIGTERM handled like
    Ctrl-C, so the lab's own cleanup runs; errors become messages and exit codes.

    SIGINT is set to raise KeyboardInterrupt here, whatever was inherited: a script or a
    shell without job control starts background commands with SIGINT ignored, and then
    Python leaves it ignored, so ``kill -INT`` would not remove the run's cgroups."""
    if os.geteuid() != 0:
        raise fail(f"{command} creates cgroups and needs root", 1)
    try:
        layout = detect_layout()
    except CgroupError as error:
        raise fail(str(error), 1) from None
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield layout
    except KeyboardInterrupt:
        raise fail("interrupted; the run's cgroup and workers were removed", 130) from None
    except (CgroupError, LabError, ValueError) as error:
        raise fail(str(error), 1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


@app.command("run")
def lab_run(
    paths: ScenarioFiles,
    json: JsonFlag = False,
    phase_ms: PhaseMs = 0.0,
    isolate: IsolateFlag = False,
    pin: PinFlag = False,
    pin_sidecar: PinSidecarFlag = False,
) -> None:
    """Run each scenario's runs in fresh cgroups on this kernel and measure them."""
    options = LabOptions(phase_us=_phase_us(phase_ms, "--phase-ms"), isolate=isolate, pin=pin,
                         pin_sidecar=pin_sidecar)  # fmt: skip
    scenarios = _load_all(paths)
    rows: list[tuple[Scenario, list[RunFigures]]] = []
    with _lab_session("unthrottle-lab run") as layout:
        for scenario in scenarios:

            def progress(index: int, fig: RunFigures, scenario: Scenario = scenario) -> None:
                if not json and sys.stderr.isatty():
                    label = scenario.runs[index].label()
                    err.print(styled(f"{scenario.name}: {label} done", "dim", one_line=True))

            runs = run_scenario(scenario, layout, options, on_run=progress)
            rows.append((scenario, runs))
            if json:
                print_json(scenario, runs)
    if not json:
        print_table(f"lab run on this kernel ({layout.version})", rows)


@app.command("workload")
def lab_workload(
    path: Annotated[Path, typer.Argument(help="A scenario file; its workload is what runs.")],
    passes: Annotated[
        int, typer.Option(min=0, help="Stop after this many passes (0: run until killed).")
    ] = 0,
    pause_ms: Annotated[
        int, typer.Option(min=0, max=60_000, help="Idle time between passes, ms.")
    ] = 400,
) -> None:
    """Run a scenario's workload over and over in this process's own cgroup (a container's),
    one line per pass: the workload image's command on the real node."""
    scenario = _load_all([path])[0]
    previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        loop(scenario.workload.to_workload(), passes=passes or None, pause_ms=pause_ms,
             on_pass=lambda done: print(f"{scenario.name}: {done.line()}", flush=True))  # fmt: skip
    except KeyboardInterrupt:
        raise typer.Exit(0) from None  # a pod's normal end: the workers were killed with it
    except LabError as error:
        raise fail(str(error), 1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@app.command("tune")
def lab_tune(
    path: Annotated[Path, typer.Argument(help="A scenario; its first run is today's settings.")],
    target: Annotated[
        float, typer.Option(help="Throttle ratio to stay under (share of active periods).")
    ] = 0.05,
    strategy: Annotated[
        Strategy, typer.Option(case_sensitive=False, help="LimitOnly, BurstPreferred or Auto.")
    ] = Strategy.AUTO,
    headroom: Annotated[float, typer.Option(help="Added to the limit the evidence needs.")] = 0.10,
    json: JsonFlag = False,
    baselines: Annotated[
        bool, typer.Option(help="Also measure the VPA, KRR and 2x-average baselines.")
    ] = True,
    isolate: IsolateFlag = False,
    pin: PinFlag = False,
    evidence: Annotated[
        View,
        typer.Option(
            case_sensitive=False,
            help="Recommend from the samples in order "
            "(sequence), or as the operator reads them: the agent's histogram and "
            "backlog series (agent), or its histogram alone (histogram).",
        ),
    ] = View.SEQUENCE,
) -> None:
    """Measure today's settings, recommend, and prove the result on this kernel."""
    try:
        policy = Policy(
            target_ratio=target,
            headroom=headroom,
            strategy=strategy,
            min_millicores=10,
            max_millicores=64_000,
            max_step_up=100.0,
            max_step_down=0.01,
        )
    except PolicyError as error:
        option = {"targetThrottleRatio": "--target", "headroom": "--headroom"}.get(error.field)
        reason = str(error).removeprefix(f"{error.field}: ")
        raise fail(f"{option or error.field}: {reason}", 2) from None
    scenario = _load_all([path])[0]

    def step(message: str) -> None:
        if sys.stderr.isatty():
            err.print(styled(message, "dim"))

    with _lab_session("unthrottle-lab tune") as layout:
        result = tune(scenario, layout, policy, LabOptions(isolate=isolate, pin=pin),
                      with_baselines=baselines, on_step=step, view=evidence)  # fmt: skip
    if json:
        print(dumps(result.to_json()), flush=True)
    else:
        print_tune(result)


@app.command()
def simulate(
    paths: ScenarioFiles,
    json: JsonFlag = False,
    cores: Annotated[
        int | None,
        typer.Option(help=f"Cores of the simulated machine (1-{MAX_CORES}) [default: this one's]"),
    ] = None,
    hz: Annotated[
        int | None,
        typer.Option(
            help=f"Kernel tick rate, CONFIG_HZ ({MIN_HZ}-{MAX_HZ}) [default: this kernel's, or 250]"
        ),
    ] = None,
    phase_ms: PhaseMs = 0.0,
    tick_phase_ms: Annotated[
        float, typer.Option("--tick-phase-ms", help="Start this long after a tick.")
    ] = 0.0,
    wakeup_ms: Annotated[
        float,
        typer.Option("--wakeup-ms", help="A sleeping worker runs this long after due."),
    ] = 0.0,
    tick_accounting: Annotated[
        bool,
        typer.Option(
            "--tick-accounting",
            help="Threads that only compute: the quota is enforced at ticks, not at once.",
        ),
    ] = False,
) -> None:
    """Predict each scenario's runs with the CFS model (same figures as `unthrottle-lab run`)."""
    checks.whole(cores, "--cores", 1, MAX_CORES)
    checks.whole(hz, "--hz", MIN_HZ, MAX_HZ, " (CONFIG_HZ is 100, 250, 300 or 1000 on x86)")
    machine = Machine(
        cores=cores or len(os.sched_getaffinity(0)),
        hz=hz or kernel_hz() or DEFAULT_HZ,
        period_phase_us=_phase_us(phase_ms, "--phase-ms"),
        tick_phase_us=_phase_us(tick_phase_ms, "--tick-phase-ms"),
        wakeup_us=_phase_us(wakeup_ms, "--wakeup-ms"),
        accounting=Accounting.TICK if tick_accounting else Accounting.IMMEDIATE,
    )
    scenarios = _load_all(paths)
    rows = []
    for scenario in scenarios:
        workload = scenario.workload.to_workload()
        runs = [  # a run's other busy threads share the cores, as in `unthrottle-lab run`
            simulate_tasks(
                workload,
                run.bandwidth(),
                dataclasses.replace(machine, other_threads=run.other_threads),
                limit=run.as_given(),
                pod=run.pod_bandwidth(),
                sidecar=run.task_sidecar(),
            )
            for run in scenario.runs
        ]
        rows.append((scenario, runs))
        if json:
            print_json(scenario, runs)
    if not json:
        print_table(f"simulated: {machine.cores} cores, HZ {machine.hz}", rows)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)


def main() -> None:
    """Console-script entry point. A bug ends in one line, not a traceback (which may show
    a secret); ``UNTHROTTLE_DEBUG=1`` shows the traceback."""
    run_guarded(app)
