"""``unthrottle recommend``: recommendations for a cluster's Deployments from its Prometheus."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.progress import Progress

from unthrottle.cli.common import err, fail, load_kube_config
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
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.evidence import CONCURRENCY, QUERIES_WITH_OWNERS
from unthrottle.metrics.promql import recording_rules, seconds
from unthrottle.metrics.source import MetricsError, PrometheusSource
from unthrottle.model.selector import SelectorError, parse_selector
from unthrottle.recommend import Policy, PolicyError, Strategy
from unthrottle.report import Report, render
from unthrottle.scan import History, ScanError, ScanRequest, assess, gather, select


def _store(kubeconfig: Path | None) -> KubeWorkloadStore:
    from kubernetes import client

    load_kube_config(kubeconfig, hint="; or run with --no-cluster")
    return KubeWorkloadStore(client.CoreV1Api(), client.AppsV1Api())


def recommend_command(
    prometheus: Annotated[str, typer.Option(help="Prometheus (or compatible) URL.")],
    namespace: Annotated[
        list[str] | None, typer.Option(help="Namespaces to cover (repeat); default: all.")
    ] = None,
    window: Annotated[str, typer.Option(help="History to read, e.g. 7d, 24h.")] = "7d",
    target: Annotated[float, typer.Option(help="Throttle ratio to stay under.")] = 0.05,
    strategy: Annotated[
        Strategy, typer.Option(case_sensitive=False, help="LimitOnly, BurstPreferred or Auto.")
    ] = Strategy.AUTO,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="table, json, yaml, csv, markdown, html or kustomize (a directory: --output).",
        ),
    ] = "table",
    output: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
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
            help="Deployment label selector, as kubectl -l: app=web,tier!=batch.",
        ),
    ] = "",
    bearer_token: BearerToken = None,
    basic_auth: BasicAuth = None,
    retries: Retries = 3,
    concurrency: Annotated[int, typer.Option(help="Queries in flight at once.")] = CONCURRENCY,
    top: Annotated[
        int | None,
        typer.Option(show_default=False, help="Only the N most harmful Deployments."),
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
            help="Processes computing recommendations [default: usable CPUs].",
        ),
    ] = None,
) -> None:
    """Recommend CPU limits, burst and GOMAXPROCS for Deployments from Prometheus metrics."""
    check_format(fmt, output)
    window_s = seconds(window)
    if window_s is None or window_s <= 0:
        raise fail(f"--window: {window!r} is not a duration such as 7d, 24h or 30m", 2)
    if history not in {"auto", "raw", "recorded"}:
        raise fail(f"--history: {history!r} is not auto, raw or recorded", 2)
    try:
        policy = Policy(target_ratio=target, strategy=strategy)
    except PolicyError as error:
        raise fail(str(error), 2) from None
    try:
        wanted = parse_selector(selector)
    except SelectorError as error:
        raise fail(f"--selector: {error}", 2) from None
    if concurrency < 1 or any(n is not None and n < 1 for n in (jobs_option, top)):
        raise fail("--concurrency, --jobs and --top must be 1 or more", 2)
    source = PrometheusSource(prometheus_config(
        prometheus, bearer_token=bearer_token, bearer_token_file=bearer_token_file,
        basic_auth=basic_auth, ca_bundle=ca_bundle, insecure=insecure, header=header,
        timeout=timeout, retries=retries,
    ))  # fmt: skip
    request = ScanRequest(
        window_s=window_s, now=time.time(), policy=policy, namespaces=tuple(namespace or ()),
        selector=wanted, history=History(history), concurrency=concurrency, jobs=jobs_option,
    )  # fmt: skip
    store = None if no_cluster else _store(kubeconfig)
    try:
        selection = select(request, store, source)
        with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
            total = QUERIES_WITH_OWNERS - (2 if selection.owners is not None else 0)
            task = progress.add_task("querying Prometheus", total=total)

            def step(metric: str) -> None:
                progress.update(task, advance=1, description=f"querying {metric}")

            found, problems = gather(request, source, selection, on_query=step)
        result = assess(request, selection, found, problems=problems)
    except (ScanError, MetricsError) as error:
        raise fail(str(error), 1) from None
    if result.fatal is not None:
        raise fail(result.fatal.message, 1)
    for problem in result.problems:
        err.print(f"note: {problem.message}", highlight=False)
    report = Report.from_scan(result, window=window, prometheus=prometheus)
    if top is not None and len(report.workloads) > top:
        err.print(f"note: showing the {top} most harmful of {len(report.workloads)} "
                  "Deployments (--top)", highlight=False)  # fmt: skip
        report = report.top(top)
    write_output(render(report, fmt, terminal_options()), output)


def prometheus_rules_command() -> None:
    """Print the Prometheus recording rules that make `recommend` cheap on big clusters."""
    sys.stdout.write(yaml.safe_dump(recording_rules(), sort_keys=False, width=1000))
