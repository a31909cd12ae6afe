"""Against a real cluster (opt-in, as tests/test_real_cluster.py): one Apply cycle.

    UNTHROTTLE_TEST_CLUSTER=1 UNTHROTTLE_TEST_PROMETHEUS=http://prometheus:9090 \\
        KUBECONFIG=… .venv/bin/pytest -m cluster tests/test_real_cluster_apply.py

A Deployment burns CPU under a tight limit (busybox in a loop, 100m); the cluster's
Prometheus must scrape cAdvisor (or the unthrottle agent) for its counters. The
operator, run here in Apply mode against that cluster, patches the limit with its
record; the real Deployment controller rolls it out; after ``verifyFor`` the record
carries a verdict. Skipped without ``UNTHROTTLE_TEST_PROMETHEUS``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_real_cluster import UNTHROTTLE, apis, crd_installed, pytestmark  # noqa: F401
from unthrottle.devtools.processes import stop

pytestmark = [
    *pytestmark,
    pytest.mark.skipif(
        "UNTHROTTLE_TEST_PROMETHEUS" not in os.environ, reason="UNTHROTTLE_TEST_PROMETHEUS not set"
    ),
]
RECORD = "unthrottle.io/last-applied"


@pytest.fixture(scope="module")
def burning(apis: tuple[Any, Any]) -> Iterator[str]:
    core, apps = apis
    name = f"unthrottle-apply-{os.getpid()}"
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
    apis: tuple[Any, Any], burning: str, crd_installed: None, tmp_path: Path
) -> None:
    from kubernetes import client

    from unthrottle.kube.patching import Record

    custom = client.CustomObjectsApi()
    log = (tmp_path / "operator.log").open("w")
    operator = subprocess.Popen(
        [str(UNTHROTTLE), "operator", "--prometheus", os.environ["UNTHROTTLE_TEST_PROMETHEUS"],
         "--namespace", burning, "--standalone", "--log-format", "text"],
        stdout=log, stderr=subprocess.STDOUT,
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
    finally:
        stop(operator, timeout_s=30)
        log.close()
