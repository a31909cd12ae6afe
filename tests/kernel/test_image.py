"""The product's image, built from the Dockerfile (``make image``: buildah on a stand-in for
the official base), imported into the session's real node and run there as the chart runs
it: ``imagePullPolicy: Never``, the node's taint tolerated, a read-only root filesystem with
an emptyDir at /tmp. What a user would notice: the pod succeeds, ``unthrottle --version``
prints the version pyproject.toml says, it runs as the image's user 10001 (the kubelet's
``runAsNonRoot`` check passes), and matplotlib, which the HTML report plots with, works on
the read-only filesystem."""

from __future__ import annotations

import json
import tarfile
import textwrap
import time
import tomllib
from typing import Any

import pytest

from kube import Kube
from support.paths import ROOT
from unthrottle_lab.kube import REAL_NODE_TAINT, RealNode
from unthrottle_lab.kube.image import (
    REPOSITORY,
    build_product_image,
    build_record,
    repository_and_tag,
)
from unthrottle_lab.kube.images import Image

pytestmark = pytest.mark.kernel

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PLOTS = textwrap.dedent("""
    import os, matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.plot([0, 1, 2], [2, 0, 1])
    plt.savefig("/tmp/plot.png")
    print("cache", matplotlib.get_cachedir(), "png", os.path.getsize("/tmp/plot.png"))
""")
"""A plot as the HTML report makes one: matplotlib writes its cache (MPLCONFIGDIR)."""
RESTRICTED = {"readOnlyRootFilesystem": True, "runAsNonRoot": True,
              "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}  # fmt: skip
"""The chart's container securityContext, and runAsNonRoot for the kubelet to check."""


def _container(image: Image, name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image.name, "imagePullPolicy": "Never",
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"cpu": "1", "memory": "256Mi"}}, **fields}  # fmt: skip


def _pod(node: RealNode, image: Image, namespace: str) -> dict[str, Any]:
    """Three containers of the image: its entrypoint with ``--version`` and no
    securityContext, the user it runs as, and a plot under the chart's securityContext."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "image", "namespace": namespace},
        "spec": {
            "nodeName": node.name, "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "containers": [
                _container(image, "version", args=["--version"]),
                _container(image, "user", command=[
                    "python", "-c", "import os; print(f'uid={os.getuid()} gid={os.getgid()}')"]),
                _container(image, "plots", command=["python", "-c", PLOTS],
                           securityContext=RESTRICTED,
                           volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}]),
            ],
        },
    }  # fmt: skip


def _finished(pod: dict[str, Any] | None) -> bool:
    return pod is not None and pod["status"].get("phase") in {"Succeeded", "Failed"}


def test_the_archive_holds_one_name_the_chart_can_reference(product_image: Image) -> None:
    """``image.repository`` and ``image.tag`` of the chart, the version pyproject.toml says;
    and no other name in the archive (buildah's working tag would be imported too)."""
    assert repository_and_tag(product_image) == (REPOSITORY, VERSION)
    with tarfile.open(product_image.archive) as tar:
        manifest = tar.extractfile("manifest.json")
        assert manifest is not None
        (entry,) = json.load(manifest)
    assert entry["RepoTags"] == [product_image.name]
    record = build_record(product_image)
    assert record.name == product_image.name and record.size_bytes > 100_000_000


def test_the_image_runs_on_the_real_node_as_its_user_on_a_read_only_root(
    kube: Kube, real_node: RealNode, product_image: Image
) -> None:
    ns = kube.namespace
    listed = real_node.ctr("images", "list", "--quiet")
    assert product_image.name in listed.split()
    kube.create("v1/pods", _pod(real_node, product_image, ns))
    pod = kube.until("the image's pod done", lambda: kube.get("v1/pods", ns, "image"),
                     _finished, timeout_s=120)  # fmt: skip
    logs = {c: str(kube.call("GET", f"/api/v1/namespaces/{ns}/pods/image/log",
                             query={"container": c})).strip()
            for c in ("version", "user", "plots")}  # fmt: skip
    assert pod is not None and pod["status"]["phase"] == "Succeeded", (
        logs, pod and pod["status"].get("containerStatuses"))  # fmt: skip
    assert logs["version"] == VERSION
    assert logs["user"] == "uid=10001 gid=10001"
    cache, _, size = logs["plots"].removeprefix("cache ").partition(" png ")
    assert cache == "/tmp/matplotlib" and int(size) > 1000


def test_a_second_build_of_the_same_checkout_comes_from_the_cache(product_image: Image) -> None:
    begun = time.monotonic()
    again = build_product_image()
    assert again == product_image
    assert time.monotonic() - begun < 5  # hashing the build context, nothing built
