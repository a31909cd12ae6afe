"""Read and write one cgroup's CPU bandwidth and counters, on any layout.

Files, by layout:

============  ===========================  ===============================
what          cgroup v2                    cgroup v1
============  ===========================  ===============================
quota/period  ``cpu.max`` ("Q P", max)     ``cpu.cfs_quota_us`` (-1), ``cpu.cfs_period_us``
burst         ``cpu.max.burst`` (µs)       ``cpu.cfs_burst_us`` (µs)
counters      ``cpu.stat`` (…_usec)        ``cpu.stat`` (throttled_time, burst_time: ns)
usage         ``cpu.stat`` usage_usec      ``cpuacct.usage`` (ns)
============  ===========================  ===============================
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from unthrottle.cgroups.errors import CgroupError, explain
from unthrottle.cgroups.layout import Layout, Version
from unthrottle.units import Bandwidth


@dataclass(frozen=True, slots=True)
class CpuStat:
    """CPU counters of a cgroup, in µs and counts, whatever the layout."""

    usage_us: int
    nr_periods: int
    nr_throttled: int
    throttled_us: int
    nr_bursts: int
    burst_us: int
    wait_us: int = 0
    """The cgroup's threads' summed run delay (``cgroups.waits``) when it was read with
    them; 0 when it was not."""

    def __sub__(self, before: CpuStat) -> CpuStat:
        return CpuStat(
            usage_us=self.usage_us - before.usage_us,
            nr_periods=self.nr_periods - before.nr_periods,
            nr_throttled=self.nr_throttled - before.nr_throttled,
            throttled_us=self.throttled_us - before.throttled_us,
            nr_bursts=self.nr_bursts - before.nr_bursts,
            burst_us=self.burst_us - before.burst_us,
            wait_us=self.wait_us - before.wait_us,
        )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise explain(path, err) from None


def _write(path: Path, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as `echo v > file` does
    except OSError as err:
        raise explain(path, err, writing=value) from None
    try:
        os.write(fd, value.encode())
    except OSError as err:
        raise explain(path, err, writing=value) from None
    finally:
        os.close(fd)


def _parse_stat(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class Cgroup:
    """One cgroup, named by its path below the hierarchies' mount points."""

    def __init__(self, layout: Layout, path: str) -> None:
        self.layout = layout
        self.path = path.strip("/")
        self.cpu_dir = layout.cpu_root / self.path
        self.acct_dir = layout.cpuacct_root / self.path

    def __repr__(self) -> str:
        return f"Cgroup({self.path!r}, {self.layout.version})"

    @property
    def dirs(self) -> tuple[Path, ...]:
        """This cgroup's directory in every hierarchy it lives in."""
        return tuple(root / self.path for root in self.layout.roots)

    def exists(self) -> bool:
        """True when the cgroup exists in every hierarchy."""
        return all(d.is_dir() for d in self.dirs)

    # --- lifecycle -------------------------------------------------------------------------

    def create(self) -> None:
        """Create the cgroup in every hierarchy (v2: enable +cpu for it in its parent)."""
        if self.layout.version is Version.V2:
            self._enable_cpu_in_parents()
        for d in self.dirs:
            try:
                d.mkdir()
            except FileExistsError:
                raise CgroupError(d, "already exists (left over from another run?)") from None
            except OSError as err:
                raise explain(d, err) from None

    def _enable_cpu_in_parents(self) -> None:
        root = self.layout.cpu_root
        parent = (root / self.path).parent
        chain = []
        while parent != root and root in parent.parents:
            chain.append(parent)
            parent = parent.parent
        chain.append(root)
        for directory in reversed(chain):
            control = directory / "cgroup.subtree_control"
            if "cpu" not in _read(control).split():
                _write(control, "+cpu")

    def remove(self, *, timeout_s: float = 5.0) -> None:
        """Remove the cgroup from every hierarchy; waits while exiting processes leave it."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                    raise explain(d, err) from None

    def add_process(self, pid: int) -> None:
        """Move a process (all its threads) into the cgroup, in every hierarchy."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        """Processes in the cgroup (CPU hierarchy)."""
        return [int(x) for x in _read(self.cpu_dir / "cgroup.procs").split()]

    # --- bandwidth -------------------------------------------------------------------------

    def read_bandwidth(self) -> Bandwidth:
        """The quota, period and burst in force (burst 0 where the kernel has none)."""
        if self.layout.version is Version.V2:
            quota_text, period_text = _read(self.cpu_dir / "cpu.max").split()
            quota = None if quota_text == "max" else int(quota_text)
            burst = self._read_burst()
            return Bandwidth(quota, int(period_text), burst if quota is not None else 0)
        quota_v1 = int(_read(self.cpu_dir / "cpu.cfs_quota_us"))
        period = int(_read(self.cpu_dir / "cpu.cfs_period_us"))
        burst = self._read_burst()
        quota = None if quota_v1 < 0 else quota_v1
        return Bandwidth(quota, period, burst if quota is not None else 0)

    @property
    def burst_file(self) -> Path:
        """``cpu.max.burst`` (v2) or ``cpu.cfs_burst_us`` (v1)."""
        name = "cpu.max.burst" if self.layout.version is Version.V2 else "cpu.cfs_burst_us"
        return self.cpu_dir / name

    def _read_burst(self) -> int:
        if not self.burst_file.exists():
            return 0  # kernel < 5.14: no burst, which reads as none
        return int(_read(self.burst_file))

    def supports_burst(self) -> bool:
        """True when the kernel has CPU burst (Linux ≥ 5.14)."""
        return self.burst_file.exists()

    def _require_burst(self) -> None:
        if not self.supports_burst():
            raise CgroupError(self.burst_file, "kernel too old for CPU burst (needs 5.14+)")

    def write_bandwidth(self, bandwidth: Bandwidth) -> None:
        """Set quota, period and burst, in an order the kernel accepts from any prior state.

        Burst goes to 0 first (the kernel refuses a quota under the burst in
        force), then quota and period, then the new burst. A burst on a kernel
        without burst support raises a CgroupError naming the file.
        """
        if bandwidth.burst_us:
            self._require_burst()
        if self.supports_burst():
            _write(self.burst_file, "0")
        if self.layout.version is Version.V2:
            quota = "max" if bandwidth.quota_us is None else str(bandwidth.quota_us)
            _write(self.cpu_dir / "cpu.max", f"{quota} {bandwidth.period_us}")
        else:
            # Unlimited first so that any period is accepted, then the period, then the quota.
            _write(self.cpu_dir / "cpu.cfs_quota_us", "-1")
            _write(self.cpu_dir / "cpu.cfs_period_us", str(bandwidth.period_us))
            if bandwidth.quota_us is not None:
                _write(self.cpu_dir / "cpu.cfs_quota_us", str(bandwidth.quota_us))
        if bandwidth.burst_us:
            _write(self.burst_file, str(bandwidth.burst_us))

    def write_quota(self, quota_us: int | None) -> None:
        """Set only the quota (None: no limit), as the kubelet does when a pod is resized:
        the period and the burst stay. The kernel refuses a quota under the burst in force
        (EINVAL, named in the error): lower the burst first (:mod:`unthrottle.kube.inplace`).
        """
        if self.layout.version is Version.V2:
            _write(self.cpu_dir / "cpu.max", "max" if quota_us is None else str(quota_us))
        else:
            _write(self.cpu_dir / "cpu.cfs_quota_us", "-1" if quota_us is None else str(quota_us))

    def write_burst(self, burst_us: int) -> None:
        """Set only the burst, leaving quota and period to their owner (the kubelet).

        The caller clamps to the quota; the kernel refuses more (EINVAL, named in the error).
        """
        self._require_burst()
        _write(self.burst_file, str(burst_us))

    # --- counters --------------------------------------------------------------------------

    def read_stat(self) -> CpuStat:
        """Usage and the throttling counters, in µs."""
        stat = _parse_stat(_read(self.cpu_dir / "cpu.stat"))
        if self.layout.version is Version.V2:
            return CpuStat(
                usage_us=stat.get("usage_usec", 0),
                nr_periods=stat.get("nr_periods", 0),
                nr_throttled=stat.get("nr_throttled", 0),
                throttled_us=stat.get("throttled_usec", 0),
                nr_bursts=stat.get("nr_bursts", 0),
                burst_us=stat.get("burst_usec", 0),
            )
        usage_ns = int(_read(self.acct_dir / "cpuacct.usage"))
        return CpuStat(
            usage_us=usage_ns // 1000,
            nr_periods=stat.get("nr_periods", 0),
            nr_throttled=stat.get("nr_throttled", 0),
            throttled_us=stat.get("throttled_time", 0) // 1000,
            nr_bursts=stat.get("nr_bursts", 0),
            burst_us=stat.get("burst_time", 0) // 1000,
        )
