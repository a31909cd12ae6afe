"""Cheap repeated reads of one cgroup's CPU counters: files kept open, read with ``os.pread``.

A sampler reads hundreds of cgroups ten times a second; open/read/close would
cost three syscalls and a path lookup each time, ``pread`` on an open file
costs one and returns fresh values (TESTING.md). A cgroup that vanishes
(its pod died) raises :class:`Vanished` so the caller can drop it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from unthrottle.cfs.settings import Bandwidth
from unthrottle.cgroups.files import Cgroup, CpuStat
from unthrottle.cgroups.layout import Layout, Version

_GONE = {errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.EBADF}


class Vanished(Exception):
    """The cgroup went away between two reads."""


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in _GONE:
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
            # cpu.stat's lines keep their order for a cgroup's life: learn where each
            # field sits once, then read by position (older kernels lack the burst lines).
            keys = self._pread(self._stat).split()[0::2]
            wanted = _V2_KEYS if self.v2 else _V1_KEYS
            self._at = [keys.index(k) * 2 + 1 if k in keys else -1 for k in wanted]
        except BaseException:
            os.close(self._stat)
            if self._usage >= 0:
                os.close(self._usage)
            raise

    def _pread(self, fd: int) -> bytes:
        try:
            data = os.pread(fd, 4096, 0)
        except OSError as err:
            if err.errno in _GONE:
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

    def demand_with(self, usage_ns: int) -> int:
        """Usage + throttled time so far, µs, given a ``cpuacct.usage`` just read (cgroup v1)."""
        return (usage_ns + int(self._pread(self._stat).split()[self._at[3]])) // 1000

    def demand(self) -> int:
        """Usage + throttled time so far, µs: the one number each window needs."""
        if self.usage_apart:
            return self.demand_with(self.usage_ns())
        parts = self._pread(self._stat).split()
        return int(parts[self._at[0]]) + int(parts[self._at[3]])

    def bandwidth(self) -> Bandwidth:
        """Quota, period and burst in force (read rarely: at discovery)."""
        return self.cgroup.read_bandwidth()

    def close(self) -> None:
        """Close the files; safe to call twice."""
        for fd in (self._stat, self._usage):
            if fd >= 0:
                os.close(fd)
        self._stat = self._usage = -1
