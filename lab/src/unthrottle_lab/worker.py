"""A lab worker process: burns CPU on command and reports monotonic timestamps.

Run as a script (``python -I -S worker.py``) so that start-up imports nothing
but the standard library. It speaks one line per message on stdin / stdout,
times in CLOCK_MONOTONIC nanoseconds (shared by every process on the host):

=================================  ===========================================
command                            reply
=================================  ===========================================
(at start)                         ``ready PID``
``serial T0 N CPU THINK``          ``done S1 B1 E1 L1 S2 B2 E2 L2 …`` once all N
                                   tasks end: task k is due (S) at T0 (k = 1) or
                                   at the end of task k-1 plus THINK, sleeping
                                   until then; B is when it began running, E when
                                   it ended, L what it lost (below)
``task CPU AT``                    ``end E B L`` (sleeps until AT if AT > now)
``calibrate LIMIT``                ``stall S R``: burns until it is stopped for
                                   over 1 ms (the quota ran out) and reports
                                   when it stopped and when it resumed, or
                                   ``stall 0 0`` after LIMIT ns without a stall
``exit``                           (exits)
=================================  ===========================================

A task burns CPU until this thread's CPU clock has advanced by CPU ns, so time
spent throttled or preempted does not count as work done.

**Lost time (L).** Between B and E the thread either ran (its CPU clock), waited in
a run queue (its schedstat run delay: throttled, or behind other threads), or
neither: the hypervisor took the virtual CPU while the thread was on it (steal
time, which the guest's clocks for CPU time and for the quota leave out), or the
process was stopped. On a KVM guest here, steal comes in spells of a few seconds,
in which 20 ms tasks took twice as long with no throttle and no wait
(docs/benchmarks.md §3). L is that third part, so the lab can tell what CFS
did from what the machine's host did. It is 0 where schedstat is missing.
"""

from __future__ import annotations

import os
import sys
import time

STALL_NS = 1_000_000
SCHEDSTAT = "/proc/thread-self/schedstat"


class Clocks:
    """This thread's run delay (schedstat's second field, ns), read through a kept fd."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:  # no schedstat (CONFIG_SCHED_INFO off): nothing is counted lost
            self.fd = None

    def waited_ns(self) -> int:
        """Run delay so far, ns (0 without schedstat)."""
        if self.fd is None:
            return 0
        return int(os.pread(self.fd, 64, 0).split()[1])

    def task(self, cpu_ns: int) -> tuple[int, int, int]:
        """Burn ``cpu_ns``; (began, ended, lost ns): lost is the wall time that was
        neither this thread's CPU time nor its run delay (0 without schedstat)."""
        waited0 = self.waited_ns()
        cpu0 = time.thread_time_ns()
        began = time.monotonic_ns()
        burn(cpu_ns)
        ended = time.monotonic_ns()
        cpu1 = time.thread_time_ns()
        waited1 = self.waited_ns()
        if self.fd is None:
            return began, ended, 0
        return began, ended, max(0, (ended - began) - (cpu1 - cpu0) - (waited1 - waited0))


def burn(cpu_ns: int) -> None:
    """Run until this thread has used ``cpu_ns`` of CPU time."""
    deadline = time.thread_time_ns() + cpu_ns
    while time.thread_time_ns() < deadline:
        pass


def sleep_until(at_ns: int) -> None:
    """Sleep until CLOCK_MONOTONIC reaches ``at_ns``."""
    while True:
        left = at_ns - time.monotonic_ns()
        if left <= 0:
            return
        time.sleep(left / 1e9)


def calibrate(limit_ns: int) -> tuple[int, int]:
    """Burn until stopped for over 1 ms; return (stopped at, resumed at)."""
    start = last = time.monotonic_ns()
    while last - start < limit_ns:
        now = time.monotonic_ns()
        if now - last > STALL_NS:
            return last, now
        last = now
    return 0, 0


def serial(clocks: Clocks, t0: int, n: int, cpu_ns: int, think_ns: int) -> list[int]:
    """Run n tasks back to back; return (due, began, ended, lost) quadruples."""
    out = []
    start = t0
    for _ in range(n):
        sleep_until(start)
        began, end, lost = clocks.task(cpu_ns)
        out += [start, began, end, lost]
        start = end + think_ns
    return out


def main() -> None:
    """Serve commands until ``exit`` or end of input."""
    inp = sys.stdin.buffer
    out = sys.stdout.buffer

    def reply(text: str) -> None:
        out.write(text.encode() + b"\n")
        out.flush()

    clocks = Clocks()
    reply(f"ready {os.getpid()}")
    for raw in inp:
        words = raw.split()
        if not words:
            continue
        cmd = words[0]
        args = [int(w) for w in words[1:]]
        if cmd == b"serial":
            times = serial(clocks, *args)
            reply("done " + " ".join(map(str, times)))
        elif cmd == b"task":
            cpu_ns, at_ns = args
            sleep_until(at_ns)
            began, ended, lost = clocks.task(cpu_ns)
            reply(f"end {ended} {began} {lost}")
        elif cmd == b"calibrate":
            stopped, resumed = calibrate(args[0])
            reply(f"stall {stopped} {resumed}")
        elif cmd == b"exit":
            return


if __name__ == "__main__":
    main()
