"""`unthrottle-lab tune`: today's settings measured, ours proven on the kernel (slow, root)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import KERNEL_LAYOUT, ROOT
from test_lab_seeds import REMEASURE_LOST_MS

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


@pytest.mark.kernel
@pytest.mark.slow
def test_tune_brings_a_throttled_workload_under_the_target_where_vpa_does_not() -> None:
    """30 ms tasks back to back at half a CPU: VPA sizes from the usage the quota censors
    (578m measured, docs/benchmarks.md §4) and stays throttled in every period; ours
    does not. Measured with the machine's other processes at idle priority (--isolate),
    so it holds beside other load."""
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    scenario = ROOT / "scenarios" / "tune-serial-30ms.yaml"

    def run_tune() -> dict[str, Any]:
        out = subprocess.run(
            [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", str(scenario)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        tuned: dict[str, Any] = json.loads(out.stdout)
        return tuned

    def misses(tuned: dict[str, Any]) -> bool:
        vpa = next(b["after"] for b in tuned["baselines"] if b["name"] == "vpa")
        return bool(final_run(tuned)["throttle_ratio"] > MET
                    or spared_too_many(tuned["before"]) or spared_too_many(vpa))  # fmt: skip

    result = judged(run_tune, misses)
    assert result["scenario"] == "tune-serial-30ms" and result["target"] == 0.05
    assert set(result["before"]) >= RUN_KEYS and set(result["after"]) >= RUN_KEYS
    rec = result["recommendation"]
    assert set(rec) >= {"limit_millicores", "burst_us", "gomaxprocs", "expected_throttle_ratio",
                        "confidence", "reasons"}  # fmt: skip
    assert rec["burst_us"] <= rec["limit_millicores"] * 100  # never above the quota
    names = {b["name"]: b for b in result["baselines"]}
    assert set(names) == {"vpa", "krr-simple-limit", "2x-average"}
    # half a CPU for a busy thread: throttled in every period the host left it
    assert throttled_but_for_the_host(result["before"]) > 0.9, result["before"]
    assert final_run(result)["throttle_ratio"] <= MET
    # and no bigger than it needs: a busy thread wants one CPU (2x-average's 1002m met
    # the target in docs/benchmarks.md §4; ours 1110m, with its 10 % headroom)
    assert_small(result)
    # VPA sizes from censored usage and keeps the container throttled.
    assert throttled_but_for_the_host(names["vpa"]["after"]) > 0.5, names["vpa"]["after"]
    assert names["vpa"]["limit_millicores"] < rec["limit_millicores"]


def test_a_bad_target_is_refused_naming_the_field_before_anything_runs() -> None:
    scenario = ROOT / "scenarios" / "seed-002-burst.yaml"
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--target", "1.5", str(scenario)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "1.5 is not in (0, 1)" in out.stderr


@pytest.mark.kernel
@pytest.mark.slow
def test_on_a_busy_node_tune_meets_the_target_under_the_same_contention() -> None:
    """Both cores busy with other processes' threads (``other_threads: 2``): the thread gets
    half a core, is throttled at 0.4 CPU, and waits behind them. The demand the contention
    hid is counted from the wait: the answer is the core it wants (measured 1100m), which
    meets the target beside the same two threads and on a quiet node alike. Sized from
    usage + throttled time alone it was 730m, throttled in every period once the node was
    quiet (docs/benchmarks.md §4)."""
    assert KERNEL_LAYOUT is not None, "conftest fails a CI run without a cgroup CPU controller"
    scenario = ROOT / "scenarios" / "tune-serial-busy.yaml"
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--json", "--isolate", "--no-baselines", str(scenario)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["before"]["limit"] == {"cpus": 0.4, "other_threads": 2}
    assert result["before"]["throttle_ratio"] > 0.05
    assert result["before"]["wait_ms"] > result["before"]["throttled_ms"]  # contention too
    rec = result["recommendation"]
    assert any("the demand counts the time its threads waited" in r for r in rec["reasons"])
    # the whole core it wants (usage + throttled time read 0.6 of one), so that it is not
    # throttled once the node's other load moves away
    assert rec["limit_millicores"] >= 1000
    final = result["refined"]["after"] if result["refined"] else result["after"]
    assert final["limit"]["other_threads"] == 2  # measured beside the same threads
    assert final["throttle_ratio"] <= MET
    # and no more than that core (+ headroom): today's run read usage + wait of one CPU
    assert_small(result)


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


@pytest.mark.kernel
@pytest.mark.slow
def test_peaks_in_runs_of_seconds_get_a_limit_that_covers_them_and_no_burst() -> None:
    """The demo's batch with its rounds in runs (two cores busy 0.8 s, then 1.6 s idle),
    throttled at one CPU. From the histogram alone the windows were shuffled, the bucket
    refilled between them, and the answer was a smaller limit with a burst that the kernel
    throttled in most periods (docs/benchmarks.md §4, "Peaks in runs"; a histogram alone
    now gets the order worst for a burst); the backlog series show the runs: no burst, and
    the kernel agrees with the target."""
    result = tune_as_the_operator_reads("tune-batch-runs")
    assert result["before"]["throttle_ratio"] > 0.5
    rec = result["recommendation"]
    assert rec["burst_us"] == 0 and rec["limit_millicores"] >= 2000  # the two busy cores
    assert any("does not show that a burst" in r for r in rec["reasons"])
    assert result["after"]["throttle_ratio"] <= MET
    if result["refined"]:
        # refined from the unthrottled run: still a limit over the two busy cores (a burst
        # may sit on top of it, for windows the histogram's 2-2.5 bucket reads above them)
        refined = result["refined"]
        assert refined["recommendation"]["limit_millicores"] >= 2000
        assert refined["after"]["throttle_ratio"] <= MET


@pytest.mark.kernel
@pytest.mark.slow
def test_peaks_that_stand_apart_keep_a_burst_and_meet_the_target() -> None:
    """Seed 002's burst: a 20 ms task every 93 ms at 0.25 CPU, so a window now and then
    holds two tasks. The backlog drains between them: the burst stays, and the kernel
    meets the target under it. Tuned again (:func:`judged`) where the host took from the
    runs the answer was sized from: once beside a hog, with 5 s of host steal over this
    test, the agent's view read the tasks as a run and kept no burst."""

    def no_burst_or_missed(tuned: dict[str, Any]) -> bool:
        return bool(tuned["recommendation"]["burst_us"] == 0
                    or final_run(tuned)["throttle_ratio"] > MET)  # fmt: skip

    result = judged(lambda: tune_as_the_operator_reads("seed-002-burst"), no_burst_or_missed)
    rec = result["recommendation"]
    took = max(run["lost_ms"] for run in sized_from(result))
    assert rec["burst_us"] > 0, f"no burst; the host took {took:.0f} ms from a run sized from"
    assert rec["limit_millicores"] <= 400  # the 0.215 core it averages, and a burst
    assert not any("order of the windows is unknown" in r for r in rec["reasons"])
    assert result["after"]["throttle_ratio"] <= MET
    if result["refined"]:
        assert result["refined"]["after"]["throttle_ratio"] <= MET


def test_an_unknown_evidence_view_is_refused_naming_the_option() -> None:
    scenario = ROOT / "scenarios" / "seed-002-burst.yaml"
    out = subprocess.run(
        [str(UNTHROTTLE_LAB), "tune", "--evidence", "raw", str(scenario)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--evidence" in out.stderr and "agent" in out.stderr
