"""bench/sched_trace.py's reading of a scheduler trace: whose threads, and their turns."""

from __future__ import annotations

import sys

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import sched_trace

ATTACH = ("  unthrottle-9   [001] d..1. 10.000000: cgroup_attach_task: dst_root=1 dst_id=5 "
          "dst_level=2 dst_path=/unthrottle-lab-9-0-pod/{role} pid={pid} comm=python3")  # fmt: skip
SWITCH = ("  python3-{prev}   [001] d..2. {t:.6f}: sched_switch: prev_comm=python3 "
          "prev_pid={prev} prev_prio=120 prev_state={state} ==> next_comm=python3 "
          "next_pid={next} next_prio=120")  # fmt: skip


def trace(steps: list[tuple[float, int, str, int]]) -> list[str]:
    lines = [ATTACH.format(role="container", pid=11), ATTACH.format(role="container", pid=12),
             ATTACH.format(role="sidecar", pid=13)]  # fmt: skip
    lines += [SWITCH.format(t=t, prev=p, state=s, next=n) for t, p, s, n in steps]
    return lines


# the sidecar (13) and a batch worker (11) take turns, 8 ms to 4 ms, then the batch
# worker is switched out to idle (its quota spent: not a turn), and the sidecar sleeps
STEPS = [(11.000, 0, "R", 11), (11.004, 11, "R", 13), (11.012, 13, "R", 11),
         (11.016, 11, "R", 13), (11.024, 13, "R", 11), (11.028, 11, "R+", 0),
         (11.040, 0, "R", 13), (11.050, 13, "S", 0)]  # fmt: skip


def test_the_threads_are_told_apart_by_their_cgroups() -> None:
    assert sched_trace.pods(trace([])) == {0: {"container": [11, 12], "sidecar": [13]}}


def test_only_preemptions_both_ways_count_as_turns() -> None:
    found = sched_trace.turns(sched_trace.switches(trace(STEPS)), 13, {11, 12}, 10.0, 12.0)
    assert round(found.sidecar * 1000, 3) == 16.0  # 11.004-11.012 and 11.016-11.024
    assert round(found.batch * 1000, 3) == 4.0  # 11.012-11.016; the last 4 ms ended in idle
    assert found.sidecar_beside == found.batch_beside == 0.0  # no batch thread elsewhere


def test_turns_beside_the_batchs_other_thread_running_elsewhere_are_told_apart() -> None:
    # batch thread 12 runs on CPU 0 from 11.010: the turns after it count as beside it
    elsewhere = SWITCH.format(t=11.010, prev=0, state="R", next=12).replace("[001]", "[000]")
    lines = [*trace(STEPS[:2]), elsewhere, *trace(STEPS[2:])[3:]]
    found = sched_trace.turns(sched_trace.switches(lines), 13, {11, 12}, 10.0, 12.0)
    assert round(found.sidecar_beside * 1000, 3) == 8.0  # 11.016-11.024
    assert round(found.batch_beside * 1000, 3) == 4.0  # 11.012-11.016


def test_a_runs_span_ends_at_the_sidecars_last_sleep_and_lasts_its_wall_time() -> None:
    runs = [{"sidecar": {"wall_ms": 30.0}}]  # from 11.020: no whole turn in it
    none = {"turns": 0, "median_ms": None, "one_tick": 0, "longer": 0}
    assert sched_trace.shares(trace(STEPS), runs)[0] == {
        "sidecar_ms": 0.0, "batch_ms": 0.0, "sidecar_share": None, "beside_ms": 0.0,
        "sidecar_share_beside": None, "sidecar_turns": none, "batch_turns": none,
    }  # fmt: skip
    runs = [{"sidecar": {"wall_ms": 50.0}}, {"limit": {}}]  # from 11.000
    first, second = sched_trace.shares(trace(STEPS), runs)
    assert first is not None and (first["sidecar_ms"], first["batch_ms"]) == (16.0, 4.0)
    assert first["sidecar_share"] == 0.8 and second is None
    # HZ=250: a tick is 4 ms; the sidecar's two 8 ms turns are two ticks, the batch's one
    assert first["sidecar_turns"] == {"turns": 2, "median_ms": 8.0, "one_tick": 0, "longer": 2}
    assert first["batch_turns"] == {"turns": 1, "median_ms": 4.0, "one_tick": 1, "longer": 0}


def test_the_turns_are_kept_one_by_one_in_order() -> None:
    found = sched_trace.turns(sched_trace.switches(trace(STEPS)), 13, {11, 12}, 10.0, 12.0)
    assert [round(t * 1000, 3) for t in found.sidecar_turns] == [8.0, 8.0]
    assert [round(t * 1000, 3) for t in found.batch_turns] == [4.0]
