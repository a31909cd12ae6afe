"""A real Kubernetes control plane, and a real node, for the tests and the demo, built from
their Go modules.

``python -m unthrottle_lab.kube up DIR [--nodes N] [--kubelet]`` starts one and
prints ``ready DIR/kubeconfig``; ``build`` only builds the binaries. :class:`ControlPlane`
and :class:`RealNode` are the same from Python (the tests' session fixtures, the demo).
"""

from unthrottle_lab.kube.build import (
    BINARIES,
    Binaries,
    BuildError,
    NodeBinaries,
    ensure_built,
    ensure_node_built,
)
from unthrottle_lab.kube.cluster import ControlPlane, KubectlError, StartError, fake_node
from unthrottle_lab.kube.node import RealNode
from unthrottle_lab.kube.workloads import REAL_NODE_TAINT, scenario_objects

__all__ = [
    "BINARIES",
    "REAL_NODE_TAINT",
    "Binaries",
    "BuildError",
    "ControlPlane",
    "KubectlError",
    "NodeBinaries",
    "RealNode",
    "StartError",
    "ensure_built",
    "ensure_node_built",
    "fake_node",
    "scenario_objects",
]
