"""Recommendations for every container found, on every usable core.

Period-level evidence takes the engine 5–40 ms per container (docs/benchmarks.md
§7), so thousands of containers are worth every core. Above
:data:`PARALLEL_FROM` containers, the work is spread over worker processes,
spawned, not forked, since the caller may have threads. A script that calls
:func:`advise_all` therefore needs the ``if __name__ == "__main__":`` guard.
Results are the same as one at a time, in the same order: the engine is
deterministic.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from unthrottle.evidence.containers import ContainerEvidence
from unthrottle.recommend import Current, Policy, Recommendation, recommend

PARALLEL_FROM = 64
"""Fewer containers than this are done here: starting workers costs about a second."""

Job = tuple[ContainerEvidence, Current, Policy, int]
"""A container's evidence, today's settings (its CFS period among them), the policy, and
the window in seconds."""


def advise(job: Job) -> Recommendation | None:
    """One container's recommendation, or None without evidence; the evidence is read at
    the container's own CFS period (``current.period_us``)."""
    item, current, policy, window_s = job
    if item.kind == "period":
        return recommend(item.period_evidence(current.period_us), current, policy)
    if item.kind == "counters":
        return recommend(item.counters(window_s, current.period_us), current, policy)
    return None


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def advise_all(jobs: list[Job], workers: int | None = None) -> list[Recommendation | None]:
    """Every job's recommendation, in order; ``workers`` processes (default: usable CPUs)."""
    workers = usable_cpus() if workers is None else workers
    if workers <= 1 or len(jobs) < PARALLEL_FROM:
        return [advise(job) for job in jobs]
    chunk = max(1, len(jobs) // (workers * 8))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(advise, jobs, chunksize=chunk))
