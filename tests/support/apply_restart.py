"""What test_apply_restart.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube import Kube
from kube_faults import FaultProxy
from operator_proc import OperatorProcess
from prom import PrometheusServer
from shop import Workload
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.units import parse_cpu

POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
APP = Workload("stage", "checkout", 0.1, 0.10, 1.2, 0.5, 2, {"tier": "web"})
NODE = "kwok-node-0"
IN_FLIGHT_S = 3.0
"""How long the proxy holds the first patch: the operator is killed meanwhile."""


def _label_node(kube: Kube, key: str, value: str | None) -> None:
    """Put a label on the node (None: take it off)."""
    kube.patch("v1/nodes", None, NODE, {"metadata": {"labels": {key: value}}})


@dataclass
class World:
    kube: Kube
    proxy: FaultProxy
    prom: PrometheusServer
    kubeconfig: Path
    """The operator's: through the proxy."""
    namespace: str
    hold: str
    """The node label the Deployment's pods need (``hold=ready``)."""

    def deployment(self) -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, self.namespace, "checkout")
        assert found is not None
        return found

    def status(self) -> dict[str, Any]:
        return (self.kube.get(POLICIES, self.namespace, "web") or {}).get("status") or {}

    def let_pods_run(self) -> None:
        _label_node(self.kube, self.hold, "ready")

    def operator(self, log: Path) -> OperatorProcess:
        return OperatorProcess(self.kubeconfig, self.prom.url, log, "--namespace", self.namespace)

    def limit_patches(self) -> int:
        """JSON Patches to the Deployment that change its CPU limit, seen by the proxy."""
        return sum(1 for r in self.proxy.requests("PATCH", "/deployments/checkout$")
                   if any("/resources" in op.get("path", "") and op["op"] != "test"
                          for op in r.body or []))  # fmt: skip


def _wait(check: Any, what: str, operator: OperatorProcess, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} never happened; operator log:\n{operator.tail()}")


def _settings(deploy: dict[str, Any]) -> tuple[int, str | None]:
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    burst = (deploy["spec"]["template"]["metadata"].get("annotations") or {}).get(
        "unthrottle.io/cpu-burst")  # fmt: skip
    return parse_cpu(container["resources"]["limits"]["cpu"]), burst


def _record(deploy: dict[str, Any]) -> Record | None:
    text = (deploy["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return None if text is None else Record.from_annotation(text)
