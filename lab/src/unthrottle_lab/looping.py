"""A scenario's workload, over and over, in the cgroup this process is in: a container's.

``unthrottle-lab workload FILE`` runs it in the workload image on the real node, so a
scenario in ``scenarios/`` becomes a pod whose throttling the kubelet's cgroups, cAdvisor
and the agent see. It uses the lab's own workers and drivers (``runner.drive``), as
``lab run`` does, but creates no cgroup and writes nothing: the kubelet made the cgroup
and set its quota, and an in-place resize changes it under the running workload.

Each pass prints one line on stdout (the pod's log): its tasks' latencies and how long it
took. Between passes the workload sleeps for ``pause_ms``, so a pass starts from a full
bucket as a run does after its idle periods.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from unthrottle_lab.drivers import drive
from unthrottle_lab.processes import Workers
from unthrottle_lab.runner import LEAD_NS
from unthrottle_lab.workload import Workload

__all__ = ["Pass", "loop"]


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass of the workload: its number (from 1), latencies (ms) and span (ms)."""

    number: int
    latencies_ms: list[float]
    wall_ms: float

    def line(self) -> str:
        """``pass 3: 10 tasks, p50 71.2 ms, p95 80.1 ms, p99 80.4 ms, max 80.4 ms, 1012.5 ms
        in all`` (the demo reads its pods' p99 from these lines)."""
        ordered = sorted(self.latencies_ms)

        def rank(q: float) -> float:
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        p50 = statistics.median(ordered)
        return (f"pass {self.number}: {len(ordered)} tasks, p50 {p50:.1f} ms, "
                f"p95 {rank(0.95):.1f} ms, p99 {rank(0.99):.1f} ms, max {ordered[-1]:.1f} ms, "
                f"{self.wall_ms:.1f} ms in all")  # fmt: skip


def loop(workload: Workload, *, passes: int | None = None, pause_ms: int = 400,
         on_pass: Callable[[Pass], None] = lambda p: None) -> int:  # fmt: skip
    """Run ``passes`` passes (None: until interrupted); how many completed."""
    done = 0
    with Workers(workload.workers) as workers:
        while passes is None or done < passes:
            t0 = time.monotonic_ns() + LEAD_NS
            tasks, end = drive(workers, workload, t0)
            done += 1
            on_pass(Pass(done, [t.latency_ns / 1e6 for t in tasks], (end - t0) / 1e6))
            time.sleep(pause_ms / 1000)
    return done
