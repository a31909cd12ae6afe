"""What test_scan.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kube import Kube, fresh_name
from shop import HEALTHY, THROTTLED, Workload, deploy
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.scan import ScanRequest
from unthrottle_lab.kube import ControlPlane

DAY = 86_400
OTHER = Workload("web", "frontend", 0.1, 0.10, 1.2, 0.5, 1)


def workload_store(api: object, *, timeout_s: float = 30.0) -> KubeWorkloadStore:
    from kubernetes import client

    return KubeWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api), timeout_s=timeout_s)


@dataclass(frozen=True)
class Shop:
    """The shop as it landed on the control plane: its workloads with their fresh
    namespaces and real ReplicaSet hashes, a namespace with no Deployments, and the
    workload store reading them."""

    kube: Kube
    workloads: list[Workload]
    empty: str
    store: KubeWorkloadStore

    @property
    def namespace(self) -> str:
        """The shop's namespace (checkout and catalog); OTHER's is another."""
        return self.workloads[0].namespace

    def request(self, end: float, **changes: object) -> ScanRequest:
        fields: dict[str, object] = {"window_s": DAY // 2, "now": end,
                                     "namespaces": (self.namespace,)}  # fmt: skip
        fields.update(changes)
        return ScanRequest(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shop(control_plane: ControlPlane) -> Iterator[Shop]:
    kube = Kube(control_plane)
    placed = deploy(kube, [THROTTLED, HEALTHY, OTHER])
    empty = fresh_name("empty")
    kube.create_namespace(empty)
    yield Shop(kube, placed, empty, workload_store(kube.api_client()))
    for namespace in {w.namespace for w in placed} | {empty}:
        kube.delete("v1/namespaces", None, namespace)
