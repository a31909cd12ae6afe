"""``unthrottle recommend``: recommendations for a cluster's Deployments, StatefulSets and
DaemonSets from its Prometheus.

In three steps: every option is checked before any work (:func:`_request`, the
Prometheus options, ``--output``, the kubeconfig), the scan runs under the overall
``--deadline`` with a progress display on a terminal (:func:`_scan`), and the report is
written only then, atomically.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from unthrottle.cli import checks
from unthrottle.cli.common import describe_kube_error, err, fail, kube_server, load_kube_config
from unthrottle.cli.common import note as say
from unthrottle.cli.deadline import Deadline
from unthrottle.cli.prometheus_opts import (
    BasicAuth,
    BearerToken,
    BearerTokenFile,
    CaBundle,
    Header,
    Insecure,
    Retries,
    Timeout,
    prometheus_config,
)
from unthrottle.cli.report_cmd import check_format, terminal_options, write_output
from unthrottle.evidence.fetching import CONCURRENCY, QUERIES_WITH_OWNERS
from unthrottle.kube.workloads import DeploymentInfo, KubeWorkloadStore, WorkloadStore
from unthrottle.metrics.promql import recording_rules
from unthrottle.metrics.source import MetricsError, PrometheusSource
from unthrottle.model.owners import DEPLOYMENT, KINDS, Owners
from unthrottle.model.selector import SelectorError, parse_selector
from unthrottle.recommend import Policy, PolicyError, Strategy
from unthrottle.report import DIRECTORY_FORMATS, Report, render
from unthrottle.report.html import MAX_PLOTS
from unthrottle.scan import (
    History,
    ScanError,
    ScanRequest,
    assess,
    gather,
    kinds_text,
    select,
    with_series,
)
from unthrottle.scan.advise import usable_cpus
from unthrottle.units import parse_cpu

MAX_CONCURRENCY = 64
"""Queries in flight: Prometheus evaluates 20 at once by default; more only queue there."""
KUBE_TIMEOUT_S = 30.0
"""A Kubernetes API call's timeout, s: at most this, and at most half the deadline, so a
hung call is reported as what it is before the deadline ends the command."""
_POLICY_FLAGS = {
    "targetThrottleRatio": "--target",
    "strategy": "--strategy",
    "headroom": "--headroom",
    "limits.min": "--min-limit",
    "limits.max": "--max-limit",
    "limits.maxStepUp": "--max-step-up",
    "limits.maxStepDown": "--max-step-down",
}


class _Described:
    """A :class:`WorkloadStore` whose failures say, in a few words, what went wrong."""

    def __init__(self, store: WorkloadStore, timeout_s: float) -> None:
        self.store, self.timeout_s = store, timeout_s

    def deployments(
        self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,)
    ) -> list[DeploymentInfo]:
        try:
            return self.store.deployments(namespaces, kinds)
        except Exception as error:
            raise RuntimeError(describe_kube_error(error, self.timeout_s)) from None

    def pod_owners(self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,),
                   listed: Iterable[DeploymentInfo] | None = None) -> Owners:  # fmt: skip
        try:
            return self.store.pod_owners(namespaces, kinds, listed)
        except Exception as error:
            raise RuntimeError(describe_kube_error(error, self.timeout_s)) from None


def _store(kubeconfig: Path | None, timeout_s: float) -> WorkloadStore:
    from kubernetes import client

    load_kube_config(kubeconfig, hint="; or run with --no-cluster")
    store = KubeWorkloadStore(client.CoreV1Api(), client.AppsV1Api(), timeout_s=timeout_s)
    return _Described(store, timeout_s)


@dataclass(frozen=True)
class _Run:
    """Where the scan reads from, under which deadline, and how the report names them."""

    source: PrometheusSource
    store: WorkloadStore | None
    deadline: Deadline
    window: str
    prometheus: str


def _cpu(value: str, option: str) -> int:
    try:
        return parse_cpu(value)
    except ValueError:
        raise fail(f"{option}: {value!r} is not a CPU quantity (500m, 2)", 2) from None


_KIND_NAMES = {**{k.lower(): k for k in KINDS}, "deploy": DEPLOYMENT, "sts": "StatefulSet",
               "ds": "DaemonSet"}  # fmt: skip
"""``--kind`` as kubectl takes kinds: any case, plural or short (deploy, sts, ds)."""


def _kinds(given: list[str] | None) -> tuple[str, ...]:
    """The kinds ``--kind`` names, in :data:`KINDS` order; every kind when none is given."""
    if not given:
        return KINDS
    found = set()
    for value in given:
        for part in (p.strip() for p in value.split(",") if p.strip()):
            kind = _KIND_NAMES.get(part.lower()) or _KIND_NAMES.get(part.lower().removesuffix("s"))
            if kind is None:
                raise fail(f"--kind: {part!r} is not one of {', '.join(KINDS)} (a Job's or a "
                           "CronJob's pods run to completion: no limit to size)", 2)  # fmt: skip
            found.add(kind)
    return tuple(k for k in KINDS if k in found)


def _request(*, window: str, target: float, strategy: Strategy, namespace: list[str] | None,
             selector: str, history: str, concurrency: int, jobs: int | None,
             top: int | None, cfs_period: str, bounds: dict[str, Any],
             kinds: tuple[str, ...] = KINDS) -> ScanRequest:  # fmt: skip
    """The scan request, every option in it checked and named when bad."""
    window_s = checks.duration(window, "--window", at_least_s=60)
    period_us = checks.cfs_period(cfs_period, "--cfs-period")
    if history not in {"auto", "raw", "recorded"}:
        raise fail(f"--history: {history!r} is not auto, raw or recorded", 2)
    try:
        policy = Policy(
            target_ratio=target, strategy=strategy, headroom=bounds["headroom"],
            min_millicores=_cpu(bounds["min_limit"], "--min-limit"),
            max_millicores=_cpu(bounds["max_limit"], "--max-limit"),
            max_step_up=bounds["max_step_up"], max_step_down=bounds["max_step_down"],
        )  # fmt: skip
    except PolicyError as error:
        reason = str(error).removeprefix(f"{error.field}: ")
        raise fail(f"{_POLICY_FLAGS.get(error.field, error.field)}: {reason}", 2) from None
    try:
        wanted = parse_selector(selector)
    except SelectorError as error:
        raise fail(f"--selector: {error}", 2) from None
    checks.whole(concurrency, "--concurrency", 1, MAX_CONCURRENCY,
                 " (Prometheus runs 20 queries at once by default)")  # fmt: skip
    checks.whole(top, "--top", 1)
    checks.whole(jobs, "--jobs", 1)
    cpus = usable_cpus()
    if jobs is not None and jobs > cpus:
        say(f"--jobs {jobs}: this machine has {cpus} usable CPUs; using {cpus}")
        jobs = cpus
    return ScanRequest(
        window_s=window_s, now=time.time(), policy=policy,
        namespaces=checks.names(namespace, "--namespace"), selector=wanted,
        history=History(history), concurrency=concurrency, jobs=jobs,
        cfs_period_us=period_us, cfs_period_from="--cfs-period", kinds=kinds,
    )  # fmt: skip


PLOTTED_FORMATS = frozenset({"html"})
"""Formats that draw plots: only they read the plotted containers' series (3 more queries)."""


def _scan(request: ScanRequest, run: _Run, *, plots: bool = False) -> Report:
    """Select, gather and assess under the deadline, with progress on a terminal; with
    ``plots``, then read the series of the containers the report plots."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with run.deadline, Progress(*columns, console=err, transient=True,
                                disable=not err.is_terminal) as progress:  # fmt: skip
        task = progress.add_task("starting", total=None)
        run.deadline.before_exit = progress.stop

        def step(doing: str) -> None:
            run.deadline.step(doing)
            progress.update(task, description=doing)

        try:
            if run.store is not None:
                step(f"reading {kinds_text(request)} from the Kubernetes API at {kube_server()}")
            else:
                step(f"asking Prometheus at {run.prometheus}")
            selection = select(request, run.store, run.source)
            step(f"querying Prometheus at {run.prometheus}")
            done = [0]
            total = QUERIES_WITH_OWNERS - (2 if selection.owners is not None else 0)

            def answered(metric: str) -> None:
                done[0] += 1
                step(f"querying Prometheus at {run.prometheus}: {done[0]} of {total} "
                     f"answered ({metric})")  # fmt: skip

            found, problems = gather(request, run.source, selection, on_query=answered)
            step("computing recommendations")
            result = assess(request, selection, found, problems=problems)
            if plots and result.fatal is None:
                step(f"querying Prometheus at {run.prometheus} for the plotted series")
                result = with_series(result, run.source, max_plots=MAX_PLOTS,
                                     concurrency=request.concurrency)  # fmt: skip
        except (ScanError, MetricsError) as error:
            raise fail(str(error), 1) from None
    if result.fatal is not None:
        raise fail(result.fatal.message, 1)
    for problem in result.problems:
        say(problem.message)
    return Report.from_scan(result, window=run.window, prometheus=run.prometheus)


def recommend_command(
    context: typer.Context,
    prometheus: Annotated[str, typer.Option(help="Prometheus (or compatible) base URL.")],
    namespace: Annotated[
        list[str] | None, typer.Option(help="Namespaces to cover (repeat); default: all.")
    ] = None,
    window: Annotated[str, typer.Option(help="History to read, e.g. 7d, 24h, 1h30m.")] = "7d",
    target: Annotated[float, typer.Option(help="Throttle ratio to stay under.")] = 0.05,
    strategy: Annotated[
        Strategy, typer.Option(case_sensitive=False, help="LimitOnly, BurstPreferred or Auto.")
    ] = Strategy.AUTO,
    headroom: Annotated[
        float, typer.Option(help="Added to what the evidence needs (0.1 = +10 %).")
    ] = 0.1,
    min_limit: Annotated[
        str, typer.Option(help="Never recommend a CPU limit below this.")
    ] = "100m",
    max_limit: Annotated[str, typer.Option(help="Never recommend a CPU limit above this.")] = "8",
    max_step_up: Annotated[
        float, typer.Option(help="One recommendation raises a limit at most this many times.")
    ] = 2.0,
    max_step_down: Annotated[
        float, typer.Option(help="One recommendation lowers a limit to no less than this share.")
    ] = 0.8,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="table, json, yaml, csv, markdown, html or kustomize (a directory: --output).",
        ),
    ] = "table",
    output: Annotated[
        Path | None, typer.Option(help="Write here instead of stdout (checked first).")
    ] = None,
    no_cluster: Annotated[
        bool, typer.Option("--no-cluster", help="Take everything from kube-state-metrics.")
    ] = False,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig [default: in-cluster, else $KUBECONFIG / ~/.kube/config]."),
    ] = None,
    bearer_token_file: BearerTokenFile = None,
    ca_bundle: CaBundle = None,
    insecure: Insecure = False,
    header: Header = None,
    timeout: Timeout = 30.0,
    selector: Annotated[
        str,
        typer.Option(
            "--selector",
            "-l",
            help="Workload label selector, as kubectl -l: app=web,tier!=batch.",
        ),
    ] = "",
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            show_default=False,
            help="Kinds of workload to cover (repeat, or a,b): Deployment, StatefulSet, "
            "DaemonSet [default: all three].",
        ),
    ] = None,
    bearer_token: BearerToken = None,
    basic_auth: BasicAuth = None,
    retries: Retries = 3,
    concurrency: Annotated[
        int, typer.Option(help=f"Queries in flight at once (1-{MAX_CONCURRENCY}).")
    ] = CONCURRENCY,
    top: Annotated[
        int | None,
        typer.Option(show_default=False, help="Only the N most harmful workloads."),
    ] = None,
    history: Annotated[
        str,
        typer.Option(
            help="auto, raw or recorded: recorded reads the series of unthrottle's "
            "recording rules (unthrottle prometheus-rules); auto does when they "
            "cover the window."
        ),
    ] = "auto",
    jobs_option: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            show_default=False,
            help="Processes computing recommendations (default and at most: the usable CPUs).",
        ),
    ] = None,
    deadline: Annotated[
        str,
        typer.Option(help="Give up after this long in all, e.g. 5m, 90s, 1h."),
    ] = "5m",
    cfs_period: Annotated[
        str,
        typer.Option(
            "--cfs-period",
            help="The kubelets' --cpu-cfs-quota-period (1ms-1s), for containers without the "
            "node agent's series; where they exist, each container's own period is used.",
        ),
    ] = "100ms",
) -> None:
    """Recommend CPU limits, burst and GOMAXPROCS for Deployments, StatefulSets and DaemonSets
    from Prometheus metrics."""
    config = prometheus_config(  # first: it hides the secrets from anything printed after
        prometheus, bearer_token=bearer_token, bearer_token_file=bearer_token_file,
        basic_auth=basic_auth, ca_bundle=ca_bundle, insecure=insecure, header=header,
        timeout=timeout, retries=retries, context=context,
    )  # fmt: skip
    check_format(fmt, output)
    checks.output_path(output, directory=fmt in DIRECTORY_FORMATS)
    request = _request(window=window, target=target, strategy=strategy, namespace=namespace,
                       selector=selector, history=history, concurrency=concurrency,
                       jobs=jobs_option, top=top, cfs_period=cfs_period,
                       bounds={"headroom": headroom, "min_limit": min_limit,
                               "max_limit": max_limit, "max_step_up": max_step_up,
                               "max_step_down": max_step_down},
                       kinds=_kinds(kind))  # fmt: skip
    deadline_s = checks.duration(deadline, "--deadline")
    if no_cluster and kubeconfig is not None:
        raise fail("--kubeconfig and --no-cluster: give one or the other", 2)
    kube_timeout_s = min(KUBE_TIMEOUT_S, deadline_s / 2)
    run = _Run(
        source=PrometheusSource(config),
        store=None if no_cluster else _store(kubeconfig, kube_timeout_s),
        deadline=Deadline(deadline_s, deadline), window=window, prometheus=config.url,
    )  # fmt: skip
    report = _scan(request, run, plots=fmt in PLOTTED_FORMATS)
    if top is not None and len(report.workloads) > top:
        say(f"showing the {top} most harmful of {len(report.workloads)} {report.noun}s (--top)")
        report = report.top(top)
    write_output(render(report, fmt, terminal_options()), output)


def prometheus_rules_command() -> None:
    """Print the Prometheus recording rules that make `recommend` cheap on big clusters."""
    sys.stdout.write(yaml.safe_dump(recording_rules(), sort_keys=False, width=1000))
