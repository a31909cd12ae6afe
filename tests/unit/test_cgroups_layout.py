"""Finding the CPU controller from mountinfo, on the layouts Kubernetes nodes use."""

from __future__ import annotations

from pathlib import Path

import pytest

from unthrottle.cgroups import CgroupError, Version, parse_mountinfo

# Copied from real hosts (trimmed to the cgroup lines and one other).
V1_SPLIT = """\
25 31 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_JOINT = """\
30 24 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
"""
V2 = """\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
28 24 0:25 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
NONE = "24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw\n"


def test_cpu_and_cpuacct_mounted_apart() -> None:
    layout = parse_mountinfo(V1_SPLIT)
    assert layout.version is Version.V1_SPLIT
    assert layout.cpu_root == Path("/sys/fs/cgroup/cpu")
    assert layout.cpuacct_root == Path("/sys/fs/cgroup/cpuacct")
    assert layout.roots == (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpuacct"))


def test_cpu_and_cpuacct_mounted_together() -> None:
    layout = parse_mountinfo(V1_JOINT)
    assert layout.version is Version.V1_JOINT
    assert layout.roots == (Path("/sys/fs/cgroup/cpu,cpuacct"),)


def test_unified_hierarchy() -> None:
    layout = parse_mountinfo(V2, v2_controllers="cpuset cpu io memory pids")
    assert layout.version is Version.V2
    assert layout.roots == (Path("/sys/fs/cgroup"),)


def test_a_v1_cpu_hierarchy_wins_on_a_hybrid_host() -> None:
    assert parse_mountinfo(V1_SPLIT, v2_controllers="").version is Version.V1_SPLIT


def test_no_cpu_controller_anywhere_is_an_error_naming_the_reason() -> None:
    with pytest.raises(CgroupError, match="cpu controller is not mounted"):
        parse_mountinfo(NONE)


def test_a_unified_tree_without_the_cpu_controller_is_an_error() -> None:
    with pytest.raises(CgroupError, match=r"cgroup.controllers: the cpu controller"):
        parse_mountinfo(V2, v2_controllers="memory pids")


def test_v1_cpu_without_cpuacct_is_an_error() -> None:
    text = "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    with pytest.raises(CgroupError, match="cpuacct controller is not mounted"):
        parse_mountinfo(text)


def test_escaped_mount_points_are_unescaped() -> None:
    text = "32 31 0:29 / /mnt/my\\040cgroups rw - cgroup cgroup rw,cpu,cpuacct\n"
    assert parse_mountinfo(text).cpu_root == Path("/mnt/my cgroups")
