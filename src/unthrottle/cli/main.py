"""``unthrottle``: find CFS throttling, prove it, fix it."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
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
from unthrottle.cgroups import CgroupError, detect_layout
from unthrottle.cli import checks
from unthrottle.cli.common import fail, load_kube_config, run_guarded
from unthrottle.cli.crd_cmd import crd_command
from unthrottle.cli.operator_cmd import operator_command
from unthrottle.cli.recommend_cmd import prometheus_rules_command, recommend_command
from unthrottle.cli.report_cmd import report_command

app = typer.Typer(
    help="Find CFS throttling, fix it with the smallest CPU limit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a local may hold a token
)
app.command("recommend")(recommend_command)
app.command("prometheus-rules")(prometheus_rules_command)
app.command("operator")(operator_command)
app.command("crd")(crd_command)
app.command("report")(report_command)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit(0)


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
    if writer is not None:
        writer.release()  # the cgroups as the kubelet made them (agent/burst.py)


def _core_api(kubeconfig: Path | None) -> Any:
    """A CoreV1Api: in-cluster when there, else from the kubeconfig."""
    from kubernetes import client

    load_kube_config(kubeconfig, hint="; or run with --standalone")
    return client.CoreV1Api()


def main() -> None:
    """Console-script entry point. A bug ends in one line, not a traceback (which may show
    a secret); ``UNTHROTTLE_DEBUG=1`` shows the traceback."""
    run_guarded(app)
