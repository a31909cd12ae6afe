"""`make demo`'s verdict on the operator's estimate (demo/measuring.py), pure: the expected
range from the policy's status beside the ratio the kernel measured, and the "its estimate
of the demand was wrong" line only where the measured ratio falls outside that range.

The run that issue 41 quotes: the pool, 600m → 1200m beside a CPU hog, status "expected
100.0 %", the kernel 0.0 %. With the range (0.0–99.7 %) the measurement is inside it; the
whole demo on a real node is tests/kernel/test_demo_loop.py."""

from __future__ import annotations

import sys
from typing import Any

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "demo"))
from measuring import SPREAD, expectations, expected_cell, honest


def status(span: list[float] | None, point: float | None) -> dict[str, Any]:
    return {"workloads": [{"deployment": "pool", "containers": [
        {"expectedThrottleRatio": point, "expectedThrottleRatioRange": span}]}]}  # fmt: skip


def measured(ratio: float) -> dict[str, Any]:
    after = {"throttle_ratio": ratio, "pod_throttle_ratio": ratio, "pod_throttled_s": 0.0,
             "limit_millicores": 1200}  # fmt: skip
    before = {"agent_wait_s": 22.3, "usage_s": 14.0}
    return {"pool": {"before": before, "after": after}}


def wrong(lines: list[str]) -> list[str]:
    return [line for line in lines if "its estimate of the demand was wrong" in line]


def test_a_measured_ratio_inside_the_expected_range_is_not_called_wrong() -> None:
    assert wrong(honest(measured(0.0), status([0.0, 0.9967], 0.9967))) == []


def test_the_same_measurement_against_a_point_of_100_percent_is_called_wrong() -> None:
    # what the demo printed before the range (an older operator's status has no range)
    (line,) = wrong(honest(measured(0.0), status(None, 1.0)))
    assert line.startswith("pool: the operator expected 100.0 % of periods throttled at 1200m")


def test_outside_the_range_by_more_than_the_spread_it_is_called_wrong() -> None:
    (line,) = wrong(honest(measured(0.02 + SPREAD + 0.01), status([0.0, 0.02], 0.02)))
    assert "expected 0.0–2.0 % of periods" in line


def test_the_table_cell_shows_the_range_or_the_point() -> None:
    assert expectations(status([0.0, 0.9967], 0.9967)) == {"pool": (0.0, 0.9967)}
    assert expectations(status(None, 0.02)) == {"pool": (0.02, 0.02)}
    assert expected_cell((0.0, 0.9967)) == "0.0–99.7 %"
    assert expected_cell((0.02, 0.02)) == "2.0 %"
    assert expected_cell(None) == "–"
