"""What test_real_cluster.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

KUBECONFIG = os.environ.get("KUBECONFIG", "")
REACH_TIMEOUT_S = 10
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")


@dataclass(frozen=True)
class Cluster:
    """Where the suite runs: KUBECONFIG's cluster, or the tests' control plane (``local``)."""

    kubeconfig: str
    local: bool

    def env(self) -> dict[str, str]:
        """The environment of a child process that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if KUBECONFIG:
        return Cluster(KUBECONFIG, local=False)
    plane = request.getfixturevalue("control_plane")  # tests/conftest.py
    return Cluster(str(plane.kubeconfig), local=True)


@pytest.fixture(scope="module")
def apis(cluster: Cluster) -> tuple[Any, Any]:
    """The current context's core and apps APIs; a skip, with the reason, if unreachable."""
    from kubernetes import client, config

    try:
        config.load_kube_config(config_file=cluster.kubeconfig)  # several paths: merged
        client.VersionApi().get_code(_request_timeout=REACH_TIMEOUT_S)
    except Exception as err:  # a bad kubeconfig or a cluster that does not answer
        pytest.skip(f"the cluster of KUBECONFIG's current context is unreachable: {err}")
    return client.CoreV1Api(), client.AppsV1Api()


def delete_policy(namespace: str, name: str, *, timeout_s: float = 30.0) -> None:
    """Delete a policy and wait until it is gone: the operator, still running, removes
    Kopf's finalizer (otherwise the policy, and its namespace, hang in deletion)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom = client.CustomObjectsApi()
    where = ("unthrottle.io", "v1alpha1", namespace, "throttlepolicies", name)
    try:
        custom.delete_namespaced_custom_object(*where)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            custom.get_namespaced_custom_object(*where)
            time.sleep(0.5)
    except ApiException as error:
        if error.status != 404:
            raise


CRD = Path(__file__).resolve().parents[2] / "crds" / "throttlepolicy.yaml"


@pytest.fixture(scope="module")
def crd_installed(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[None]:
    """The ThrottlePolicy CRD, installed from the committed file (left if it was there).
    On the local control plane, the tests' own (conftest: applied with kubectl, shared
    with the other modules of the run, so never deleted here)."""
    if cluster.local:
        request.getfixturevalue("throttlepolicy_crd")
        yield
        return
    import yaml
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api()
    body = yaml.safe_load(CRD.read_text())
    created = False
    try:
        ext.create_custom_resource_definition(body)
        created = True
    except ApiException as error:
        if error.status != 409:  # already there: a cluster with unthrottle installed
            raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        if any(c.type == "Established" and c.status == "True"
               for c in crd.status.conditions or []):  # fmt: skip
            break
        time.sleep(1)
    try:
        yield
    finally:
        if created:
            ext.delete_custom_resource_definition(body["metadata"]["name"])
