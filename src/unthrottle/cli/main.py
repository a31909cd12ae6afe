"""``unthrottle``: find CFS throttling, prove it, fix it."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from json import dumps
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from unthrottle import __version__
from unthrottle.agent import logs as agent_logs
from unthrottle.agent.burst import DEFAULT_NODE_THRESHOLD, BurstWriter, ProcStat
from unthrottle.agent.discovery import Found, discover_kubepods, discover_standalone
from unthrottle.agent.files import raise_soft_limit
from unthrottle.agent.naming import name_cgroups
from unthrottle.agent.podwatch import WatchedPods
from unthrottle.agent.sampling import Sampler
from unthrottle.agent.server import make_server, serve
from unthrottle.agent.settings import AgentSettings, InvalidAgentSettings
from unthrottle.cgroups import CgroupError, Layout, detect_layout
from unthrottle.cli import checks
from unthrottle.cli.common import err, fail, load_kube_config
from unthrottle.cli.crd_cmd import crd_command
from unthrottle.cli.operator_cmd import operator_command
from unthrottle.cli.recommend_cmd import prometheus_rules_command, recommend_command
from unthrottle.cli.report_cmd import report_command
from unthrottle.cli.text import plain, styled
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
    help="Find CFS throttling, prove it on the kernel, fix it with the smallest CPU limit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a local may hold a token
)
lab_app = typer.Typer(help="Run workloads in real cgroups on this machine.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.command("recommend")(recommend_command)
app.command("prometheus-rules")(prometheus_rules_command)
app.command("operator")(operator_command)
app.command("crd")(crd_command)
app.command("report")(report_command)


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


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)


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


@lab_app.command("run")
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
    with _lab_session("lab run") as layout:
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


@lab_app.command("workload")
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


@lab_app.command("tune")
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

    with _lab_session("lab tune") as layout:
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
    """Predict each scenario's runs with the CFS model (same figures as `lab run`)."""
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
        runs = [  # a run's other busy threads share the cores, as in `lab run`
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


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$", re.ASCII)


def _duration_ns(text: str, option: str) -> int:
    match = _DURATION.match(text)
    if not match:
        raise fail(f"{option}: {text!r} is not a duration such as 100ms or 1s", 2)
    value = float(match.group(1)) * (1e6 if match.group(2) == "ms" else 1e9)
    if not 1e6 <= value <= 60e9:
        raise fail(f"{option}: {text} is outside 1ms-60s", 2)
    return int(value)


@app.command()
def agent(
    standalone: Annotated[
        bool,
        typer.Option(
            "--standalone",
            help="Name cgroups by path (no Kubernetes): every cgroup below --cgroup-root "
            "with a quota or processes is a container.",
        ),
    ] = False,
    cgroup_root: Annotated[
        str, typer.Option(help="Below each hierarchy's mount, e.g. kubepods or system.slice.")
    ] = "kubepods",
    listen: Annotated[str, typer.Option(help="HOST:PORT for /metrics and /healthz.")] = (
        "0.0.0.0:9717"
    ),
    period: Annotated[str, typer.Option(help="Sampling window, e.g. 100ms.")] = "100ms",
    peak_window: Annotated[
        str, typer.Option(help="The peak gauge covers this much history.")
    ] = "60s",
    discover_every: Annotated[
        str, typer.Option(help="How often to look for new and vanished cgroups (and pods).")
    ] = "5s",
    node_name: Annotated[
        str | None,
        typer.Option(help="This node's name [default: $NODE_NAME, else the hostname]."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig [default: in-cluster, else $KUBECONFIG / ~/.kube/config]."),
    ] = None,
    kubepods_parent: Annotated[
        str, typer.Option(help="Where kubepods[.slice] sits below the mount (kind, tests).")
    ] = "",
    burst: Annotated[
        bool,
        typer.Option(
            help="Write the burst that pod annotations ask for (Kubernetes mode; "
            "off: the agent only measures, and writes nothing)."
        ),
    ] = False,
    burst_namespace: Annotated[
        list[str] | None,
        typer.Option(
            help="With --burst: a namespace whose pods may ask for burst (repeat "
            "it; * for every namespace but kube-system). Required with --burst."
        ),
    ] = None,
    burst_koordinator: Annotated[
        bool,
        typer.Option(
            "--burst-koordinator",
            help="With --burst: honour koordinator.sh/cpuBurst too (only where no "
            "Koordinator koordlet runs; otherwise pods carrying it are left to it).",
        ),
    ] = False,
    burst_node_threshold: Annotated[
        float,
        typer.Option(min=0, max=1, help="Grant no burst while node CPU usage is above this."),
    ] = DEFAULT_NODE_THRESHOLD,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error (JSON lines on stderr).")
    ] = "info",
) -> None:
    """The node agent: sample container cgroups every period and export to Prometheus."""
    scope = checks.burst_scope(burst=burst, namespaces=burst_namespace or [],
                               koordinator=burst_koordinator, standalone=standalone)  # fmt: skip
    checks.agent_options(standalone=standalone, cgroup_root=cgroup_root,
                         kubeconfig=kubeconfig, listen=listen)  # fmt: skip
    if log_level.lower() not in {"debug", "info", "warning", "error"}:
        raise fail(f"--log-level: {log_level!r} is not debug, info, warning or error", 2)
    agent_logs.setup(log_level)
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise fail(f"--listen: {listen!r} is not HOST:PORT", 2)
    period_ns = _duration_ns(period, "--period")
    peak_s = _duration_ns(peak_window, "--peak-window") / 1e9
    refresh_s = _duration_ns(discover_every, "--discover-every") / 1e9
    try:
        settings = AgentSettings(period_ns=period_ns, peak_window_s=peak_s, refresh_s=refresh_s)
    except InvalidAgentSettings as error:
        option = {"period_ns": "--period", "peak_window_s": "--peak-window",
                  "refresh_s": "--discover-every"}.get(error.field, error.field)  # fmt: skip
        raise fail(f"{option}: {error.reason}", 2) from None
    try:
        layout = detect_layout()
    except CgroupError as error:
        raise fail(str(error), 1) from None
    discover: Callable[[frozenset[str]], list[Found]]
    writer: BurstWriter | None = None
    if standalone:
        discover = lambda known: discover_standalone(layout, cgroup_root, known)  # noqa: E731
        where = f"below {cgroup_root!r}, named by path"
    else:
        node = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
        # one LIST, then a WATCH resumed by resourceVersion (agent/podwatch.py)
        pods = WatchedPods(_core_api(kubeconfig), node, timeout_s=settings.api_timeout_s)
        pods.start(wait_s=settings.api_timeout_s)
        writer = (BurstWriter(layout, ProcStat(), burst_node_threshold, scope=scope)
                  if scope is not None else None)  # fmt: skip

        def discover(known: frozenset[str]) -> list[Found]:
            current = pods.pods()
            found = name_cgroups(discover_kubepods(layout, kubepods_parent), current)
            if writer is not None:
                try:
                    writer.apply(found, current)
                except Exception:  # a failed write must never stop the sampling
                    logging.getLogger("unthrottle.agent").exception("burst writer failed")
            return found

        where = f"of node {node!r}, named through the Kubernetes API"
    before, now, _ = raise_soft_limit()
    if now != before:
        logging.getLogger("unthrottle.agent").info(
            "open files: soft limit raised from %d to %d (the hard limit)", before, now
        )
    sampler = Sampler(layout, discover, settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    extra = writer.metrics if writer is not None else None
    try:
        server = make_server(sampler, host.strip("[]"), int(port_text), extra=extra)
    except OSError as error:
        raise fail(f"--listen {listen}: {error.strerror}", 1) from None
    logging.getLogger("unthrottle.agent").info(
        "sampling the %s cgroups %s every %s, serving http://%s:%d/metrics",
        layout.version, where, period, host.strip("[]"), server.server_address[1],
    )  # fmt: skip
    serve(sampler, server, stop)


def _core_api(kubeconfig: Path | None) -> Any:
    """A CoreV1Api: in-cluster when there, else from the kubeconfig."""
    from kubernetes import client

    load_kube_config(kubeconfig, hint="; or run with --standalone")
    return client.CoreV1Api()


def main() -> None:
    """Console-script entry point. A bug ends in one line, not a traceback (which may show
    a secret); ``UNTHROTTLE_DEBUG=1`` shows the traceback."""
    try:
        app()
    except Exception as error:
        if os.environ.get("UNTHROTTLE_DEBUG") == "1":
            raise
        fail(f"internal error ({type(error).__name__}: {plain(error, one_line=True)}); "
             "UNTHROTTLE_DEBUG=1 shows where", 1)  # fmt: skip
        sys.exit(1)
