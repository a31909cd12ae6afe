"""``unthrottle operator``: reconcile ThrottlePolicies (Kopf); Prometheus is its own setting."""

from __future__ import annotations

import os
import ssl
import sys
from pathlib import Path
from typing import Annotated

import typer

from unthrottle.cli import checks
from unthrottle.cli.common import fail, load_kube_config
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


def _host_port(option: str, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise fail(f"{option}: {value!r} is not HOST:PORT (e.g. 0.0.0.0:8080)", 2)
    return host.strip("[]") or "0.0.0.0", int(port)


def _tls_dir(webhook: str | None, tls_dir: Path | None) -> Path | None:
    """The certificate folder of ``--webhook``, checked now: both files there, and the key
    the certificate's (a pod that cannot serve its webhook should say so at start)."""
    if (webhook is None) != (tls_dir is None):
        raise fail("--webhook and --webhook-tls-dir: give both or neither", 2)
    if tls_dir is None:
        return None
    cert, key = tls_dir / "tls.crt", tls_dir / "tls.key"
    for path in (cert, key):
        if not path.is_file():
            raise fail(f"--webhook-tls-dir: {path} is not a file (a kubernetes.io/tls "
                       "Secret mounted there has tls.crt and tls.key)", 2)  # fmt: skip
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise fail(f"--webhook-tls-dir: {cert} and {key} are not a certificate and its key "
                   f"({error})", 2) from None  # fmt: skip
    return tls_dir


def operator_command(
    context: typer.Context,
    prometheus: Annotated[
        str,
        typer.Option(
            envvar="UNTHROTTLE_PROMETHEUS_URL",
            help="Prometheus (or compatible) URL: the operator's own setting.",
        ),
    ],
    namespace: Annotated[
        list[str] | None,
        typer.Option(help="Watch only these namespaces (repeat) [default: all]."),
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", help="Watch every namespace (the default).")
    ] = False,
    liveness: Annotated[
        str | None, typer.Option(help="HOST:PORT for the liveness probe (/healthz).")
    ] = None,
    metrics: Annotated[
        str | None, typer.Option(help="HOST:PORT for the operator's own /metrics.")
    ] = None,
    peering: Annotated[
        str | None,
        typer.Option(help="Kopf peering name, for more than one replica [default: standalone]."),
    ] = None,
    standalone: Annotated[
        bool, typer.Option("--standalone", help="No peering (one replica; the default).")
    ] = False,
    priority: Annotated[int, typer.Option(help="This replica's peering priority.")] = 0,
    peering_lifetime: Annotated[
        int,
        typer.Option(
            help="Seconds a replica's keep-alive in the peering object counts: a standby "
            "takes over at most this long after the working replica died unannounced.",
        ),
    ] = 20,
    log_format: Annotated[
        str | None,
        typer.Option(help="json or text [default: text on a terminal, json otherwise]."),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT for the admission webhook (HTTPS) that gives new pods of an "
            "InPlace change's ReplicaSet the applied CPU limits [default: no webhook].",
        ),
    ] = None,
    webhook_tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder with tls.crt and tls.key for --webhook (re-read when they change).",
        ),
    ] = None,
    status_max_workloads: Annotated[
        int, typer.Option(help="Deployments kept in a policy's status (most harmful first).")
    ] = 100,
    bearer_token_file: BearerTokenFile = None,
    ca_bundle: CaBundle = None,
    insecure: Insecure = False,
    header: Header = None,
    timeout: Timeout = 30.0,
    bearer_token: BearerToken = None,
    basic_auth: BasicAuth = None,
    retries: Retries = 3,
    cfs_period: Annotated[
        str,
        typer.Option(
            "--cfs-period",
            envvar="UNTHROTTLE_CFS_PERIOD",
            help="The kubelets' --cpu-cfs-quota-period (1ms-1s), for containers without the "
            "node agent's series; where they exist, each container's own period is used.",
        ),
    ] = "100ms",
) -> None:
    """Run the operator: keep a recommendation per Deployment in each ThrottlePolicy's status."""
    from unthrottle.operator.runner import RunOptions, WebhookOptions, run
    from unthrottle.operator.settings import OperatorSettings

    if namespace and all_namespaces:
        raise fail("--namespace and --all-namespaces: give one or the other", 2)
    if peering and standalone:
        raise fail("--peering and --standalone: give one or the other", 2)
    if log_format not in {None, "json", "text"}:
        raise fail(f"--log-format: {log_format!r} is not json or text", 2)
    checks.whole(status_max_workloads, "--status-max-workloads", 1, 1000,
                 " (a status must stay far below etcd's 1.5 MiB object limit)")  # fmt: skip
    checks.whole(peering_lifetime, "--peering-lifetime", 10, 3600,
                 " (each replica renews its keep-alive 5-10 s before it expires)")  # fmt: skip
    namespaces = checks.names(namespace, "--namespace")
    period_us = checks.cfs_period(cfs_period, "--cfs-period")
    live = None
    if liveness is not None:
        host, port = _host_port("--liveness", liveness)
        live = f"http://{host}:{port}/healthz"
    served = _host_port("--metrics", metrics) if metrics is not None else None
    tls = _tls_dir(webhook, webhook_tls_dir)
    hook = None
    if webhook is not None and tls is not None:
        addr, port = _host_port("--webhook", webhook)
        hook = WebhookOptions(addr=addr, port=port, tls_dir=tls)
    config = prometheus_config(
        prometheus, bearer_token=bearer_token, bearer_token_file=bearer_token_file,
        basic_auth=basic_auth, ca_bundle=ca_bundle, insecure=insecure, header=header,
        timeout=timeout, retries=retries, context=context,
    )  # fmt: skip
    load_kube_config(None, hint="; set KUBECONFIG, or run in a pod with a service account")
    settings = OperatorSettings(
        prometheus=config,
        namespaces=namespaces,
        status_max_workloads=status_max_workloads,
        cfs_period_us=period_us,
        peering_lifetime_s=peering_lifetime,
    )
    json_logs = (log_format or ("text" if sys.stderr.isatty() else "json")) == "json"
    run(settings, RunOptions(liveness=live, metrics=served, peering=peering,
                             priority=priority, log_json=json_logs, webhook=hook,
                             debug=os.environ.get("UNTHROTTLE_DEBUG") == "1"))  # fmt: skip
