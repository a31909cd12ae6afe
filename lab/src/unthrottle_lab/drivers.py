"""The lab's workload drivers: one per workload kind, each sending a pass of the workload
to the workers and timing its tasks (serial, batch rounds, an open pool's requests).

A driver returns each task's timing and when the last ended; a run measures one pass
(:mod:`unthrottle_lab.runner`), ``lab workload`` repeats it (:mod:`unthrottle_lab.looping`).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from unthrottle_lab.processes import LabError, Workers
from unthrottle_lab.workload import Kind, Workload

# --- one driver per workload kind: returns (each task's timing, end of the last task ns) ----


@dataclass(frozen=True, slots=True)
class Timed:
    """One task's (or batch round's) latency, and how much of it was lost to the host."""

    latency_ns: int
    lost_ns: int


def _serial(
    workers: Workers, workload: Workload, t0: int, wakeups: list[int]
) -> tuple[list[Timed], int]:
    for index in range(workload.workers):
        workers.send(
            index,
            f"serial {t0} {workload.tasks} {workload.task_cpu_us * 1000} "
            f"{workload.think_us * 1000}",
        )
    timed, end = [], t0
    for index in range(workload.workers):
        words = workers.read(index)
        if words[:1] != ["done"]:
            raise LabError(f"worker {index}: unexpected reply {words[:3]}")
        times = [int(w) for w in words[1:]]
        for k in range(0, len(times), 4):
            due, began, stop, lost = times[k : k + 4]
            timed.append(Timed(stop - due, lost))
            end = max(end, stop)
            if workload.think_us and k:  # it slept before this task
                wakeups.append(began - due)
    return timed, end


def _end_of(workers: Workers, index: int, sent: int, wakeups: list[int]) -> tuple[int, int]:
    """Read a task's end and what it lost; record how long after ``sent`` the worker began."""
    words = workers.read(index)
    if words[:1] != ["end"]:
        raise LabError(f"worker {index}: unexpected reply {words}")
    wakeups.append(max(0, int(words[2]) - sent))
    return int(words[1]), int(words[3])


def _batch(
    workers: Workers, workload: Workload, t0: int, wakeups: list[int]
) -> tuple[list[Timed], int]:
    timed = []
    start = t0
    end = t0
    cpu_ns = workload.task_cpu_us * 1000
    think_ns = workload.think_us * 1000
    for round_ in range(workload.tasks):
        if round_:
            # The next round is due think_ns after the last one ended (the workers sleep
            # until then); with no think time, at once. Never in the past.
            start = max(end + think_ns, time.monotonic_ns())
        for index in range(workload.workers):
            workers.send(index, f"task {cpu_ns} {start}")
        ends = [_end_of(workers, i, start, wakeups) for i in range(workload.workers)]
        end = max(stop for stop, _ in ends)
        # The round without what the host took: when it would have ended had no worker
        # lost anything (the last worker then may be another one).
        unlost = max(stop - lost for stop, lost in ends)
        timed.append(Timed(end - start, end - unlost))
    return timed, end


def _open(
    workers: Workers, workload: Workload, t0: int, wakeups: list[int]
) -> tuple[list[Timed], int]:
    arrivals = [t0 + round(a * 1000) for a in workload.arrivals_us()]
    cpu_ns = workload.task_cpu_us * 1000
    queue: collections.deque[int] = collections.deque()
    idle = list(range(workload.workers))
    serving: dict[int, int] = {}
    sent: dict[int, int] = {}
    timed: list[Timed] = []
    end = t0
    next_arrival = 0
    while len(timed) < len(arrivals):
        now = time.monotonic_ns()
        while next_arrival < len(arrivals) and arrivals[next_arrival] <= now:
            queue.append(arrivals[next_arrival])
            next_arrival += 1
        while queue and idle:
            index = idle.pop(0)
            serving[index] = queue.popleft()
            sent[index] = time.monotonic_ns()
            workers.send(index, f"task {cpu_ns} 0")
        timeout = None
        if next_arrival < len(arrivals):
            timeout = max(0.0, (arrivals[next_arrival] - time.monotonic_ns()) / 1e9)
        for index in workers.ready(timeout):
            stop, lost = _end_of(workers, index, sent.pop(index), wakeups)
            # What a task lost delays the tasks queued behind it too: not taken out of
            # theirs (an approximation; the host's spells are rare and short here).
            timed.append(Timed(stop - serving.pop(index), lost))
            end = max(end, stop)
            idle.append(index)
            idle.sort()
    return timed, end


DRIVERS = {Kind.SERIAL: _serial, Kind.BATCH: _batch, Kind.OPEN: _open}


def drive(workers: Workers, workload: Workload, t0: int) -> tuple[list[Timed], int]:
    """One pass of the workload on ``workers``, starting at ``t0`` (CLOCK_MONOTONIC ns):
    each task's (or batch round's) latency, and when the last ended. ``lab workload``
    repeats it in a container's cgroup; a run measures one pass."""
    return DRIVERS[workload.kind](workers, workload, t0, [])
