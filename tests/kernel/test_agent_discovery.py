"""Which cgroups are pods and containers, for every cgroup driver and runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from unthrottle.agent.discovery import Identity, discover_kubepods, discover_standalone, identify
from unthrottle.cgroups import Layout, Version

UID = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f"
SYS_UID = UID.replace("-", "_")
CID = "3f2a9c8d7e6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f"


@pytest.mark.parametrize(
    ("path", "identity"),
    [
        (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYS_UID}.slice/"
         f"cri-containerd-{CID}.scope", Identity(UID, "burstable", CID, "containerd")),
        (f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYS_UID}.slice/"
         f"crio-{CID}.scope", Identity(UID, "besteffort", CID, "cri-o")),
        (f"kubepods.slice/kubepods-pod{SYS_UID}.slice/docker-{CID}.scope",
         Identity(UID, "guaranteed", CID, "docker")),
        (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYS_UID}.slice",
         Identity(UID, "burstable")),
        (f"kubepods/burstable/pod{UID}/{CID}", Identity(UID, "burstable", CID, None)),
        (f"kubepods/pod{UID}/{CID}", Identity(UID, "guaranteed", CID, None)),
        (f"kubepods/besteffort/pod{UID}", Identity(UID, "besteffort")),
    ],
    ids=["systemd-containerd", "systemd-crio-besteffort", "systemd-docker-guaranteed",
         "systemd-pod", "cgroupfs-burstable", "cgroupfs-guaranteed", "cgroupfs-pod"],
)  # fmt: skip
def test_kubelet_layouts_are_recognised(path: str, identity: Identity) -> None:
    assert identify(path) == identity


@pytest.mark.parametrize(
    "path",
    [
        "system.slice/containerd.service",
        "kubepods.slice",
        "kubepods.slice/kubepods-burstable.slice",
        f"kubepods.slice/kubepods-pod{SYS_UID}.slice/crio-conmon-{CID}.scope",
        f"kubepods/burstable/pod{UID}/{CID}/nested",
        "kubepods/burstable/podnot-a-uid",
    ],
    ids=["not-kubepods", "root", "qos-slice", "crio-conmon", "nested", "bad-uid"],
)
def test_everything_else_is_not_a_pod_or_container(path: str) -> None:
    assert identify(path) is None


def make_tree(root: Path, paths: list[str], quota: dict[str, int]) -> Layout:
    for rel in paths:
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
    for d in [root, *(root / p for p in paths)]:
        rel = str(d.relative_to(root))
        (d / "cgroup.procs").write_text("")
        (d / "cpu.cfs_quota_us").write_text(f"{quota.get(rel, -1)}\n")
    return Layout(Version.V1_JOINT, root, root)


def test_a_kubepods_tree_yields_its_pods_and_containers(tmp_path: Path) -> None:
    pod = f"kubepods/burstable/pod{UID}"
    layout = make_tree(tmp_path, ["kubepods", "kubepods/burstable", pod, f"{pod}/{CID}",
                                  "system.slice"], {})  # fmt: skip
    found = dict(discover_kubepods(layout))
    assert set(found) == {pod, f"{pod}/{CID}"}
    assert found[f"{pod}/{CID}"].container_id == CID


def test_standalone_names_by_path_the_cgroups_with_a_quota_or_processes(tmp_path: Path) -> None:
    layout = make_tree(tmp_path, ["apps", "apps/web", "apps/web/worker", "apps/idle"],
                       {"apps/web": 50_000})  # fmt: skip
    (tmp_path / "apps/web/worker/cgroup.procs").write_text("1234\n")
    found = discover_standalone(layout, "apps")
    assert [(f.path, f.namespace, f.pod, f.container) for f in found] == [
        ("apps/web", "", "web", ""),
        ("apps/web/worker", "", "web/worker", ""),
    ]


@pytest.mark.kernel
def test_on_cgroupfs_the_walk_finds_cgroups_nested_at_any_depth(layout: Layout) -> None:
    """The walk lists only directories that have subdirectories (link count above 2):
    on the kernel's cgroupfs, nested cgroups are still all found."""
    import os

    from helpers import CgroupTree

    root = f"unthrottle-test-walk-{os.getpid()}"
    tree = CgroupTree(layout)
    try:
        tree.make(root)
        for path in ("a", "a/b", "a/b/c", "a/b/c/d", "e"):
            tree.make(f"{root}/{path}", 50_000)
        found = discover_standalone(layout, root)
        assert [f.pod for f in found] == ["a", "a/b", "a/b/c", "a/b/c/d", "e"]
    finally:
        tree.cleanup()
