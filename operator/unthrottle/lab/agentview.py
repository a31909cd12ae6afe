"""What the operator would read of a lab run, for ``lab tune --evidence``.

The lab samples every period in order; the operator reads the node agent's series from
Prometheus, which hold no order but what the agent exports for it. ``agent`` folds a
run's windows the way the agent does (its histogram buckets, and the backlog series of
:mod:`unthrottle.cfs.backlog`) and rebuilds the evidence as
:meth:`unthrottle.metrics.evidence.ContainerEvidence.period_evidence` does; ``histogram``
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


def as_read(evidence: PeriodEvidence, view: View) -> PeriodEvidence:
    """The lab's in-order evidence as ``view`` sees it (the same ratio and waits)."""
    if view is View.SEQUENCE:
        return evidence
    period = evidence.period_us
    cores = evidence.demand_us / period
    # the agent's buckets take a window at its upper bound (bisect_left): le is inclusive
    bounds = [*BUCKETS_CORES, math.inf]
    cumulative = [float(np.count_nonzero(cores <= b)) for b in bounds]
    rebuilt = evidence_from_histogram(bounds, cumulative, period_us=period)
    backlog = fold(evidence.demand_us, period) if view is View.AGENT else None
    return replace(rebuilt, observed_throttle_ratio=evidence.observed_throttle_ratio,
                   waits=evidence.waits, backlog=backlog)  # fmt: skip
