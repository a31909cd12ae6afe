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
from unthrottle.cgroups import Cgroup, CpuStat, Layout, Version

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


def _fields(raw: bytes) -> dict[bytes, int]:
    out = {}
    for line in raw.split(b"\n"):
        key, _, value = line.partition(b" ")
        if value:
            out[key] = int(value)
    return out


class CounterReader:
    """The counters of one cgroup, read through files kept open."""

    def __init__(self, layout: Layout, path: str) -> None:
        self.cgroup = Cgroup(layout, path)
        self.v2 = layout.version is Version.V2
        self._stat = _open(self.cgroup.cpu_dir / "cpu.stat")
        self._usage = -1
        try:
            if not self.v2:
                self._usage = _open(self.cgroup.acct_dir / "cpuacct.usage")
        except BaseException:
            os.close(self._stat)
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
        stat = _fields(self._pread(self._stat))
        if self.v2:
            return CpuStat(
                usage_us=stat.get(b"usage_usec", 0),
                nr_periods=stat.get(b"nr_periods", 0),
                nr_throttled=stat.get(b"nr_throttled", 0),
                throttled_us=stat.get(b"throttled_usec", 0),
                nr_bursts=stat.get(b"nr_bursts", 0),
                burst_us=stat.get(b"burst_usec", 0),
            )
        return CpuStat(
            usage_us=int(self._pread(self._usage)) // 1000,
            nr_periods=stat.get(b"nr_periods", 0),
            nr_throttled=stat.get(b"nr_throttled", 0),
            throttled_us=stat.get(b"throttled_time", 0) // 1000,
            nr_bursts=stat.get(b"nr_bursts", 0),
            burst_us=stat.get(b"burst_time", 0) // 1000,
        )

    def bandwidth(self) -> Bandwidth:
        """Quota, period and burst in force (read rarely: at discovery)."""
        return self.cgroup.read_bandwidth()

    def close(self) -> None:
        """Close the files; safe to call twice."""
        for fd in (self._stat, self._usage):
            if fd >= 0:
                os.close(fd)
        self._stat = self._usage = -1
