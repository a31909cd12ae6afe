"""A real Kubernetes control plane for the tests and the demo, built from its Go modules.

``python -m unthrottle.devtools.kube up DIR [--nodes N]`` starts one and prints
``ready DIR/kubeconfig``; ``build`` only builds the binaries. :class:`ControlPlane` is the
same from Python (the tests' session fixture, the demo).
"""

from unthrottle.devtools.kube.build import BINARIES, Binaries, BuildError, ensure_built
from unthrottle.devtools.kube.cluster import ControlPlane, KubectlError, StartError, fake_node
from unthrottle.devtools.kube.kubelet import ResizingKubelet as ResizingKubelet

__all__ = [
    "BINARIES",
    "Binaries",
    "BuildError",
    "ControlPlane",
    "KubectlError",
    "StartError",
    "ensure_built",
    "fake_node",
]
