"""`unthrottle-lab tune`: today's settings measured, ours proven on the kernel (slow, root)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from support.lab_tune import (
    MET,
    RUN_KEYS,
    UNTHROTTLE_LAB,
    assert_small,
    final_run,
    judged,
    sized_from,
    spared_too_many,
    throttled_but_for_the_host,
    tune_as_the_operator_reads,
)
from support.machine import KERNEL_LAYOUT
from support.paths import ROOT


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
