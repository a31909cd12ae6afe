"""Reading and writing CPU bandwidth and counters.

cgroup v2 and v1-joint are exercised on fixture trees laid out as the kernel
lays them out (this machine has cgroup v1 with cpu and cpuacct apart); v1-split
on the real kernel, in ``test_cgroups_kernel.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unthrottle.cgroups import Cgroup, CgroupError, CpuStat, Layout, Version
from unthrottle.units import Bandwidth


def v2_tree(root: Path, *, burst: bool = True) -> Layout:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("memory pids\n")
    group = root / "kubepods.slice"
    group.mkdir()
    (group / "cgroup.subtree_control").write_text("cpu memory\n")
    pod = group / "pod1"
    pod.mkdir()
    (pod / "cpu.max").write_text("50000 100000\n")
    if burst:
        (pod / "cpu.max.burst").write_text("0\n")
    (pod / "cpu.stat").write_text(
        "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 40\n"
        "nr_throttled 12\nthrottled_usec 345678\nnr_bursts 3\nburst_usec 9000\n"
    )
    (pod / "cgroup.procs").write_text("")
    return Layout(Version.V2, root, root)


def v1_joint_tree(root: Path) -> Layout:
    mount = root / "cpu,cpuacct"
    pod = mount / "kubepods" / "burstable" / "pod1"
    pod.mkdir(parents=True)
    (pod / "cpu.cfs_quota_us").write_text("-1\n")
    (pod / "cpu.cfs_period_us").write_text("100000\n")
    (pod / "cpu.cfs_burst_us").write_text("0\n")
    (pod / "cpu.stat").write_text(
        "nr_periods 40\nnr_throttled 12\nthrottled_time 345678000\nnr_bursts 3\n"
        "burst_time 9000000\n"
    )
    (pod / "cpuacct.usage").write_text("123456789\n")
    return Layout(Version.V1_JOINT, mount, mount)


class TestCgroupV2:
    def test_reads_quota_period_and_burst(self, tmp_path: Path) -> None:
        cg = Cgroup(v2_tree(tmp_path), "kubepods.slice/pod1")
        assert cg.read_bandwidth() == Bandwidth(50_000, 100_000, 0)

    def test_max_reads_as_unlimited(self, tmp_path: Path) -> None:
        cg = Cgroup(v2_tree(tmp_path), "kubepods.slice/pod1")
        (cg.cpu_dir / "cpu.max").write_text("max 100000\n")
        assert not cg.read_bandwidth().limited

    def test_writes_quota_period_and_burst_in_the_kernel_format(self, tmp_path: Path) -> None:
        cg = Cgroup(v2_tree(tmp_path), "kubepods.slice/pod1")
        cg.write_bandwidth(Bandwidth(25_000, 50_000, 10_000))
        assert (cg.cpu_dir / "cpu.max").read_text() == "25000 50000"
        assert (cg.cpu_dir / "cpu.max.burst").read_text() == "10000"
        cg.write_bandwidth(Bandwidth(None))
        assert (cg.cpu_dir / "cpu.max").read_text() == "max 100000"

    def test_reads_counters_in_microseconds(self, tmp_path: Path) -> None:
        cg = Cgroup(v2_tree(tmp_path), "kubepods.slice/pod1")
        assert cg.read_stat() == CpuStat(123_456, 40, 12, 345_678, 3, 9_000)

    def test_creating_a_cgroup_enables_the_cpu_controller_above_it(self, tmp_path: Path) -> None:
        layout = v2_tree(tmp_path)
        Cgroup(layout, "lab").create()
        assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
        assert (tmp_path / "lab").is_dir()
        (tmp_path / "lab" / "cgroup.subtree_control").write_text("")  # as the kernel would
        Cgroup(layout, "lab/run2").create()
        assert (tmp_path / "lab" / "cgroup.subtree_control").read_text() == "+cpu"
        assert (tmp_path / "lab" / "run2").is_dir()

    def test_a_kernel_without_burst_reads_none_and_refuses_to_write_one(
        self, tmp_path: Path
    ) -> None:
        cg = Cgroup(v2_tree(tmp_path, burst=False), "kubepods.slice/pod1")
        assert cg.read_bandwidth().burst_us == 0
        assert not cg.supports_burst()
        with pytest.raises(CgroupError, match=r"cpu.max.burst: kernel too old for CPU burst"):
            cg.write_bandwidth(Bandwidth(50_000, 100_000, 10_000))
        cg.write_bandwidth(Bandwidth(40_000))  # without burst it still works
        assert (cg.cpu_dir / "cpu.max").read_text() == "40000 100000"


class TestCgroupV1Joint:
    def test_reads_minus_one_as_unlimited(self, tmp_path: Path) -> None:
        cg = Cgroup(v1_joint_tree(tmp_path), "kubepods/burstable/pod1")
        assert cg.read_bandwidth() == Bandwidth(None, 100_000)

    def test_writes_and_reads_back(self, tmp_path: Path) -> None:
        cg = Cgroup(v1_joint_tree(tmp_path), "kubepods/burstable/pod1")
        cg.write_bandwidth(Bandwidth(20_000, 50_000, 5_000))
        assert cg.read_bandwidth() == Bandwidth(20_000, 50_000, 5_000)

    def test_counters_in_nanoseconds_become_microseconds(self, tmp_path: Path) -> None:
        cg = Cgroup(v1_joint_tree(tmp_path), "kubepods/burstable/pod1")
        assert cg.read_stat() == CpuStat(123_456, 40, 12, 345_678, 3, 9_000)

    def test_a_missing_cgroup_names_the_file(self, tmp_path: Path) -> None:
        cg = Cgroup(v1_joint_tree(tmp_path), "kubepods/besteffort/gone")
        with pytest.raises(CgroupError) as info:
            cg.read_stat()
        assert "kubepods/besteffort/gone/cpu.stat" in str(info.value)
        assert "no such file" in str(info.value)


def test_counter_deltas_subtract_field_by_field() -> None:
    after = CpuStat(1000, 10, 4, 500, 2, 30)
    assert after - CpuStat(400, 6, 1, 100, 1, 10) == CpuStat(600, 4, 3, 400, 1, 20)


def test_a_v2_cgroup_without_the_cpu_controller_has_usage_and_no_throttling(
    tmp_path: Path,
) -> None:
    from unthrottle.cgroups.counters import CounterReader

    # Its parent does not enable `cpu` for it: cpu.stat has the usage lines only, no cpu.max.
    d = tmp_path / "system.slice" / "db.service"
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text("usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\n")
    reader = CounterReader(Layout(Version.V2, tmp_path, tmp_path), "system.slice/db.service")
    try:
        assert not reader.throttling
        assert reader.demand() == 5_000  # not usage + system_usec, the field standing last
        assert reader.usage_and_demand() == (5_000, 5_000)
        assert reader.read() == CpuStat(5_000, 0, 0, 0, 0, 0)
        assert reader.bandwidth() == Bandwidth(None)  # no quota, and no error for cpu.max
        # The controller is enabled later: its lines appear and are found.
        (d / "cpu.stat").write_text(
            "usage_usec 6000\nuser_usec 3500\nsystem_usec 2500\nnr_periods 3\n"
            "nr_throttled 1\nthrottled_usec 700\n"
        )
        (d / "cpu.max").write_text("50000 100000\n")
        assert reader.bandwidth() == Bandwidth(50_000, 100_000)
        assert reader.demand() == 6_700
    finally:
        reader.close()


@pytest.mark.parametrize("version", [Version.V1_JOINT, Version.V2], ids=["v1", "v2"])
def test_the_bytes_of_the_usage_file_give_the_same_demand_as_reading_it(
    tmp_path: Path, version: Version
) -> None:
    """A caller that reads the usage file itself (the agent's window loop) and hands the
    bytes back gets what the reader would have read."""
    import os

    from unthrottle.cgroups.counters import CounterReader, usage_read_size

    d = tmp_path / "web"
    d.mkdir()
    if version is Version.V2:
        (d / "cpu.stat").write_text(
            "usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\n"
            "nr_periods 3\nnr_throttled 1\nthrottled_usec 700\n"
        )
    else:
        (d / "cpuacct.usage").write_text("5000400\n")
        (d / "cpu.stat").write_text("nr_periods 3\nnr_throttled 1\nthrottled_time 700000\n")
    reader = CounterReader(Layout(version, tmp_path, tmp_path), "web")
    try:
        data = os.pread(reader.usage_fd, usage_read_size(version), 0)
        assert reader.demand_from(data) == reader.demand() == 5_700
    finally:
        reader.close()
