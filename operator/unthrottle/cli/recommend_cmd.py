"""``unthrottle recommend``: recommendations for a cluster's Deployments from its Prometheus."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from unthrottle.cfs.settings import format_cpu
from unthrottle.cli.common import err, fail, load_kube_config
from unthrottle.kube.workloads import ContainerSpec, KubeWorkloadStore
from unthrottle.metrics.advise import Job, advise_all
from unthrottle.metrics.evidence import (
    CONCURRENCY,
    QUERIES_WITH_OWNERS,
    ContainerEvidence,
    WorkloadKey,
    deployment_labels,
    fetch,
    recorded_covers,
)
from unthrottle.metrics.promql import recording_rules, seconds
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource
from unthrottle.model.owners import Owners
from unthrottle.model.selector import Selector, SelectorError, parse_selector
from unthrottle.recommend import (
    Current,
    Policy,
    PolicyError,
    Recommendation,
    Runtime,
    Strategy,
)


def _row(item: ContainerEvidence, rec: Recommendation | None) -> dict[str, Any]:
    return {
        "name": item.key.container,
        "current": {
            "limit_millicores": item.limit_millicores,
            "request_millicores": item.request_millicores,
            "burst_us": item.burst_us,
            "gomaxprocs": item.gomaxprocs_env,
        },
        "throttle_ratio": item.throttle_ratio(),
        "demand": item.demand_millicores(),
        "evidence": item.kind,
        "pods": len(item.pods),
        "recommendation": None if rec is None else rec.to_json(),
    }


def harm(row: dict[str, Any], target: float) -> float:
    """Throttling × how far over the target: the order people should look in."""
    ratio = row["throttle_ratio"] or 0.0
    return ratio * max(0.0, ratio - target)


def document(found: dict[Any, ContainerEvidence], recs: dict[Any, Recommendation | None],
             window: str, target: float) -> dict[str, Any]:  # fmt: skip
    """The JSON document of issue 5 (fields may be added, never removed)."""
    workloads: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key in sorted(found):
        workloads.setdefault((key.namespace, key.deployment), []).append(
            _row(found[key], recs[key])
        )
    ordered = sorted(workloads.items(), key=lambda kv: -max(harm(r, target) for r in kv[1]))
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window": window,
        "target": target,
        "workloads": [
            {"namespace": ns, "deployment": deploy, "containers": rows}
            for (ns, deploy), rows in ordered
        ],
    }


def _cpu(millicores: int | None) -> str:
    return "none" if millicores is None else format_cpu(millicores)


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def render(doc: dict[str, Any], fmt: str) -> str:
    """The document in the requested format."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False))
    rows = []
    for w in doc["workloads"]:
        for c in w["containers"]:
            rec = c["recommendation"] or {}
            rows.append({
                "namespace": w["namespace"], "deployment": w["deployment"],
                "container": c["name"], "evidence": c["evidence"], "pods": c["pods"],
                "current_limit": _cpu(c["current"]["limit_millicores"]),
                "throttle_ratio": _ratio(c["throttle_ratio"]),
                "demand_p99_max": (f"{_cpu(c['demand']['p99_millicores'])} / "
                                   f"{_cpu(c['demand']['max_millicores'])}"
                                   if c["demand"] else ""),
                "recommended_limit": _cpu(rec.get("limit_millicores")) if rec else "",
                "burst_ms": f"{rec['burst_us'] / 1000:g}" if rec else "",
                "gomaxprocs": rec.get("gomaxprocs") or "",
                "expected_throttle_ratio": _ratio(rec.get("expected_throttle_ratio")),
                "confidence": f"{rec['confidence']:.2f}" if rec else "",
                # the last step that shaped the value (a bound, the burst, the headroom);
                # JSON, YAML and CSV's "reasons" keep the whole chain
                "reason": (rec.get("reasons") or [""])[-1] if rec else "no evidence in the window",
                "reasons": " | ".join(rec.get("reasons") or []) if rec else "",
            })  # fmt: skip
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["namespace"])
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()
    table = Table(title=f"unthrottle recommend: window {doc['window']}, target {doc['target']:g}",
                  title_justify="left")  # fmt: skip
    columns = ["namespace", "deployment", "container", "current_limit", "throttle_ratio",
               "demand_p99_max", "recommended_limit", "burst_ms", "gomaxprocs",
               "expected_throttle_ratio", "evidence", "confidence", "reason"]  # fmt: skip
    for name in columns:
        table.add_column(name.replace("_", " ").replace("p99 max", "p99 / max"), overflow="fold")
    for r in rows:
        table.add_row(*(str(r[c]) for c in columns))
    # as wide as the terminal when there is one (never narrower than 120), else 200
    width = max(120, shutil.get_terminal_size((200, 24)).columns) if sys.stdout.isatty() else 200
    console = Console(file=io.StringIO(), width=width)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def _store(kubeconfig: Path | None) -> KubeWorkloadStore:
    from kubernetes import client

    load_kube_config(kubeconfig, hint="; or run with --no-cluster")
    return KubeWorkloadStore(client.CoreV1Api(), client.AppsV1Api())


def _from_cluster(
    kubeconfig: Path | None, namespaces: list[str], wanted: Selector
) -> tuple[dict[WorkloadKey, ContainerSpec], Owners, set[tuple[str, str]]]:
    """The selected Deployments' containers, pod owners and names, from the Kubernetes API."""
    store = _store(kubeconfig)
    specs: dict[WorkloadKey, ContainerSpec] = {}
    chosen = set()
    try:
        for deploy in store.deployments(namespaces):
            if not wanted.matches(deploy.labels):
                continue
            chosen.add((deploy.namespace, deploy.name))
            for spec in deploy.containers.values():
                specs[WorkloadKey(deploy.namespace, deploy.name, spec.name)] = spec
        owners = store.pod_owners(namespaces)
    except Exception as error:  # the API client raises many kinds
        raise fail(f"cannot read Deployments from the Kubernetes API: {error}", 1) from None
    return specs, owners, chosen


def _chosen_by_labels(
    source: PrometheusSource, namespaces: list[str], wanted: Selector
) -> set[tuple[str, str]]:
    """The Deployments whose kube-state-metrics labels match (``--no-cluster``)."""
    try:
        exported = deployment_labels(source, namespaces)
    except MetricsError as error:
        raise fail(str(error), 1) from None
    if not exported:
        raise fail(
            "--selector with --no-cluster needs kube-state-metrics' kube_deployment_labels, "
            "and there are none: kube-state-metrics exports Deployment labels only when "
            "allowed (--metric-labels-allowlist=deployments=[app,...])",
            1,
        )
    return {key for key, labels in exported.items() if wanted.matches_exported(labels)}


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
    fmt: Annotated[str, typer.Option("--format", help="table, json, yaml or csv.")] = "table",
    output: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
    no_cluster: Annotated[
        bool, typer.Option("--no-cluster", help="Take everything from kube-state-metrics.")
    ] = False,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig [default: in-cluster, else $KUBECONFIG / ~/.kube/config]."),
    ] = None,
    bearer_token_file: Annotated[Path | None, typer.Option(help="Re-read when it changes.")] = None,
    ca_bundle: Annotated[Path | None, typer.Option(help="CA certificates for TLS.")] = None,
    insecure: Annotated[bool, typer.Option(help="Skip TLS verification.")] = False,
    header: Annotated[
        list[str] | None, typer.Option(help="Extra header NAME=VALUE (repeat), e.g. X-Scope-OrgID.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per query.")] = 30.0,
    selector: Annotated[
        str,
        typer.Option(
            "--selector",
            "-l",
            help="Deployment label selector, as kubectl -l: app=web,tier!=batch.",
        ),
    ] = "",
    bearer_token: Annotated[
        str | None,
        typer.Option(
            envvar="UNTHROTTLE_PROMETHEUS_TOKEN",
            show_default=False,
            help="Bearer token (better from the environment than the command line).",
        ),
    ] = None,
    basic_auth: Annotated[
        str | None,
        typer.Option(
            envvar="UNTHROTTLE_PROMETHEUS_BASIC_AUTH",
            show_default=False,
            help="USER:PASSWORD (better from the environment).",
        ),
    ] = None,
    retries: Annotated[int, typer.Option(help="Retries on errors and 429/5xx, backing off.")] = 3,
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
    if fmt not in {"table", "json", "yaml", "csv"}:
        raise fail(f"--format: {fmt!r} is not table, json, yaml or csv", 2)
    if insecure:
        err.print("note: --insecure: the Prometheus server's certificate is not checked",
                  highlight=False)  # fmt: skip
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
    auth = None
    if basic_auth is not None:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise fail("--basic-auth: expected USER:PASSWORD", 2)
        auth = (user, password)
    if retries < 0 or concurrency < 1 or any(n is not None and n < 1 for n in (jobs_option, top)):
        raise fail("--retries must be 0 or more; --concurrency, --jobs and --top 1 or more", 2)
    headers = {}
    for pair in header or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise fail(f"--header: {pair!r} is not NAME=VALUE", 2)
        headers[name] = value
    source = PrometheusSource(PrometheusConfig(
        url=prometheus, bearer_token=bearer_token, bearer_token_file=bearer_token_file,
        basic_auth=auth, ca_bundle=ca_bundle, insecure=insecure, headers=headers,
        timeout_s=timeout, retries=retries,
    ))  # fmt: skip
    specs: dict[WorkloadKey, ContainerSpec] = {}
    owners: Owners | None = None
    chosen: set[tuple[str, str]] | None = None  # Deployments the selector lets through
    if not no_cluster:
        specs, owners, chosen = _from_cluster(kubeconfig, namespace or [], wanted)
    elif wanted.requirements:
        chosen = _chosen_by_labels(source, namespace or [], wanted)
    recorded = history == "recorded"
    if history == "auto":
        try:
            recorded = recorded_covers(source, namespace or [], window_s)
        except MetricsError as error:
            raise fail(str(error), 1) from None
    if recorded:
        err.print("note: reading the series of unthrottle's recording rules", highlight=False)
    total = QUERIES_WITH_OWNERS - (2 if owners is not None else 0)
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("querying Prometheus", total=total)

        def step(metric: str) -> None:
            progress.update(task, advance=1, description=f"querying {metric}")

        try:
            found = fetch(source, namespace or [], window_s, owners=owners, on_query=step,
                          concurrency=concurrency, recorded=recorded)  # fmt: skip
        except MetricsError as error:
            raise fail(str(error), 1) from None
    if chosen is not None:
        found = {k: v for k, v in found.items() if (k.namespace, k.deployment) in chosen}
    for key, spec in specs.items():  # the API's settings; Deployments with no series listed
        item = found.setdefault(key, ContainerEvidence(key))
        item.limit_millicores, item.request_millicores = (
            spec.limit_millicores,
            spec.request_millicores,
        )
        item.gomaxprocs_env, item.burst_us = spec.gomaxprocs_env, spec.burst_us
    where = ", ".join(namespace) if namespace else "any namespace"
    if selector.strip():
        where += f" matching {selector.strip()!r}"
    if not found:
        source_of = (
            "kube-state-metrics' kube_pod_owner and kube_replicaset_owner series are needed "
            "with --no-cluster"
            if no_cluster
            else "the Kubernetes API lists none"
        )
        raise fail(f"no Deployments found in {where}: {source_of}", 1)
    if all(item.periods < 1 for item in found.values()):
        raise fail(
            f"no CPU counters for the Deployments in {where}: neither cAdvisor's "
            "container_cpu_cfs_periods_total nor the unthrottle agent's. Is the kubelet's "
            "/metrics/cadvisor endpoint scraped (job kubelet, metrics_path /metrics/cadvisor), "
            "or the agent's /metrics?",
            1,
        )
    if not any(item.kind == "period" for item in found.values()):
        note = (
            "note: no unthrottle agent series; recommending from cAdvisor counters "
            "(coarse: 15-60 s samples cannot show 100 ms bursts)"
        )
        err.print(note, highlight=False)
    jobs: list[Job] = []
    for key, item in found.items():
        known = specs.get(key)
        current = Current(
            item.limit_millicores,
            min(item.request_millicores, item.limit_millicores or 10**9),
            runtime=known.runtime if known else Runtime.UNKNOWN,
            go_at_least_1_25=False,  # unknown from outside the image: assume an older Go
            gomaxprocs_env=item.gomaxprocs_env,
            burst_us=item.burst_us,
        )
        jobs.append((item, current, policy, window_s))
    recs: dict[Any, Recommendation | None] = dict(
        zip(found, advise_all(jobs, jobs_option), strict=True)
    )
    doc = document(found, recs, window, target)
    if top is not None and len(doc["workloads"]) > top:
        err.print(f"note: showing the {top} most harmful of {len(doc['workloads'])} "
                  "Deployments (--top)", highlight=False)  # fmt: skip
        doc["workloads"] = doc["workloads"][:top]
    text = render(doc, fmt)
    if output is not None:
        output.write_text(text)
    else:
        sys.stdout.write(text)


def prometheus_rules_command() -> None:
    """Print the Prometheus recording rules that make `recommend` cheap on big clusters."""
    sys.stdout.write(yaml.safe_dump(recording_rules(), sort_keys=False, width=1000))
