"""How fast the CFS model simulates a week of 100 ms periods for one container.

    python bench/simulate_speed.py

Goal (issue 2): 6,048,000 periods in ≤ 1 s. Demand is bursty (mostly light
periods, 10 % spikes above the quota), the bandwidth has a burst, so every
part of the model runs. Prints the best and median of 7 runs.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from unthrottle.cfs import Bandwidth, simulate_series

PERIODS = 7 * 24 * 3600 * 10


def main() -> None:
    rng = np.random.default_rng(42)
    demand = rng.integers(0, 40_000, PERIODS)
    spikes = rng.random(PERIODS) < 0.1
    demand[spikes] += rng.integers(40_000, 200_000, int(spikes.sum()))
    bandwidth = Bandwidth(60_000, 100_000, 30_000)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        result = simulate_series(demand, bandwidth)
        times.append(time.perf_counter() - start)
    print(f"periods: {PERIODS:,}; throttle ratio {result.throttle_ratio:.3f}")
    print(f"best {min(times):.3f} s, median {statistics.median(times):.3f} s (goal ≤ 1 s)")


if __name__ == "__main__":
    main()
