"""The baselines size from usage, as the tools they stand for do."""

from __future__ import annotations

import numpy as np

from unthrottle.recommend.baselines import baselines, window_rates


def test_rates_are_per_1s_window_in_cores() -> None:
    usage = np.asarray([50_000] * 10 + [100_000] * 10, dtype=np.int64)
    assert window_rates(usage, 100_000).tolist() == [0.5, 1.0]


def test_a_run_shorter_than_a_window_is_one_window() -> None:
    assert window_rates(np.asarray([30_000] * 4, dtype=np.int64), 100_000).tolist() == [0.3]


def test_each_baseline_follows_its_definition() -> None:
    usage = np.asarray([20_000] * 90 + [60_000] * 10, dtype=np.int64)  # ten 1 s windows
    by_name = {b.name: b.limit_millicores for b in baselines(usage, 100_000)}
    # rates: nine windows at 0.2, one at 0.6; p90 (nearest rank, 9th of 10) is 0.2
    assert by_name["vpa"] == 230  # 0.2 × 1.15
    assert by_name["krr-simple-limit"] == 600  # p96: the one busy window
    assert by_name["2x-average"] == 480  # 2 × 0.24


def test_censored_usage_keeps_the_baselines_at_the_limit() -> None:
    # Throttled at 0.25 CPU: usage never passes 25 ms, whatever the demand was.
    usage = np.full(100, 25_000, dtype=np.int64)
    by_name = {b.name: b.limit_millicores for b in baselines(usage, 100_000)}
    assert by_name["vpa"] == 288 and by_name["krr-simple-limit"] == 250
