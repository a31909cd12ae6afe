"""Start the operator: clients, the reconciler, the handlers, and Kopf's own loop (and,
with ``--webhook``, the admission webhook's HTTPS server)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.pods import KubePods
from unthrottle.kube.watched import RESOURCES, WatchedWorkloadStore
from unthrottle.metrics.source import PrometheusSource
from unthrottle.operator.admission import HANDLER_ID, KubeOwners, PodAdmission
from unthrottle.operator.handlers import register
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.operator.telemetry import Telemetry
from unthrottle.scan.readers import IncrementalReader

_log = logging.getLogger("unthrottle.operator")

PROBE_TIMEOUT_S = 5.0
"""How long the probe waits for the API server's answer (the chart's probes wait 10 s)."""


@dataclass(frozen=True, slots=True)
class WebhookOptions:
    """The admission webhook's HTTPS server (``--webhook``, ``--webhook-tls-dir``)."""

    addr: str
    port: int
    tls_dir: Path
    """Holds ``tls.crt`` and ``tls.key`` (a ``kubernetes.io/tls`` Secret mounted there)."""
    file_check_s: float = 60.0
    """How often Kopf re-reads the certificate files, s, and restarts its server when they
    changed: a renewed Secret reaches the mount within a minute or so (the kubelet's sync),
    so checking more often gains little."""

    @property
    def certfile(self) -> Path:
        return self.tls_dir / "tls.crt"

    @property
    def pkeyfile(self) -> Path:
        return self.tls_dir / "tls.key"


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How Kopf runs (the command line's options)."""

    liveness: str | None = None
    """``http://HOST:PORT/healthz`` for the liveness probe."""
    metrics: tuple[str, int] | None = None
    """Where the operator's own /metrics is served."""
    peering: str | None = None
    """Kopf peering object's name; None: standalone (one replica)."""
    priority: int = 0
    log_json: bool = True
    debug: bool = False
    """Kopf's own debug logging (``UNTHROTTLE_DEBUG=1``)."""
    webhook: WebhookOptions | None = None
    """Serve the admission webhook of InPlace changes; None: no webhook."""


def kopf_settings(webhook: WebhookOptions | None) -> kopf.OperatorSettings:
    """Kopf's settings before start: the admission server, when there is a webhook.

    The chart writes the MutatingWebhookConfiguration (``managed = None``): Kopf's own
    management would set ``timeoutSeconds: 30`` and ``failurePolicy`` per handler, and
    need a cluster-wide write on webhook configurations. The certificates are the chart's
    too; Kopf serves them and re-reads the files when they change."""
    settings = kopf.OperatorSettings()
    settings.admission.managed = None
    if webhook is not None:
        settings.admission.server = kopf.WebhookServer(
            addr=webhook.addr, port=webhook.port, certfile=str(webhook.certfile),
            pkeyfile=str(webhook.pkeyfile), file_check_interval=webhook.file_check_s,
        )  # fmt: skip
    return settings


def watched_store(client: Any, settings: OperatorSettings) -> WatchedWorkloadStore:
    """The workloads, ReplicaSets and pods, kept by watches on a client of their own: each
    informer holds one connection open, which must not take the reconciler's (urllib3's
    pool keeps ``connection_pool_maxsize`` of them, 5 per core by default)."""
    config = client.Configuration.get_default_copy()
    config.connection_pool_maxsize = len(RESOURCES) * max(1, len(settings.namespaces)) + 2
    api = client.ApiClient(config)
    return WatchedWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api),
                                namespaces=settings.namespaces,
                                timeout_s=settings.api_timeout_s)  # fmt: skip


def run(settings: OperatorSettings, options: RunOptions) -> None:
    """Run until SIGTERM / SIGINT."""
    from kubernetes import client
    from prometheus_client import start_http_server

    source = PrometheusSource(settings.prometheus)
    telemetry = Telemetry(queries=lambda: source.queries)
    api = client.ApiClient()
    workloads = watched_store(client, settings)
    objects = KubeObjects(api, timeout_s=settings.api_timeout_s)
    reconciler = Reconciler(
        settings, metrics=source,
        workloads=workloads,
        objects=objects,
        evidence=IncrementalReader(source, objects,
                                   concurrency=settings.concurrency,
                                   max_bytes=settings.checkpoint_max_bytes),
        deployments=KubeDeployments(api, timeout_s=settings.api_timeout_s),
        pods=KubePods(api, timeout_s=settings.api_timeout_s),
        telemetry=telemetry,
    )  # fmt: skip
    if options.metrics is not None:
        start_http_server(options.metrics[1], options.metrics[0], registry=telemetry.registry)
    admission = None
    if options.webhook is not None:
        # a client of its own: the lookups never wait for the reconciler's connections
        admission = PodAdmission(KubeOwners(), namespaces=settings.namespaces)
    version = client.VersionApi(api)

    def api_version() -> str:
        return str(version.get_code(_request_timeout=PROBE_TIMEOUT_S).git_version)

    registry = kopf.OperatorRegistry()
    register(registry, reconciler, settings, admission=admission, api_version=api_version)
    kopf.configure(log_format=kopf.LogFormat.JSON if options.log_json else kopf.LogFormat.PLAIN,
                   verbose=options.debug, debug=options.debug)  # fmt: skip
    logging.getLogger("unthrottle").setLevel(logging.INFO)
    # aiohttp would log each admission request (every pod of a Deployment, cluster-wide);
    # a pod given new limits, or allowed unchanged after an error, has a line of ours
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if options.webhook is not None:
        _log.info("admission webhook at https://%s:%d/%s (certificates in %s)",
                  options.webhook.addr, options.webhook.port, HANDLER_ID,
                  options.webhook.tls_dir)  # fmt: skip
    asyncio.run(kopf.operator(
        registry=registry,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=options.peering is None,
        peering_name=options.peering,  # given only with --peering: Kopf then requires its CRD
        priority=options.priority,
        liveness_endpoint=options.liveness,
        settings=kopf_settings(options.webhook),
    ))  # fmt: skip
