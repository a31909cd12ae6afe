"""Shared fixtures and collection rules: the real cgroup layout for kernel tests, leak
checks, and the markers that skip by themselves.

- ``kernel``: skipped, with the reason, without root or a cgroup CPU controller;
- ``cluster``: the real-cluster suite is opt-in, skipped unless
  ``UNTHROTTLE_TEST_CLUSTER=1`` (see ``tests/cluster/test_real_cluster.py``): against KUBECONFIG's
  cluster, or without it against the tests' own control plane.

The real control plane (``control_plane``, ``kube``): one per run, started on first use
(tests/kube.py); each test that asks for ``kube`` gets a namespace of its own.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator

import pytest

from kube import Kube, fresh_name
from missing import MISSING
from support.machine import (
    CLUSTER_OPT_IN,
    KERNEL_LAYOUT,
    KERNEL_MISSING,
    lab_cgroups,
)
from support.paths import ROOT
from unthrottle.cgroups import Layout
from unthrottle_lab.kube import (
    BuildError,
    ControlPlane,
    RealNode,
    ensure_built,
    ensure_node_built,
)
from unthrottle_lab.kube.image import build_product_image, import_image
from unthrottle_lab.kube.images import Image

pytest_plugins = ["missing", "steal"]  # CI=true fails skips for what make installs; skip
# counts; and the host's steal time per test and over the run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what this machine or this run cannot do, saying why, whatever fixtures a test
    asks for; and run the tests that need the control plane last.

    The control plane starts at its first use and runs to the end of the session, using
    about 3.5 % of a core while idle (etcd, the API server's and controllers' resyncs,
    kwok's leases): enough to count as another load in the lab's and the agent's
    measurements, which need a quiet machine. So every test that does not need it runs
    first, in its usual order, before it exists."""
    items.sort(key=lambda item: "control_plane" in getattr(item, "fixturenames", ()))
    no_kernel = pytest.mark.skip(reason=f"{MISSING} kernel test: {KERNEL_MISSING}")
    no_cluster = pytest.mark.skip(
        reason=f"real-cluster suite is opt-in: set {CLUSTER_OPT_IN}=1 (with KUBECONFIG for a "
        "cluster of yours; without, against the tests' own control plane)"
    )
    for item in items:
        if KERNEL_LAYOUT is None and item.get_closest_marker("kernel") is not None:
            item.add_marker(no_kernel)
        if os.environ.get(CLUSTER_OPT_IN) != "1" and item.get_closest_marker("cluster"):
            item.add_marker(no_cluster)


@pytest.fixture
def layout() -> Iterator[Layout]:
    """The host's real cgroup layout; the test is skipped without root or a CPU controller.

    After the test, no cgroup it created may be left behind.
    """
    if KERNEL_LAYOUT is None:
        pytest.skip(f"{MISSING} kernel test: {KERNEL_MISSING}")
    before = lab_cgroups(KERNEL_LAYOUT)
    yield KERNEL_LAYOUT
    left = lab_cgroups(KERNEL_LAYOUT) - before
    assert not left, f"cgroups left behind: {sorted(map(str, left))}"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real control plane, built from its Go modules (``make controlplane``): etcd,
    kube-apiserver, kube-controller-manager, kube-scheduler and kwok with 3 fake nodes."""
    try:
        binaries = ensure_built()
    except BuildError as error:
        pytest.skip(f"{MISSING} the control plane cannot be built: {error}")
    with ControlPlane(tmp_path_factory.mktemp("control-plane"), binaries=binaries) as plane:
        yield plane


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[RealNode]:  # fmt: skip
    """One real node joined to the control plane: containerd, runc and a kubelet built from
    their Go modules (``make controlplane``), running real pods in real cgroups. Tainted:
    only pods that tolerate ``REAL_NODE_TAINT`` land on it."""
    if KERNEL_LAYOUT is None:
        pytest.skip(f"{MISSING} the real node: {KERNEL_MISSING}")
    try:
        ensure_node_built()
    except BuildError as error:
        pytest.skip(f"{MISSING} the real node cannot be built: {error}")
    with RealNode(control_plane, tmp_path_factory.mktemp("real-node")) as node:
        yield node


@pytest.fixture(scope="session")
def product_image(real_node: RealNode) -> Image:
    """The image built from the Dockerfile for this checkout (``make image``; from the cache
    when it has it), imported into the real node's containerd."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{MISSING} {' and '.join(missing)}, to build the image (make image)")
    image = build_product_image()
    import_image(real_node, image)
    return image


@pytest.fixture
def kube(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """The admin's view of the control plane, with a fresh namespace for this test
    (``kube.namespace``), deleted after it."""
    name = fresh_name(re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40])
    kube = Kube(control_plane, name)
    kube.create_namespace(name)
    yield kube
    kube.delete("v1/namespaces", None, name)


@pytest.fixture(scope="session")
def throttlepolicy_crd(control_plane: ControlPlane) -> None:
    """crds/throttlepolicy.yaml applied with the control plane's own kubectl, as the README
    tells users to, and Established (the server accepted its schema)."""
    control_plane.install_crds(ROOT / "crds" / "throttlepolicy.yaml")
