"""What a lab task lost to the host: the wall time it neither ran nor waited for a CPU.

On a virtual machine the host takes the virtual CPU now and then (steal time): the task
is on the CPU for this kernel but does not run, and neither its CPU clock, its run delay
nor the quota counts it. That cannot be made on demand here; a stopped process is the
same to these clocks (neither running nor runnable), so SIGSTOP stands in for it. What
the quota holds back must never count as lost: it is what the lab measures.
Root only (the throttled case makes a cgroup).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from helpers import CgroupTree
from unthrottle.cgroups import Layout
from unthrottle.units import Bandwidth
from unthrottle_lab.noise import steal_ms
from unthrottle_lab.processes import Workers

pytestmark = pytest.mark.kernel
MS = 1_000_000


def task(workers: Workers, cpu_ms: int) -> tuple[float, float]:
    """Run one task on worker 0 now; (latency, lost), ms."""
    workers.send(0, f"task {cpu_ms * MS} 0")
    words = workers.read(0)
    assert words[0] == "end", words
    ended, began, lost = map(int, words[1:])
    return (ended - began) / MS, lost / MS


def run_delay_ms(pid: int) -> float:
    """A single-threaded process's time waiting for a CPU so far (schedstat), ms."""
    with open(f"/proc/{pid}/schedstat") as file:
        return int(file.read().split()[1]) / MS


CPU = max(os.sched_getaffinity(0))
"""The worker's CPU: pinned, so that the steal of that CPU alone is what the host could
have taken from it."""
STEAL_RESOLUTION_MS = 10.0
"""/proc/stat counts steal in USER_HZ ticks (10 ms): a difference of two readings is within
one tick of what the host took."""


STOLEN_ALLOWED_MS = 50.0
"""The most steal of the worker's CPU a measurement here may be excused for (the lab's
``REMEASURE_LOST_MS``): past it the measurement is the host's, and it is taken again, at
most :data:`MORE_MEASUREMENTS` times, then the test fails saying what the host took."""
MORE_MEASUREMENTS = 2


def host_took_at_most(stolen_ms: float) -> float:
    """What the host may have taken from the worker's CPU, by its steal counter's change
    (``stolen_ms``, at most :data:`STOLEN_ALLOWED_MS`), ms: up to a tick more than the
    counter moved, since a difference of two readings of a tick counter hides up to a tick
    (beside a hog in CI a 20 ms task lost 3.9 ms while the counter held still; once a task
    stopped for 60 ms lost 72.6 ms beside 30 ms of steal)."""
    assert stolen_ms <= STOLEN_ALLOWED_MS, f"the host took {stolen_ms:.0f} ms of the worker's CPU"
    return stolen_ms + STEAL_RESOLUTION_MS


def left_alone(measure: Callable[[], Measured]) -> Measured:
    """A measurement, taken again (at most :data:`MORE_MEASUREMENTS` times) while the host
    took more than :data:`STOLEN_ALLOWED_MS` of the worker's CPU during it."""
    measured = measure()
    for _ in range(MORE_MEASUREMENTS):
        if measured.stolen_ms <= STOLEN_ALLOWED_MS:
            break
        print(f"measured again: the host took {measured.stolen_ms:.0f} ms of the worker's CPU")
        measured = measure()
    return measured


@dataclass(frozen=True)
class Measured:
    """One task: its latency and what the lab counted lost, ms; the steal of the worker's
    CPU meanwhile, ms; and the other figures of the measurement."""

    latency_ms: float
    lost_ms: float
    stolen_ms: float
    waited_ms: float = 0.0
    throttled: int = 0
    stop: tuple[float, float] = (0.0, 0.0)
    """A stop's shortest and longest span (:class:`Stopper`), ms."""


class Stopper(threading.Thread):
    """Stops a process 10 ms from now for 60 ms, and keeps when it did: the stop lasted at
    least from the SIGSTOP's return to the SIGCONT's call (``inner_ms``) and at most from
    the one's call to the other's return (``outer_ms``). Beside a hog this thread itself
    may wait for a CPU before it sends the SIGCONT: the stop is as long as it was."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.marks: list[int] = []

    def run(self) -> None:
        time.sleep(0.01)
        self.marks.append(time.monotonic_ns())
        os.kill(self.pid, signal.SIGSTOP)
        self.marks.append(time.monotonic_ns())
        time.sleep(0.06)
        self.marks.append(time.monotonic_ns())
        os.kill(self.pid, signal.SIGCONT)
        self.marks.append(time.monotonic_ns())

    @property
    def inner_ms(self) -> float:
        return (self.marks[2] - self.marks[1]) / MS

    @property
    def outer_ms(self) -> float:
        return (self.marks[3] - self.marks[0]) / MS


def test_a_stopped_task_counts_what_it_lost() -> None:
    with Workers(1) as workers:
        pid = workers.pids[0]
        os.sched_setaffinity(pid, {CPU})

        def quiet() -> Measured:
            stolen = steal_ms(cpu=CPU)
            latency, lost = task(workers, 20)  # nothing taken
            return Measured(latency, lost, steal_ms(cpu=CPU) - stolen)

        def stopped() -> Measured:
            stopper = Stopper(pid)
            stopper.start()
            waited, stolen = run_delay_ms(pid), steal_ms(cpu=CPU)
            latency, lost = task(workers, 50)
            waited, stolen = run_delay_ms(pid) - waited, steal_ms(cpu=CPU) - stolen
            stopper.join()
            return Measured(latency, lost, stolen, waited, stop=(stopper.inner_ms,
                                                                 stopper.outer_ms))  # fmt: skip

        first = left_alone(quiet)
        run = left_alone(stopped)
    assert first.lost_ms < 2 + host_took_at_most(first.stolen_ms), first
    print(run)
    inner, outer = run.stop
    assert run.latency_ms >= 50 + inner
    # the stop as long as it was (quiet: lost within 0.1 ms of it), and what the host took
    assert inner - 1 <= run.lost_ms, run
    assert run.lost_ms <= outer + 2 + host_took_at_most(run.stolen_ms), run
    # The rest is what CFS had: the CPU time, and the wait for a CPU behind other
    # processes (beside a hog in CI the unpinned worker waited 48 ms of it).
    assert run.latency_ms - run.lost_ms - run.waited_ms == pytest.approx(50, abs=5), run


def test_a_throttled_task_lost_nothing(layout: Layout) -> None:
    """10 ms of quota per 100 ms period and a 30 ms task: it waits out two or three
    periods' ends, over 150 ms in all, and that is the quota's, not the host's."""
    tree = CgroupTree(layout)
    try:
        cg = tree.make(f"unthrottle-test-lost-{os.getpid()}")
        cg.write_bandwidth(Bandwidth(10_000, 100_000))
        with Workers(1) as workers:
            os.sched_setaffinity(workers.pids[0], {CPU})
            cg.add_process(workers.pids[0])

            def throttled() -> Measured:
                before, stolen = cg.read_stat(), steal_ms(cpu=CPU)
                latency, lost = task(workers, 30)
                periods = cg.read_stat().nr_throttled - before.nr_throttled
                return Measured(latency, lost, steal_ms(cpu=CPU) - stolen, throttled=periods)

            run = left_alone(throttled)
    finally:
        tree.cleanup()
    print(run)
    assert run.throttled >= 2 and run.latency_ms >= 150, run
    # the quota's 150 ms and more are not lost; what the host took while it ran is (beside
    # a hog in CI: 16.2 ms, with 80 ms of steal over both CPUs)
    assert run.lost_ms < 5 + host_took_at_most(run.stolen_ms), run
