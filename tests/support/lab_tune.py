"""What test_lab_tune.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.lab_seeds import (
    REMEASURE_LOST_MS,
)
from support.machine import KERNEL_LAYOUT
from support.paths import ROOT

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")
RUN_KEYS = {"limit", "latency_ms", "wall_ms", "nr_periods", "nr_throttled", "throttled_ms",
            "nr_bursts", "burst_ms", "throttle_ratio"}  # fmt: skip
MET = 0.05 + 0.02
"""The target (0.05) and the goal's margin over it (docs/benchmarks.md §4)."""
OVER = 1.25
"""How far above the measured need a recommendation may go: the goal of issue 3 (ours
within 1.25 × the kernel's minimum); the 10 % headroom takes most of it."""


MORE_TUNES = 2
"""How many times a tune is run again whose answer misses, sized from runs the host took
from (:func:`judged`)."""


def final_run(result: dict[str, Any]) -> dict[str, Any]:
    """The run of our last answer: the refined one's when there is one."""
    run: dict[str, Any] = result["refined"]["after"] if result["refined"] else result["after"]
    return run


def sized_from(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs our last answer was sized from: today's, and the first answer's if refined."""
    return [result["before"], *([result["after"]] if result["refined"] else [])]


def judged(
    run_tune: Callable[[], dict[str, Any]], misses: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """A tune, run again (at most :data:`MORE_TUNES` times) while its answer misses and the
    host took :data:`REMEASURE_LOST_MS` or more from a run the answer was sized from: what
    it takes is neither usage nor wait, so the evidence reads less demand than there was.
    Beside a hog, with 2-8 s of host steal over a test, the tune in a pod answered
    1,350-1,730m (a burst beside the first three), throttled in 3-7 of 8-11 periods. An
    answer that misses from runs the host left alone fails at once."""
    result = run_tune()
    for _ in range(MORE_TUNES):
        took = max(run["lost_ms"] for run in sized_from(result))
        if not misses(result) or took < REMEASURE_LOST_MS:
            break
        print(f"{result['scenario']}: tuned again, the host took {took:.0f} ms from a run "
              "the answer was sized from")  # fmt: skip
        result = run_tune()
    return result


def needed_millicores(result: dict[str, Any]) -> float:
    """What the test itself measured the workload to need: the demand today's run showed
    (usage + the larger of throttled time and wait, over the wall time the host left it:
    what it took from the tasks, ``lost_ms``, was neither), or a smaller limit that it saw
    meet the target (a baseline's, or ours), whichever is less."""
    before = result["before"]
    demand = before["usage_ms"] + max(before["throttled_ms"], before["wait_ms"])
    wall_ms = before["wall_ms"] - before["lost_ms"]
    tried = [(b["limit_millicores"], b["after"]) for b in result["baselines"]]
    tried.append((result["recommendation"]["limit_millicores"], result["after"]))
    if result["refined"]:
        refined = result["refined"]
        tried.append((refined["recommendation"]["limit_millicores"], refined["after"]))
    met = [limit for limit, after in tried if after["throttle_ratio"] <= MET]
    return min([1000 * demand / wall_ms, *met])


def spared(run: dict[str, Any], period_ms: float = 100.0) -> float:
    """How many of a busy thread's periods the host, or other processes, could have kept
    from its quota: in a period it was not throttled in, it ran less than the quota, so
    it lost or waited behind others the rest, at least period − quota. The lab measures
    what the host took from its tasks (``lost_ms``: steal), and wait beyond throttled time
    is the others'. Once on CI, beside 5.9 s of host steal over the test, half a CPU was
    throttled in 29 of its 36 periods."""
    free_ms = period_ms * (1 - run["limit"]["cpus"])
    others_ms = max(0.0, run["wait_ms"] - run["throttled_ms"])
    return float((run["lost_ms"] + others_ms) / free_ms)


SPARED_AT_MOST = 0.25
"""The share of a run's periods :func:`spared` may count as throttled: past it the run is
the host's more than the quota's (:func:`spared_too_many`; the CI run above needed 0.1)."""


def throttled_but_for_the_host(run: dict[str, Any]) -> float:
    """A busy thread's throttle ratio counting the periods :func:`spared` as throttled, at
    most :data:`SPARED_AT_MOST` of them."""
    excused = min(spared(run), SPARED_AT_MOST * run["nr_periods"])
    return float((run["nr_throttled"] + excused) / run["nr_periods"])


def spared_too_many(run: dict[str, Any]) -> bool:
    """The host or other processes could have spared more of its periods than are excused."""
    return spared(run) > SPARED_AT_MOST * run["nr_periods"]


def assert_small(result: dict[str, Any]) -> None:
    """Every recommendation of ours within ``OVER`` × the need the same run measured."""
    need = needed_millicores(result)
    ours = [result["recommendation"]["limit_millicores"]]
    if result["refined"]:
        ours.append(result["refined"]["recommendation"]["limit_millicores"])
    assert all(limit <= OVER * need for limit in ours), (ours, f"need {need:.0f}m")


def tune_as_the_operator_reads(name: str) -> dict[str, Any]:
    """``lab tune`` recommending from the agent's histogram and backlog series, as the
    operator reads them, not from the lab's own samples in order."""
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    scenario = ROOT / "scenarios" / f"{name}.yaml"
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", "--pin", "--no-baselines",
         "--evidence", "agent", str(scenario)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result
