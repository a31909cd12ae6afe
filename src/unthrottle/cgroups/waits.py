"""How long a cgroup's threads waited for a CPU: the sum of their schedstat run delay.

A thread that wants a CPU and does not get one waits in a run queue. The kernel
counts that wait per thread: ``/proc/<pid>/task/<tid>/schedstat``'s second field
(``run_delay``, ns since the thread began). Measured on Linux 6.18, cgroup v1, one
busy thread over 2 s (docs/benchmarks.md §4, ``bench/wait_facts.py``):

=================================  ======  =========  =========
                                   usage   throttled  run delay
=================================  ======  =========  =========
no limit, a core to itself         2.00 s  0          0.00 s
0.5 CPU, a core to itself          1.00 s  1.00 s     1.00 s
no limit, beside a hog on its CPU  1.00 s  0          1.00 s
0.5 CPU, beside a hog on its CPU   1.00 s  0          1.00 s
=================================  ======  =========  =========

So the run delay holds both the time the quota withheld (a throttled thread
waits in its run queue) and the time other processes held the CPU; and beside a
hog a thread at 0.5 CPU looks exactly like a thread that wants half a core:
usage at the quota, never throttled. Its demand is usage + run delay.

cgroup v2's ``cpu.pressure`` (PSI) counts wall time with at least one thread
waiting, not thread time: two threads waiting count once. The run delay is in
the unit of usage and throttled time (thread seconds), on v1 and v2 alike, so it
is what is read on both. (PSI could not be checked on these machines: cgroup v1.)

The reader keeps each thread's schedstat open and reads it with ``pread``; the
thread lists (v1 ``tasks``, v2 ``cgroup.threads``) of the cgroup and of every
cgroup below it (usage is hierarchical, so the wait is too: a pod's wait is its
containers') are re-read at most every ``refresh_ns``. The sum is kept monotonic
as threads come and go: a thread that was there at the first read counts from
then; one that began since counts whole, from its start (its ``/proc`` start time
is read once, when it is first seen); one that exits keeps what it added. A thread
that begins and ends between two re-reads of the list is not seen. The list is
also re-read whenever it was empty: a cgroup read because it ran has threads. A
cgroup that vanishes reads as no threads.

When the wait shows: the kernel adds a thread's run delay when the thread gets a
CPU (``sched_info_arrive``), or leaves its run queue without running (migrated),
not while it waits. A thread stalled through a whole window, throttled or behind
other processes, shows neither usage nor wait in it; its wait appears, whole, in
the window in which it next runs. :meth:`WaitReader.read` says how much of an
increase began before a given span, thread by thread, so that a caller can give
that part back to the windows it belongs to.
"""

from __future__ import annotations

import errno
import os
import time
from typing import NamedTuple

from unthrottle.cgroups.files import Cgroup
from unthrottle.cgroups.layout import Layout, Version

REFRESH_NS = 500_000_000
"""How often the thread lists are re-read."""
_GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENODEV, errno.EBADF})
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _boot_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _started_ns(tid: int) -> int | None:
    """When a thread began, ns since boot (``/proc/TID/stat`` field 22); None if gone."""
    try:
        with open(f"/proc/{tid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[19]) * _TICK_NS
    except (OSError, IndexError, ValueError):
        return None


def run_delay_ns(data: bytes) -> int:
    """The run delay in a schedstat line (``run_ns delay_ns timeslices``)."""
    return int(data.split()[1])


def _ran_and_waited(data: bytes) -> tuple[int, int]:
    """The run time and the run delay in a schedstat line, ns."""
    ran, waited, _ = data.split(maxsplit=2)
    return int(ran), int(waited)


class Waited(NamedTuple):
    """One read of a :class:`WaitReader` (a tuple: made every window, it must be cheap)."""

    total_us: int
    """Run delay of the threads since each was first seen, summed (cumulative), µs."""
    earlier_us: int = 0
    """Of the increase since the last read: the part that, thread by thread, does not fit
    in the span asked for beside what the thread ran in it (a wait that began before the
    span: it is added when the thread gets a CPU), µs. 0 when no span was given."""
    spilled: int = 0
    """Threads whose wait began before the span."""


def _list_threads(directory: str, name: str) -> set[int]:
    """The threads of a cgroup and of every cgroup below it; none if it is gone.

    A directory's link count is 2 plus its subdirectories on cgroupfs (kernfs), so a
    leaf (a container) costs one ``stat`` and one read.
    """
    tids: set[int] = set()
    stack = [directory]
    while stack:
        here = stack.pop()
        try:
            with open(f"{here}/{name}", "rb", buffering=0) as listing:
                tids.update(map(int, listing.readall().split()))
            if os.stat(here).st_nlink == 2:
                continue
            with os.scandir(here) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except OSError as err:
            if err.errno not in _GONE and err.errno != errno.ENOTDIR:
                raise
    return tids


class WaitReader:
    """The summed run delay of one cgroup's threads (and those below it), µs, read
    through files kept open."""

    def __init__(self, layout: Layout, path: str, *, refresh_ns: int = REFRESH_NS) -> None:
        cgroup = Cgroup(layout, path)
        self.threads_name = "cgroup.threads" if layout.version is Version.V2 else "tasks"
        self.directory = str(cgroup.cpu_dir)
        self.threads_file = cgroup.cpu_dir / self.threads_name
        self.refresh_ns = refresh_ns
        self._fds: dict[int, int] = {}
        self._last: dict[int, tuple[int, int]] = {}
        """Each thread's run time and run delay at its last read, ns."""
        self._total_ns = 0
        self._listed_at: int | None = None
        self._listed_boot_ns = 0

    def _refresh(self, now: int) -> None:
        first = self._listed_at is None
        since = self._listed_boot_ns - _TICK_NS  # start times are in clock ticks
        self._listed_boot_ns = _boot_ns()
        tids = _list_threads(self.directory, self.threads_name)
        for tid in list(self._fds):
            if tid not in tids:
                self._drop(tid)
        for tid in tids - self._fds.keys():
            try:
                fd = os.open(f"/proc/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as err:
                if err.errno in _GONE:
                    continue
                raise
            self._fds[tid] = fd
            try:
                self._last[tid] = _ran_and_waited(os.pread(fd, 64, 0))
            except (OSError, IndexError, ValueError):
                self._drop(tid)
                continue
            if not first and (_started_ns(tid) or 0) >= since:
                self._last[tid] = (0, 0)  # it began since the last list: all of it is new
        self._listed_at = now

    def _drop(self, tid: int) -> None:
        os.close(self._fds.pop(tid))
        self._last.pop(tid, None)

    def read(self, span_ns: int | None = None) -> Waited:
        """The summed run delay now and, given the span since the last read, how much of
        its increase began before that span (a thread cannot wait longer than the span
        within it: the rest is wait from before, added when the thread got a CPU)."""
        now = time.monotonic_ns()
        listed = self._listed_at
        if listed is None or not self._fds or now - listed >= self.refresh_ns:
            self._refresh(now)
        earlier_ns = spilled = 0
        last, pread = self._last, os.pread
        gone = []
        for tid, fd in self._fds.items():
            try:
                ran_b, waited_b, _ = pread(fd, 64, 0).split(maxsplit=2)
                now_ran, now_waited = int(ran_b), int(waited_b)
            except (OSError, ValueError):
                gone.append(tid)  # it exited: what it added stays in the total
                continue
            ran, waited = last[tid]
            if now_waited == waited and now_ran == ran:
                continue
            last[tid] = now_ran, now_waited
            added = now_waited - waited
            if added <= 0:
                continue
            self._total_ns += added
            if span_ns is not None:
                # it ran (now_ran - ran) and waited within the span: the rest was before
                before = added - max(0, span_ns - (now_ran - ran))
                if before > 0:
                    earlier_ns += before
                    spilled += 1
        for tid in gone:
            self._drop(tid)
        return Waited(self._total_ns // 1000, earlier_ns // 1000, spilled)

    def wait_us(self) -> int:
        """Run delay of the cgroup's threads since each was first seen, summed, µs."""
        return self.read().total_us

    @property
    def threads(self) -> int:
        """Threads read at the last call."""
        return len(self._fds)

    def close(self) -> None:
        """Close every thread's file; safe to call twice."""
        for tid in list(self._fds):
            self._drop(tid)
