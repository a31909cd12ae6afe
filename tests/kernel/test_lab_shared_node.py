"""A shared node on the kernel (issue 41): what a reviewer reads before Apply is what the
kernel then shows (slow, root).

``lab tune`` beside other processes' threads (each in a cgroup of its own, like a
neighbouring container): the first answer is sized to what the threads wanted (usage +
wait), its expected throttle ratio is a range down to what the quota hid (usage +
throttled time), and the ratio the kernel measures under that answer, beside the same
threads, lies in the range widened by the kernel's own spread (:data:`SPREAD`). Beside one
busy thread the range's bottom is near the kernel's own minimum for that neighbour,
measured by ``bench/tune_shared.py`` (bench/results/tune-shared.json); on a node with both
cores busy the answer still meets the target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.lab_seeds import (
    REMEASURE_LOST_MS,
)
from support.machine import KERNEL_LAYOUT
from support.paths import ROOT

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
SAVED = json.loads((ROOT / "bench" / "results" / "tune-shared.json").read_text())
MINIMUM = {row["scenario"]: row["minimum_millicores"] for row in SAVED["rows"]}
"""The kernel's own minimum beside the scenario's other threads: the smallest limit whose
measured ratio met the target there, binary-searched in 10m steps (bench/tune_shared.py)."""
GOAL = 1.25
"""Issue 41: the first answer within 1.25 × the kernel's minimum, or the top of a range whose
bottom is (a quiet node's answers are within 1.05 ×, docs/benchmarks.md §4)."""
SPREAD = 0.05
"""The kernel's spread the expected range is widened by: beside the busy neighbour, where
the ratio is sensitive to the limit, one 10m step moved it 0.021-0.083 (860-880m, 1-4 of
48 periods) and the minimum run five times read 0.042 each time
(bench/results/tune-shared.json: ``sweeps``, ``spread_at_minimum``)."""
MET = 0.05 + 0.02
"""The target and the goal's margin over it (docs/benchmarks.md §4), as tests/test_lab_tune."""
MORE_TUNES = 2
"""Tunes run again while the measured ratio misses the range and the host took
:data:`REMEASURE_LOST_MS` or more from a run (steal: neither usage nor wait)."""


def tuned(name: str) -> dict[str, Any]:
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", "--no-baselines",
         str(ROOT / "scenarios" / f"{name}.yaml")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def outside(result: dict[str, Any]) -> bool:
    """Does the kernel's ratio under the first answer fall outside its widened range?"""
    low, high = result["recommendation"]["expected_throttle_ratio_range"]
    return not low - SPREAD <= result["after"]["throttle_ratio"] <= high + SPREAD


def judged(name: str, misses: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """A tune, run again (at most :data:`MORE_TUNES` times) only while it misses and the
    host took time from one of its runs."""
    result = tuned(name)
    for _ in range(MORE_TUNES):
        took = max(result["before"]["lost_ms"], result["after"]["lost_ms"])
        if not misses(result) or took < REMEASURE_LOST_MS:
            break
        print(f"{name}: tuned again, the host took {took:.0f} ms from a run")
        result = tuned(name)
    return result


def assert_a_shared_node_range(result: dict[str, Any], others: int) -> None:
    """Today's run waited behind the others; the answer says so and carries the range."""
    before, rec = result["before"], result["recommendation"]
    assert before["limit"]["other_threads"] == others
    assert before["throttle_ratio"] > 0.05
    assert before["wait_ms"] > before["throttled_ms"]  # behind the neighbours too
    assert result["after"]["limit"]["other_threads"] == others  # measured beside them
    low, high = rec["expected_throttle_ratio_range"]
    assert 0 <= low <= high == rec["expected_throttle_ratio"], rec
    said = [r for r in rec["reasons"] if r.startswith("on a shared node the demand is a range")]
    assert said and "split period by period" in said[0], rec["reasons"]
    assert rec["lower_limit_millicores"] < rec["limit_millicores"], rec


def test_beside_a_busy_neighbour_the_kernel_lands_in_the_range_near_its_minimum() -> None:
    """The request pool throttled at 0.6 CPU beside one busy thread. Before issue 41 the
    first answer was 1.45 × the kernel's minimum there (about 1,300m + 95 ms against
    900m), expected 5 %, measured 0 %."""
    name = "tune-open-pool-neighbour"
    result = judged(name, outside)
    assert_a_shared_node_range(result, 1)
    rec = result["recommendation"]
    low, high = rec["expected_throttle_ratio_range"]
    assert not outside(result), (low, high, result["after"]["throttle_ratio"], SPREAD)
    floor = MINIMUM[name]
    top, bottom = rec["limit_millicores"], rec["lower_limit_millicores"]
    assert top <= GOAL * floor or floor / GOAL <= bottom <= GOAL * floor, (bottom, top, floor)
    # printed in the tune's table: what a reviewer reads beside what the kernel measured
    shown = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--isolate", "--no-baselines",
         str(ROOT / "scenarios" / f"{name}.yaml")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "(beside the same neighbours – if the node goes quiet), measured" in shown.stdout


def test_on_a_busy_node_the_range_holds_the_kernel_and_the_target_is_met() -> None:
    """One busy thread throttled at 0.4 CPU beside two others, both cores busy: sized to the
    whole core it wants (usage + wait: 1,100m), which meets the target beside them and on
    a quiet node; beside them it asks for about 730m (usage + throttled time), the range's
    bottom (docs/benchmarks.md §4)."""
    name = "tune-serial-busy"

    def misses(result: dict[str, Any]) -> bool:
        final = result["refined"]["after"] if result["refined"] else result["after"]
        return outside(result) or final["throttle_ratio"] > MET

    result = judged(name, misses)
    assert_a_shared_node_range(result, 2)
    rec = result["recommendation"]
    assert not outside(result), (rec["expected_throttle_ratio_range"], result["after"])
    assert rec["limit_millicores"] >= 1000  # the whole core, for a node gone quiet
    floor = MINIMUM[name]  # the half core it gets beside them
    assert floor / GOAL <= rec["lower_limit_millicores"] <= GOAL * floor, (rec, floor)
    final = result["refined"]["after"] if result["refined"] else result["after"]
    assert final["throttle_ratio"] <= MET
