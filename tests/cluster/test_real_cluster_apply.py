"""Against a real cluster (opt-in, as tests/cluster/test_real_cluster.py): one Apply cycle.

    UNTHROTTLE_TEST_CLUSTER=1 UNTHROTTLE_TEST_PROMETHEUS=http://prometheus:9090 \\
        KUBECONFIG=… .venv/bin/pytest -m cluster tests/cluster/test_real_cluster_apply.py

A Deployment burns CPU under a tight limit (busybox in a loop, 100m); the cluster's
Prometheus must scrape cAdvisor (or the unthrottle agent) for its counters. The
operator, run here in Apply mode against that cluster, patches the limit with its
record; the real Deployment controller rolls it out; after ``verifyFor`` the record
carries a verdict. Skipped without ``UNTHROTTLE_TEST_PROMETHEUS`` on a cluster of
KUBECONFIG.

On the tests' own control plane (no KUBECONFIG), kwok runs no container and no kernel
counts its CPU: a real Prometheus scrapes, every second, what cAdvisor would export for
the busy loop of each running pod of the namespace (:class:`BusyLoopCounters`: one core
wanted, under the CPU limit the pod has in the API, from the pod's start). The patch, the
rollout and the new pods are the real server's and controllers'; the verdict is made from
the new pods' counters.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from support.real_cluster import (
    UNTHROTTLE,
    Cluster,
    delete_policy,
)
from unthrottle.units import parse_cpu
from unthrottle_lab.children import stop

RECORD = "unthrottle.io/last-applied"
PERIOD_S = 0.1  # the kubelet's default CFS period


class BusyLoopCounters:
    """cAdvisor's CPU counters for a loop that wants one core, in every running container
    of ``namespace``, under the CPU limit its pod has in the API (read at each scrape)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        counters = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = counters.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def exposition(self) -> str:
        lines = []
        now = time.time()
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            if pod.status.phase != "Running" or pod.status.start_time is None:
                continue
            alive = max(0.0, now - pod.status.start_time.timestamp())
            for c in pod.spec.containers:
                limit = parse_cpu((c.resources.limits or {}).get("cpu", "0")) / 1000 or 1.0
                labels = (f'namespace="{self.namespace}",pod="{pod.metadata.name}",'
                          f'container="{c.name}"')  # fmt: skip
                throttled = alive / PERIOD_S if limit < 1.0 else 0.0
                for name, value in (
                    ("usage_seconds", min(1.0, limit) * alive),
                    ("cfs_periods", alive / PERIOD_S),
                    ("cfs_throttled_periods", throttled),
                    ("cfs_throttled_seconds", max(0.0, 1.0 - limit) * alive),
                ):
                    lines.append(f"container_cpu_{name}_total{{{labels}}} {value:.6f}")
        return "\n".join(lines) + "\n"

    def __enter__(self) -> BusyLoopCounters:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture(scope="module")
def burn_namespace() -> str:
    return f"unthrottle-apply-{os.getpid()}"


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, apis: tuple[Any, Any], burn_namespace: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # fmt: skip
    """The Prometheus that has the burning pods' counters (see the module's docstring)."""
    given = os.environ.get("UNTHROTTLE_TEST_PROMETHEUS")
    if given:
        yield given
        return
    if not cluster.local:
        pytest.skip("UNTHROTTLE_TEST_PROMETHEUS not set")
    from prom import PrometheusServer, have_prometheus

    if not have_prometheus():
        pytest.skip("prometheus is not installed (make test installs it as root)")
    with BusyLoopCounters(apis[0], burn_namespace) as counters:
        scrape = ("scrape_configs:\n  - job_name: cadvisor\n    honor_labels: true\n"
                  f"    static_configs: [{{targets: ['{counters.address}']}}]\n")  # fmt: skip
        with PrometheusServer(tmp_path_factory.mktemp("prometheus"), scrape=scrape) as server:
            yield server.url


@pytest.fixture(scope="module")
def burning(apis: tuple[Any, Any], burn_namespace: str, prometheus: str) -> Iterator[str]:
    core, apps = apis
    name = burn_namespace
    core.create_namespace({"metadata": {"name": name}})
    apps.create_namespaced_deployment(name, {
        "metadata": {"name": "burn", "labels": {"tier": "burn"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "burn"}},
                 "template": {"metadata": {"labels": {"app": "burn"}}, "spec": {"containers": [{
                     "name": "app", "image": "busybox:1.36",
                     "command": ["sh", "-c", "while :; do :; done"],
                     "resources": {"limits": {"cpu": "100m"}, "requests": {"cpu": "50m"}}}]}}},
    })  # fmt: skip
    try:
        time.sleep(240)  # four minutes of throttled counters for the window
        yield name
    finally:
        core.delete_namespace(name)


def test_an_apply_cycle_patches_rolls_out_and_gets_a_verdict(
    cluster: Cluster,
    apis: tuple[Any, Any],
    prometheus: str,
    burning: str,
    crd_installed: None,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    from unthrottle.kube.patching import Record

    custom = client.CustomObjectsApi()
    log = (tmp_path / "operator.log").open("w")
    operator = subprocess.Popen(
        [str(UNTHROTTLE), "operator", "--prometheus", prometheus,
         "--namespace", burning, "--standalone", "--log-format", "text"],
        stdout=log, stderr=subprocess.STDOUT, env=cluster.env(),
    )  # fmt: skip
    try:
        custom.create_namespaced_custom_object(
            "unthrottle.io", "v1alpha1", burning, "throttlepolicies",
            {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
             "metadata": {"name": "burn"},
             "spec": {"mode": "Apply", "window": "5m", "interval": "30s",
                      "selector": {"matchLabels": {"tier": "burn"}},
                      "apply": {"verifyFor": "1m", "cooldown": "0s"}}},
        )  # fmt: skip
        apps = apis[1]
        verdict = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and verdict is None:
            deploy = apps.read_namespaced_deployment("burn", burning)
            text = (deploy.metadata.annotations or {}).get(RECORD)
            if text is not None:
                record = Record.from_annotation(text)
                limit = deploy.spec.template.spec.containers[0].resources.limits["cpu"]
                assert record.containers[0].before.cpu_limit == 100
                verdict = record.verdict
                if verdict is None:
                    assert limit != "100m"  # the change landed with its record
            time.sleep(5)
        assert verdict in {"Applied", "RolledBack"}, (tmp_path / "operator.log").read_text()
        print(f"verdict {verdict}: {record.verdict_reason}; limit {limit}")
    finally:
        delete_policy(burning, "burn")  # while the operator runs: Kopf's finalizer
        stop(operator, timeout_s=30)
        log.close()
