"""Start the operator: clients, the reconciler, the handlers, and Kopf's own loop."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import kopf

from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusSource
from unthrottle.operator.evidence import IncrementalReader
from unthrottle.operator.handlers import register
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.operator.telemetry import Telemetry


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


def run(settings: OperatorSettings, options: RunOptions) -> None:
    """Run until SIGTERM / SIGINT."""
    from kubernetes import client
    from prometheus_client import start_http_server

    source = PrometheusSource(settings.prometheus)
    telemetry = Telemetry(queries=lambda: source.queries)
    api = client.ApiClient()
    objects = KubeObjects(api, timeout_s=settings.api_timeout_s)
    reconciler = Reconciler(
        settings, metrics=source,
        workloads=KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api),
                                    timeout_s=settings.api_timeout_s),
        objects=objects,
        evidence=IncrementalReader(source, objects,
                                   concurrency=settings.concurrency,
                                   max_bytes=settings.checkpoint_max_bytes),
        deployments=KubeDeployments(api, timeout_s=settings.api_timeout_s),
        telemetry=telemetry,
    )  # fmt: skip
    if options.metrics is not None:
        start_http_server(options.metrics[1], options.metrics[0], registry=telemetry.registry)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, settings)
    kopf.configure(log_format=kopf.LogFormat.JSON if options.log_json else kopf.LogFormat.PLAIN,
                   verbose=options.debug, debug=options.debug)  # fmt: skip
    logging.getLogger("unthrottle").setLevel(logging.INFO)
    asyncio.run(kopf.operator(
        registry=registry,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=options.peering is None,
        peering_name=options.peering,  # given only with --peering: Kopf then requires its CRD
        priority=options.priority,
        liveness_endpoint=options.liveness,
    ))  # fmt: skip
