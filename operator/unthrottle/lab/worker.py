"""A lab worker process: burns CPU on command and reports monotonic timestamps.

Run as a script (``python -I -S worker.py``) so that start-up imports nothing
but the standard library. It speaks one line per message on stdin / stdout,
times in CLOCK_MONOTONIC nanoseconds (shared by every process on the host):

=================================  ===========================================
command                            reply
=================================  ===========================================
(at start)                         ``ready PID``
``serial T0 N CPU THINK``          ``done S1 B1 E1 S2 B2 E2 …`` once all N tasks
                                   end: task k is due (S) at T0 (k = 1) or at the
                                   end of task k-1 plus THINK, sleeping until then;
                                   B is when it began running, E when it ended
``task CPU AT``                    ``end E B`` (sleeps until AT if AT > now)
``calibrate LIMIT``                ``stall S R``: burns until it is stopped for
                                   over 1 ms (the quota ran out) and reports
                                   when it stopped and when it resumed, or
                                   ``stall 0 0`` after LIMIT ns without a stall
``exit``                           (exits)
=================================  ===========================================

A task burns CPU until this thread's CPU clock has advanced by CPU ns, so time
spent throttled or preempted does not count as work done.
"""

from __future__ import annotations

import os
import sys
import time

STALL_NS = 1_000_000


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


def serial(t0: int, n: int, cpu_ns: int, think_ns: int) -> list[int]:
    """Run n tasks back to back; return (due, began, ended) triples."""
    out = []
    start = t0
    for _ in range(n):
        sleep_until(start)
        began = time.monotonic_ns()
        burn(cpu_ns)
        end = time.monotonic_ns()
        out += [start, began, end]
        start = end + think_ns
    return out


def main() -> None:
    """Serve commands until ``exit`` or end of input."""
    inp = sys.stdin.buffer
    out = sys.stdout.buffer

    def reply(text: str) -> None:
        out.write(text.encode() + b"\n")
        out.flush()

    reply(f"ready {os.getpid()}")
    for raw in inp:
        words = raw.split()
        if not words:
            continue
        cmd = words[0]
        args = [int(w) for w in words[1:]]
        if cmd == b"serial":
            times = serial(*args)
            reply("done " + " ".join(map(str, times)))
        elif cmd == b"task":
            cpu_ns, at_ns = args
            sleep_until(at_ns)
            began = time.monotonic_ns()
            burn(cpu_ns)
            reply(f"end {time.monotonic_ns()} {began}")
        elif cmd == b"calibrate":
            stopped, resumed = calibrate(args[0])
            reply(f"stall {stopped} {resumed}")
        elif cmd == b"exit":
            return


if __name__ == "__main__":
    main()
