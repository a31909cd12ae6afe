"""Cheap repeated reads of one cgroup's CPU counters: files kept open, read with ``os.pread``.

A sampler reads hundreds of cgroups ten times a second; open/read/close would
cost three syscalls and a path lookup each time, ``pread`` on an open file
costs one (627 ns hot for 32 bytes of ``cpuacct.usage``: docs/benchmarks.md,
"What the agent costs"). A cgroup file kept open gives the kernel's current
value at every ``pread`` from offset 0: the agent's kernel tests read one
reader window after window (tests/kernel/test_agent_vs_lab.py). A cgroup that
vanishes (its pod died) raises :class:`Vanished` so the caller can drop it.

Each reader names its *usage file* (``usage_fd``): the file whose bytes change
exactly when the cgroup ran (v1 ``cpuacct.usage``, v2 ``cpu.stat``). The
agent's window reads those itself, many in one tight loop
(:class:`unthrottle.agent.gating.UsagePass`), compares the bytes with the last
read, and hands the bytes of a cgroup that moved back to its reader
(:meth:`CounterReader.demand_from`), so no file is read twice.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from unthrottle.cgroups.errors import CgroupError
from unthrottle.cgroups.files import Cgroup, CpuStat
from unthrottle.cgroups.layout import Layout, Version
from unthrottle.units import Bandwidth

GONE = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.EBADF})
"""errnos of a read that mean the cgroup went away (a removed cgroup's file also reads empty)."""


def usage_read_size(version: Version) -> int:
    """Bytes to ask for when reading a usage file in one ``pread``. v1 ``cpuacct.usage`` is
    one u64 in decimal and a newline (at most 21 bytes): a small read keeps Python from
    allocating and shrinking a 4 KiB buffer every time. v2 ``cpu.stat`` is a few lines."""
    return 4096 if version is Version.V2 else 32


class Vanished(Exception):
    """The cgroup went away between two reads."""


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in GONE:
            raise Vanished(str(path)) from None
        raise


_V2_KEYS = (b"usage_usec", b"nr_periods", b"nr_throttled", b"throttled_usec", b"nr_bursts",
            b"burst_usec")  # fmt: skip
_V1_KEYS = (None, b"nr_periods", b"nr_throttled", b"throttled_time", b"nr_bursts", b"burst_time")


class CounterReader:
    """The counters of one cgroup, read through files kept open."""

    def __init__(self, layout: Layout, path: str) -> None:
        self.cgroup = Cgroup(layout, path)
        self.v2 = layout.version is Version.V2
        self._stat = _open(self.cgroup.cpu_dir / "cpu.stat")
        self._usage = -1
        self.usage_apart = not self.v2
        """Usage has a file of its own (cgroup v1), so it can be read without cpu.stat."""
        try:
            if not self.v2:
                self._usage = _open(self.cgroup.acct_dir / "cpuacct.usage")
            self._learn()
        except BaseException:
            os.close(self._stat)
            if self._usage >= 0:
                os.close(self._usage)
            raise

    def _learn(self) -> None:
        """Where each field sits in cpu.stat. Its lines keep their order for a cgroup's
        life, so each is then read by position (older kernels lack the burst lines)."""
        keys = self._pread(self._stat).split()[0::2]
        wanted = _V2_KEYS if self.v2 else _V1_KEYS
        self._at = [keys.index(k) * 2 + 1 if k in keys else -1 for k in wanted]
        if self.v2 and self._at[0] < 0:
            raise CgroupError(self.cgroup.cpu_dir / "cpu.stat", "has no usage_usec line")
        self.throttling = self._at[3] >= 0
        """cpu.stat counts throttled time. On cgroup v2, a cgroup whose parent does not
        enable the ``cpu`` controller has only the usage lines, and no quota either: its
        demand is its usage (and not whatever field happens to stand last)."""

    def _pread(self, fd: int) -> bytes:
        try:
            data = os.pread(fd, 4096, 0)
        except OSError as err:
            if err.errno in GONE:
                raise Vanished(self.cgroup.path) from None
            raise
        if not data:
            raise Vanished(self.cgroup.path)  # a removed cgroup's file reads empty
        return data

    def read(self) -> CpuStat:
        """Usage and throttling counters now, µs."""
        parts = self._pread(self._stat).split()
        at = self._at
        if self.v2:
            usage, periods, throttled, throttled_t, bursts, burst_t = (
                int(parts[i]) if i >= 0 else 0 for i in at
            )
            return CpuStat(usage, periods, throttled, throttled_t, bursts, burst_t)
        _, periods, throttled, throttled_ns, bursts, burst_ns = (
            int(parts[i]) if i >= 0 else 0 for i in at
        )
        usage_ns = int(self._pread(self._usage))
        return CpuStat(
            usage_ns // 1000, periods, throttled, throttled_ns // 1000, bursts, burst_ns // 1000
        )

    def usage_ns(self) -> int:
        """``cpuacct.usage`` alone (cgroup v1): one read, to tell an idle cgroup cheaply."""
        return int(self._pread(self._usage))

    @property
    def usage_fd(self) -> int:
        """The open usage file (v1 ``cpuacct.usage``, v2 ``cpu.stat``): its bytes change
        exactly when the cgroup ran. For a caller that reads many in one loop; read it
        with ``os.pread(fd, usage_read_size(version), 0)`` and hand the bytes to
        :meth:`demand_from`."""
        return self._stat if self.v2 else self._usage

    def demand_from(self, data: bytes) -> int:
        """Usage + throttled time so far, µs, given the bytes just read from ``usage_fd``:
        v2 parses them (cpu.stat has both), v1 adds cpu.stat's throttled time (one read)."""
        if not self.v2:
            return self.demand_with(int(data))
        parts = data.split()
        usage = int(parts[self._at[0]])
        return usage + int(parts[self._at[3]]) if self.throttling else usage

    def usage_from(self, data: bytes) -> int:
        """Usage so far, µs, from the bytes just read from ``usage_fd`` (no read)."""
        if not self.v2:
            return int(data) // 1000
        return int(data.split()[self._at[0]])

    def usage_and_demand(self) -> tuple[int, int]:
        """Usage and usage + throttled time so far, µs, from one read (cgroup v2)."""
        parts = self._pread(self._stat).split()
        usage = int(parts[self._at[0]])
        throttled = int(parts[self._at[3]]) if self.throttling else 0
        return usage, usage + throttled

    def demand_with(self, usage_ns: int) -> int:
        """Usage + throttled time so far, µs, given a ``cpuacct.usage`` just read (cgroup v1)."""
        if not self.throttling:
            return usage_ns // 1000
        return (usage_ns + int(self._pread(self._stat).split()[self._at[3]])) // 1000

    def demand(self) -> int:
        """Usage + throttled time so far, µs: the one number each window needs."""
        if self.usage_apart:
            return self.demand_with(self.usage_ns())
        parts = self._pread(self._stat).split()
        if not self.throttling:
            return int(parts[self._at[0]])
        return int(parts[self._at[0]]) + int(parts[self._at[3]])

    def bandwidth(self) -> Bandwidth:
        """Quota, period and burst in force (read rarely: at discovery, then every 30 s).

        Without the cpu controller (cgroup v2, no throttled time counted) there is no
        ``cpu.max`` and no quota. Its lines are looked for again each time: the
        controller may have been enabled since.
        """
        if not self.throttling:
            self._learn()
            if not self.throttling:
                return Bandwidth(None)
        return self.cgroup.read_bandwidth()

    def close(self) -> None:
        """Close the files; safe to call twice."""
        for fd in (self._stat, self._usage):
            if fd >= 0:
                os.close(fd)
        self._stat = self._usage = -1


class UsageReader:
    """One cgroup's cumulative CPU usage alone, through a file kept open: a number that
    changes exactly when the cgroup or any cgroup below it ran (usage is hierarchical).

    cgroup v1: ``cpuacct.usage`` (ns); v2: ``usage_usec`` of ``cpu.stat`` (µs). Compare
    readings of one reader with each other only.
    """

    def __init__(self, layout: Layout, path: str) -> None:
        cgroup = Cgroup(layout, path)
        self.path = cgroup.path
        self.v2 = layout.version is Version.V2
        self._fd = _open(
            cgroup.cpu_dir / "cpu.stat" if self.v2 else cgroup.acct_dir / "cpuacct.usage"
        )
        self._at = 1
        if self.v2:
            try:
                keys = self._pread().split()[0::2]
                if b"usage_usec" not in keys:
                    raise CgroupError(cgroup.cpu_dir / "cpu.stat", "has no usage_usec line")
                self._at = keys.index(b"usage_usec") * 2 + 1
            except BaseException:
                os.close(self._fd)
                raise

    def _pread(self) -> bytes:
        try:
            data = os.pread(self._fd, 4096, 0)
        except OSError as err:
            if err.errno in GONE:
                raise Vanished(self.path) from None
            raise
        if not data:
            raise Vanished(self.path)
        return data

    def read(self) -> int:
        """The usage now (one ``pread``)."""
        data = self._pread()
        return int(data.split()[self._at]) if self.v2 else int(data)

    @property
    def fd(self) -> int:
        """The open usage file, for a caller that reads many in one loop (compare its
        bytes between reads: equal bytes, no usage moved)."""
        return self._fd

    def close(self) -> None:
        """Close the file; safe to call twice."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
