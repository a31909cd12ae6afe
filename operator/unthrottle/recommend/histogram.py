"""Period-level evidence from a histogram of per-window demand (the agent's, via Prometheus).

Prometheus keeps the agent's windows as a histogram: how many windows fell
in each demand bucket, not their order. The engine simulates a sequence
(burst buckets and carry-over depend on order), so a sequence is rebuilt:
each bucket's windows get demands spread evenly across the bucket (the
interpolation ``histogram_quantile`` also assumes), and the windows are
shuffled with a fixed seed.

The assumption, stated: windows are independent of their neighbours. Bursty
work that clusters in time will be more throttled than the rebuilt sequence
predicts. The result is deterministic: the same histogram always gives the
same evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unthrottle.recommend.types import PeriodEvidence

SEED = 20_261_129


def evidence_from_histogram(
    upper_bounds_cores: Sequence[float],
    cumulative_counts: Sequence[float],
    *,
    period_us: int,
    max_periods: int = 6_048_000,
) -> PeriodEvidence:
    """Rebuild per-period demand from a cumulative histogram (``le`` bounds, ``+Inf`` last).

    Counts may be fractional (``increase()`` extrapolates); they are rounded.
    The ``+Inf`` bucket's windows are placed at the last finite bound. More
    than ``max_periods`` windows are scaled down in proportion.
    """
    bounds = list(upper_bounds_cores)
    cumulative = [max(0.0, c) for c in cumulative_counts]
    if len(bounds) != len(cumulative) or not bounds:
        raise ValueError("histogram: bounds and counts must pair up")
    counts = np.diff(np.asarray([0.0, *cumulative]))
    counts = np.maximum(counts, 0)
    total = counts.sum()
    if total > max_periods:
        counts = counts * (max_periods / total)
    counts = np.rint(counts).astype(np.int64)
    finite = [b for b in bounds if np.isfinite(b)]
    top = finite[-1] if finite else 0.0
    lows = [0.0, *finite][: len(bounds)]
    parts = []
    for low, bound, n in zip(lows, bounds, counts, strict=True):
        if n <= 0:
            continue
        high = bound if np.isfinite(bound) else top
        # n values spread evenly over (low, high], as histogram_quantile interpolates
        parts.append(low + (high - low) * (np.arange(1, n + 1) / n))
    cores = np.concatenate(parts) if parts else np.zeros(0)
    np.random.default_rng(SEED).shuffle(cores)
    return PeriodEvidence(np.rint(cores * period_us).astype(np.int64), period_us)
