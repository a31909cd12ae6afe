"""What other tools would recommend from the same samples: the yardsticks for ``lab tune``.

All three size from *usage*, which is capped by the quota when throttled
(censored), because that is what they read. Ours sizes from demand (usage +
throttled time), period by period.

- **VPA-style**: p90 of usage rates over windows × 1.15 (VPA's
  ``--recommendation-margin-fraction`` default). VPA scales the limit with the
  request; with request = limit the limit is that target.
- **KRR simple_limit-style**: p96 of usage rates over windows.
- **2× average usage**: a common rule of thumb.

VPA reads 1-minute samples and KRR 75 s rates. A lab run lasts seconds, so both
use windows of 1 s (10 periods of 100 ms): coarse against the period, as theirs
are against a real workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

WINDOW_US = 1_000_000
VPA_PERCENTILE = 90
VPA_MARGIN = 0.15
KRR_PERCENTILE = 96


@dataclass(frozen=True, slots=True)
class Baseline:
    """A baseline's limit (millicores; never below 10m) and how it was computed."""

    name: str
    limit_millicores: int
    how: str


def window_rates(usage_us: npt.NDArray[np.int64], period_us: int) -> npt.NDArray[np.float64]:
    """Usage per window, in cores (the last partial window dropped unless it is the only one)."""
    per_window = max(1, WINDOW_US // period_us)
    whole = usage_us.size // per_window
    if whole == 0:
        return np.asarray([usage_us.sum() / (usage_us.size * period_us)], dtype=np.float64)
    sums = usage_us[: whole * per_window].reshape(whole, per_window).sum(axis=1)
    return np.asarray(sums / (per_window * period_us), dtype=np.float64)


def _millicores(cores: float) -> int:
    return max(10, math.ceil(cores * 1000))


def baselines(usage_us: npt.NDArray[np.int64], period_us: int) -> list[Baseline]:
    """The three baselines from per-period usage."""
    rates = window_rates(usage_us, period_us)
    average = float(usage_us.sum()) / (usage_us.size * period_us) if usage_us.size else 0.0
    vpa = float(np.percentile(rates, VPA_PERCENTILE, method="inverted_cdf")) * (1 + VPA_MARGIN)
    krr = float(np.percentile(rates, KRR_PERCENTILE, method="inverted_cdf"))
    return [
        Baseline("vpa", _millicores(vpa), "p90 of 1 s usage rates × 1.15"),
        Baseline("krr-simple-limit", _millicores(krr), "p96 of 1 s usage rates"),
        Baseline("2x-average", _millicores(2 * average), "2 × average usage"),
    ]
