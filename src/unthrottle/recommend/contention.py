"""Demand on a shared node, as a range (docs/recommend.md, "Busy nodes").

A thread beside busy neighbours waits for a CPU behind them as well as on its quota. The
two ends of what it wants:

- **what the quota hid**: usage + the quotas' stall (throttled time, the pod's share
  included), each window. Beside the same neighbours a larger limit gives it about this:
  the wait behind them stays, whatever the limit;
- **what the threads wanted**: usage + the whole wait (the run delay holds both), each
  window. If the node goes quiet, the thread gets a CPU whenever it wants one, and a limit
  sized without that wait throttles it (730m from the first end, throttled in every period
  once the node went quiet; 1100m from the second: docs/benchmarks.md §4).

The engine sizes to the second (the safe end) and states the expected throttling under
both. How the two are told apart, best first (:attr:`Split.how`):

1. **per period** (the lab's samples, :attr:`PeriodEvidence.quota_demand_us`): each
   period's own stall and wait; the wait of a period whose quota did not run out was all
   behind other processes;
2. **in proportion** (the agent's histogram, which keeps only their sum per window): the
   counters' contention (the agent's wait less the container's and its pod's throttled
   time) taken out of every window in proportion to its demand;
3. **PSI** (the kubelet's ``container_pressure_cpu_waiting_seconds_total``, cgroup v2):
   wall time, so the contention it gives is a lower bound, and the range's top with it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from unthrottle.recommend.types import Evidence, PeriodEvidence, Waits

PER_PERIOD = (
    "split period by period: the wait of a period whose quota did not run out is all others'"
)
IN_PROPORTION = "split in proportion: the agent's histogram keeps only their sum per window"
FROM_PSI = "from the kubelet's PSI: wall time, a lower bound for several threads"


@dataclass(frozen=True, slots=True)
class Split:
    """The quota's end of the demand, and how it was told apart from the whole."""

    quota_side: PeriodEvidence
    """The evidence with the wait behind other processes taken out of each window."""
    waits: Waits
    how: str
    """Which data told them apart, for the reason."""
    scale: float | None = None
    """In proportion: the share of each window kept (``quota_side`` is the whole × it).
    The simulation and the chain are homogeneous (a token bucket with every demand,
    quota and burst scaled throttles the same windows), so the quota's end is read as the
    whole at the limit ÷ ``scale``: the order the agent's backlog series keep, which are
    of the whole, then holds for it too."""

    @property
    def share(self) -> float:
        """The share of the threads' wait that was behind other processes, 0–1."""
        total = self.waits.contention_s + self.waits.throttled_s
        return self.waits.contention_s / total if total > 0 else 0.0


def split(evidence: Evidence) -> Split | None:
    """The quota's end of period-level evidence; None where the threads waited behind no
    other process (or the evidence is counters: they have no windows to take it out of)."""
    waits = evidence.waits
    if (not isinstance(evidence, PeriodEvidence) or waits is None or waits.contention_s <= 0
            or not evidence.periods):  # fmt: skip
        return None
    demand = evidence.demand_us
    if evidence.quota_demand_us is not None and evidence.quota_demand_us.size == demand.size:
        lower = np.minimum(evidence.quota_demand_us, demand)
        how, scale = PER_PERIOD, None
    else:
        # the histogram's windows stand for all observed periods: its mean is the window's
        total_s = float(demand.mean()) * evidence.observed_periods / 1e6
        keep = max(0.0, 1 - waits.contention_s / total_s) if total_s > 0 else 1.0
        lower = np.floor(demand * keep).astype(np.int64)
        how = FROM_PSI if waits.from_pressure else IN_PROPORTION
        if keep <= 0:
            return None
        scale = keep
    if np.array_equal(lower, demand):
        return None
    quota_side = replace(evidence, demand_us=np.asarray(lower, dtype=np.int64),
                         quota_demand_us=None, waits=None)  # fmt: skip
    return Split(quota_side, waits, how, scale)


def ratio_range(low: float | None, high: float | None) -> tuple[float, float] | None:
    """``(low, high)`` ordered and rounded as the expected ratio is; None without both."""
    if low is None or high is None:
        return None
    a, b = sorted((round(low, 4), round(high, 4)))
    return a, b


def reason(
    found: Split,
    *,
    limit: int,
    expected: tuple[float, float],
    lower_limit: int | None,
    upper_limit: int | None,
    from_ran: bool = False,
) -> str:
    """One line: how much of the wait was behind others, the two ends, which data split them.

    ``lower_limit``/``upper_limit``: what the quota's end and the whole ask for (None where
    the limit was not sized from them: today's kept on an oversubscribed node); ``from_ran``:
    the low end is on what certainly ran (throttled past the target today: usage +
    throttled time is an upper bound too)."""
    w = found.waits
    asks = ""
    if lower_limit is not None and upper_limit is not None and lower_limit < upper_limit:
        asks = f", about {lower_limit}m asked"
    low, high = expected
    seen = ("what certainly ran; usage + throttled time, an upper bound" if from_ran
            else "usage + throttled time")  # fmt: skip
    return (
        f"on a shared node the demand is a range: {w.contention_s:.1f} s of the "
        f"{w.contention_s + w.throttled_s:.1f} s its threads waited for a CPU "
        f"({found.share:.0%}) was behind other processes ({found.how}); at {limit}m it is "
        f"expected throttled in {low:.1%} of periods beside the same neighbours ({seen}"
        f"{asks}) and {high:.1%} if the node goes quiet (usage + wait, the end it is sized to)"
    )
