"""Task workloads, as plain data: what the lab runs and the model simulates.

The kinds (see ``scenarios/README.md``):

- ``serial``: each worker runs ``tasks`` tasks back to back, idle ``think_us``
  between them; a task's latency runs from its (planned) start to its end;
- ``batch``: each round starts one task on every worker at once; the round's
  latency runs from its common start to its last task's end; the next round
  starts ``think_us`` after the previous one ends (0: at once);
- ``open``: ``tasks`` requests arrive at Poisson times and queue, first come
  first served, for a pool of ``workers``; latency runs from arrival to end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """How tasks reach the workers."""

    SERIAL = "serial"
    BATCH = "batch"
    OPEN = "open"


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload: what each task costs and how tasks arrive (times in µs)."""

    kind: Kind
    task_cpu_us: int
    workers: int = 1
    tasks: int = 100
    think_us: int = 0
    """Idle time between a worker's tasks (serial) or between rounds (batch); unused by open."""
    rate_per_s: float = 10.0
    seed: int = 1

    def __post_init__(self) -> None:
        if self.task_cpu_us <= 0:
            raise ValueError("task_cpu_ms: a task must burn some CPU")
        if self.workers < 1:
            raise ValueError("workers: at least one worker is needed")
        if self.tasks < 1:
            raise ValueError("tasks: at least one task is needed")
        if self.think_us < 0:
            raise ValueError("think_ms: cannot be negative")
        if self.kind is Kind.OPEN and self.rate_per_s <= 0:
            raise ValueError("rate_per_s: an open workload needs a positive arrival rate")

    def arrivals_us(self) -> list[float]:
        """Arrival times of an ``open`` workload, µs after the start.

        The running sums of ``random.Random(seed).expovariate(rate_per_s)``
        drawn ``tasks`` times, so every implementation sees the same sequence.
        """
        rng = random.Random(self.seed)
        now = 0.0
        times = []
        for _ in range(self.tasks):
            now += rng.expovariate(self.rate_per_s)
            times.append(now * 1e6)
        return times

    @property
    def total_tasks(self) -> int:
        """How many latencies a run yields."""
        if self.kind is Kind.SERIAL:
            return self.tasks * self.workers
        return self.tasks
