"""Workloads on the real control plane with a real Prometheus holding their history: what
the tests of workload kinds and of pod-level limits stand on, and ``unthrottle recommend``
run against it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kube import Kube
from prom import PrometheusServer
from shop import Workload
from unthrottle_lab.kube import ControlPlane

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")


@dataclass
class History:
    kube: Kube
    prometheus: str
    kubeconfig: Path
    placed: list[Workload]
    """The workloads as they landed (:func:`shop.deploy`)."""
    namespace: str


@contextmanager
def history(kube: Kube, plane: ControlPlane, folder: Path, placed: list[Workload],
            text: str) -> Iterator[History]:  # fmt: skip
    """A Prometheus holding ``text`` (OpenMetrics) for the ``placed`` workloads; their
    namespace is deleted after."""
    namespace = placed[0].namespace
    try:
        with PrometheusServer(folder, openmetrics=text) as prom:
            yield History(kube, prom.url, plane.kubeconfig, placed, namespace)
    finally:
        kube.delete("v1/namespaces", None, namespace)


def recommend(world: History, *args: str) -> subprocess.CompletedProcess[str]:
    """``unthrottle recommend`` over the history's namespace and last 5 hours."""
    return subprocess.run(
        [str(UNTHROTTLE), "recommend", "--prometheus", world.prometheus, "--namespace",
         world.namespace, "--window", "5h", *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
