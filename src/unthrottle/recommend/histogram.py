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

Size: the rebuilt sequence is capped at :data:`MAX_PERIODS` windows, the
counts scaled in proportion (largest remainders). Order is already invented,
so more windows add no information, only time: a week is 6,048,000 windows,
and the engine's search over them took 0.5–5 s per container (Auto); 10,000
containers would take hours. At 50,000 windows it takes about 13 ms, and on
a day's histogram the limit, burst and expected ratio came out the same as
from all 864,000 windows (so they did at 10,000). Each bucket's share is off
by less than one window, so a throttle ratio moves by at most 28 / 50,000 =
0.00056, well under any useful target (docs/benchmarks.md §7).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from unthrottle.recommend.types import PeriodEvidence

SEED = 20_261_129
MAX_PERIODS = 50_000


def evidence_from_histogram(
    upper_bounds_cores: Sequence[float],
    cumulative_counts: Sequence[float],
    *,
    period_us: int,
    max_periods: int = MAX_PERIODS,
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
        # largest remainders: exactly max_periods windows, each bucket within one of its share
        share = counts * (max_periods / total)
        counts = np.floor(share).astype(np.int64)
        short = max_periods - int(counts.sum())
        counts[np.argsort(-(share - counts), kind="stable")[:short]] += 1
    else:
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
    demand = np.rint(cores * period_us).astype(np.int64)
    stands_for = round(float(total)) if total > max_periods else None
    return PeriodEvidence(demand, period_us, stands_for=stands_for, in_order=False)


def quantile(
    upper_bounds_cores: Sequence[float], cumulative_counts: Sequence[float], q: float
) -> float | None:
    """The ``q`` quantile of a cumulative histogram, as PromQL's ``histogram_quantile``.

    Linear inside the bucket it falls in; in the ``+Inf`` bucket, the last finite
    bound. None for an empty histogram.
    """
    pairs = sorted(zip(upper_bounds_cores, cumulative_counts, strict=True))
    total = pairs[-1][1] if pairs else 0.0
    if total <= 0:
        return None
    rank, low, below = q * total, 0.0, 0.0
    for bound, count in pairs:
        if count >= rank and count > below:
            if not np.isfinite(bound):
                return low
            return low + (bound - low) * (rank - below) / (count - below)
        if np.isfinite(bound):
            low = bound
        below = max(below, count)
    return low


def highest(upper_bounds_cores: Sequence[float], cumulative_counts: Sequence[float]) -> float:
    """The upper bound of the highest bucket holding any window (the last finite bound
    for ``+Inf``): what the largest window reached, to the histogram's resolution."""
    pairs = sorted(zip(upper_bounds_cores, cumulative_counts, strict=True))
    top, below = 0.0, 0.0
    finite = 0.0
    for bound, count in pairs:
        if count > below:
            top = bound if np.isfinite(bound) else finite
        if np.isfinite(bound):
            finite = bound
        below = max(below, count)
    return float(top)
