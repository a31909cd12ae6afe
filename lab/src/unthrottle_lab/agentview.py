"""What the operator would read of a lab run, for ``lab tune --evidence``.

The lab samples every period in order; the operator reads the node agent's series from
Prometheus, which hold no order but what the agent exports for it. ``agent`` folds a
run's windows the way the agent does (its histogram buckets, and the backlog series of
:mod:`unthrottle.cfs.backlog`) and rebuilds the evidence as
:meth:`unthrottle.evidence.containers.ContainerEvidence.period_evidence` does; ``histogram``
leaves the backlog out, as an agent without it (the order unknown); ``sequence`` is the
lab's own samples, in order.
"""

from __future__ import annotations

import math
from dataclasses import replace
from enum import StrEnum

import numpy as np

from unthrottle.agent.sampling import BUCKETS_CORES
from unthrottle.cfs.backlog import fold
from unthrottle.recommend import PeriodEvidence
from unthrottle.recommend.histogram import evidence_from_histogram


class View(StrEnum):
    """Which evidence ``lab tune`` recommends from."""

    SEQUENCE = "sequence"
    """The lab's per-period samples, in order."""
    AGENT = "agent"
    """The agent's histogram and backlog series, as the operator reads them."""
    HISTOGRAM = "histogram"
    """The agent's histogram alone: an agent without the backlog series."""


def as_read(evidence: PeriodEvidence, view: View, *, threads: int = 0) -> PeriodEvidence:
    """The lab's in-order evidence as ``view`` sees it (the same ratio and waits).

    ``threads``: the most the run's cgroup had (0: not known). The agent divides each window
    by its own length, so its threads' time never reads more than their number of cores;
    the lab's periods, attributed by refills, can: a period runs on the runtime its CPUs
    kept from the one before, and two threads throttled at one CPU read 200.4-204.9 ms in
    1-5 of 108 periods of tune-batch-runs. The histogram takes a window at its bucket's
    upper bound, so those went in at 2.5 cores, and the tune in the operator's view once
    answered 2,200m with a 45 ms burst that the two threads have no use for. Windows are
    read at no more than ``threads`` cores, as the agent reads them."""
    if view is View.SEQUENCE:
        return evidence
    period = evidence.period_us
    cores = evidence.demand_us / period
    if threads:
        cores = np.minimum(cores, threads)
    # the agent's buckets take a window at its upper bound (bisect_left): le is inclusive
    bounds = [*BUCKETS_CORES, math.inf]
    cumulative = [float(np.count_nonzero(cores <= b)) for b in bounds]
    rebuilt = evidence_from_histogram(bounds, cumulative, period_us=period)
    backlog = fold(evidence.demand_us, period) if view is View.AGENT else None
    return replace(rebuilt, observed_throttle_ratio=evidence.observed_throttle_ratio,
                   waits=evidence.waits, backlog=backlog,
                   usage_cores=evidence.usage_cores)  # fmt: skip
