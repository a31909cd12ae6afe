"""A late reading's counters, attributed by the refills its window holds (no kernel).

The lab reads a run's cgroup 1 ms after each of the kernel's period boundaries. A reading
taken late holds usage of the next period, while that period's throttled time is booked
at its own refill, in the next window: read as one period, such a window wants two
quotas' usage beside one period's stall (docs/benchmarks.md §3, "Late readings").
``bench/results/late-booked.json`` holds a measured run whose refills the kernel booked
after the readings, ``bench/results/late-readings.json`` runs read late on purpose, each
with its truth (the same workload unlimited): they are replayed here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import numpy as np

from support.paths import ROOT
from unthrottle.cgroups import CpuStat
from unthrottle.recommend import Current, Policy, recommend
from unthrottle_lab.agentview import View, as_read
from unthrottle_lab.sampling import LATE_NS, PeriodSamples, Reading, Refills, attribute
from unthrottle_lab.tune import evidence_of

sys.path.insert(0, str(ROOT / "bench"))
import late_readings

P = 100_000_000  # ns
QUOTA = 50_000  # µs, two threads at 0.5 CPU
GRANT = QUOTA  # no burst
REFILLS = Refills(start_ns=0, period_ns=P, boundary_ns=0, grant_us=GRANT)


def saved(name: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads((ROOT / "bench" / "results" / name).read_text())["runs"]
    return runs


def truth_is_the_truth(run: dict[str, Any]) -> bool:
    """test_censoring's check of its unlimited run: two threads busy back to back want
    ~2 CPUs (median window over 150 ms); beside other load they do not get them, and
    the comparison says nothing."""
    truth = late_readings.demand_attributed(run["truth"])
    median = int(np.median(truth[truth > 0]) // 1000)
    assert median == run["truth_median_window_ms"]
    return median > 150


def throttled_at_half_a_cpu(at_ns: int) -> CpuStat:
    """Two busy threads under 50 ms per 100 ms period, as the kernel counts them at
    ``at_ns``: each period they run 25 ms on both CPUs, then stall until the refill,
    which books the period's 150 ms of throttled time (and wait)."""
    period, into = divmod(at_ns, P)
    usage = period * QUOTA + 2 * min(into // 1000, QUOTA // 2)
    stalled = period * 2 * (P // 1000 - QUOTA // 2)
    return CpuStat(usage_us=usage, nr_periods=period, nr_throttled=period,
                   throttled_us=stalled, nr_bursts=0, burst_us=0, wait_us=stalled)  # fmt: skip


def read_at(times_ms: list[float]) -> list[Reading]:
    return [(round(t * 1e6), throttled_at_half_a_cpu(round(t * 1e6))) for t in times_ms]


def demand(usage: list[int], throttled: list[int]) -> list[int]:
    return [u + t for u, t in zip(usage, throttled, strict=True)]


def test_a_reading_40_ms_late_leaves_every_period_its_own_demand() -> None:
    on_time = [0, 101, 201, 301, 401, 501]
    late = [0, 101, 201, 341, 401, 501]  # the third boundary's reading 40 ms late
    usage, throttled, wait = attribute(read_at(late), REFILLS)
    assert demand(usage, throttled) == demand(*attribute(read_at(on_time), REFILLS)[:2])
    assert demand(usage, throttled)[1:] == [200_000] * 4
    # read as one period each, the late window wants 248 ms and the next 152 ms
    as_read = np.diff([[s.usage_us, s.throttled_us] for _, s in read_at(late)], axis=0)
    assert as_read.sum(axis=1).tolist()[2:4] == [248_000, 152_000]
    assert wait == throttled


def test_windows_are_counted_in_the_refills_they_hold() -> None:
    """A reading more than a period late makes a window holding two refills, then one
    holding none (the schedule catches up at once): two periods, nothing lost."""
    times = [0, 101, 201, 431, 431.1, 501, 601]
    usage, throttled, _ = attribute(read_at(times), REFILLS)
    assert len(usage) == 6  # the boundaries up to the last reading
    assert usage[1:] == [QUOTA] * 5 and throttled[1:] == [150_000] * 5
    assert sum(usage) == throttled_at_half_a_cpu(round(601e6)).usage_us


def test_a_refill_the_kernel_booked_after_the_reading_goes_with_its_period() -> None:
    """As measured (bench/results/late-booked.json): at one boundary the period timer
    came after the reading (nr_periods unchanged, no throttled time), and the next window
    held two periods' stall; at another, one CPU's unthrottle came late (64 ms of the
    stall in its window, 214 in the next). Here, two threads at 0.5 CPU, which cannot want
    more than 200 ms a period: read as they came, 100 and 300 ms, then 114 and 286."""
    readings = [(0, stat(0, 0, 0)), (101_000_000, stat(50_000, 150_000, 1)),
                (201_000_000, stat(100_000, 150_000, 1)),  # the timer not yet fired
                (301_000_000, stat(150_000, 450_000, 3)),
                (401_000_000, stat(200_000, 514_000, 4)),  # one CPU's 86 ms comes late
                (501_000_000, stat(250_000, 750_000, 5))]  # fmt: skip
    usage, throttled, _ = attribute(readings, REFILLS, threads=2)
    assert [u + t for u, t in zip(usage, throttled, strict=True)] == [200_000] * 5
    usage, throttled, _ = attribute(readings, REFILLS)  # threads unknown: not moved back
    assert [u + t for u, t in zip(usage, throttled, strict=True)][3:] == [114_000, 286_000]


def test_a_wait_booked_when_the_thread_next_ran_goes_back_to_its_window() -> None:
    """The kernel books a thread's wait when the thread next runs: a thread stalled across
    a boundary has its wait in the window after. Measured in a pod whose quota ran out
    first, windows read 44-57 ms of wait beside 136-144 ms. Two threads cannot wait more
    than 200 ms a period beside their usage, so the excess is the window before's; the two
    quotas' stall, capped by each window's wait (cfs.pod.stalled_us), then reads what the
    window wanted, not 150 ms (and the next 240, cut to 200)."""
    booked = [0, 95_000, 145_000, 285_000]  # 95, 50 and 140 ms of wait as read
    readings = [(k * 100_000_000 + (1_000_000 if k else 0),
                 dataclasses.replace(stat(100_000 * k, 50_000 * k, k), wait_us=wait))
                for k, wait in enumerate(booked)]  # fmt: skip
    usage, throttled, wait = attribute(readings, REFILLS, threads=2)
    assert wait == [95_000, 90_000, 100_000]
    pod = np.full(3, 45_000, dtype=np.int64)  # the pod's own stall, booked in the pod
    samples = PeriodSamples(np.asarray(usage), np.asarray(throttled), P // 1000,
                            np.asarray(wait), threads=2, pod_throttled_us=pod)  # fmt: skip
    assert samples.demand_us.tolist() == [195_000, 190_000, 200_000]
    as_read = attribute(readings, REFILLS)  # threads unknown: nothing moved back
    assert as_read[2] == [95_000, 50_000, 140_000]


def stat(usage_us: int, throttled_us: int, periods: int) -> CpuStat:
    return CpuStat(usage_us=usage_us, nr_periods=periods, nr_throttled=periods,
                   throttled_us=throttled_us, nr_bursts=0, burst_us=0)  # fmt: skip


def test_an_on_time_reading_is_left_as_read_and_without_a_quota_nothing_is_moved() -> None:
    """Only a late reading's usage past its grants is moved: an on-time window that
    ran over the quota (the first period after an idle one measured 97 ms at 0.5 CPU, on
    the runtime its CPUs kept) and one 4 ms late (the sampler's usual jitter beside
    other load) keep theirs; a run without a quota has no grant to hold a window to."""
    assert LATE_NS > 4_000_000
    readings = [(0, stat(0, 0, 0)), (101_000_000, stat(97_000, 101_000, 1)),
                (204_000_000, stat(155_000, 250_000, 2)),
                (301_000_000, stat(195_000, 400_000, 3))]  # fmt: skip
    usage, throttled, _ = attribute(readings, REFILLS)
    assert usage == [97_000, 58_000, 40_000] and throttled == [101_000, 149_000, 150_000]
    late = [(t, stat(0, 0, 0) if t == 0 else s) for t, s in read_at([0, 101, 201, 341, 401])]
    unlimited = Refills(start_ns=0, period_ns=P, boundary_ns=0, grant_us=None)
    as_read = np.diff([s.usage_us for _, s in late]).tolist()
    assert attribute(late, unlimited)[0] == as_read
    assert attribute(late, REFILLS)[0] != as_read


def ratios(run: dict[str, Any]) -> tuple[float, float]:
    """The recommendation from the throttled run as read, and attributed, over the
    truth's; the saved summary is what the saved readings give."""
    summary = late_readings.summary(run["truth"], run["late"])
    assert {k: run[k] for k in summary} == summary
    truth = summary["from_truth_millicores"]
    return summary["as_read_millicores"] / truth, summary["attributed_millicores"] / truth


def test_a_run_whose_refills_were_booked_late_recommends_what_its_truth_does() -> None:
    """Measured with nothing read late on purpose (on a quiet machine): twice the kernel
    booked a period's throttled time after the reading 1 ms past its boundary (once the
    period timer itself, its nr_periods unchanged, then two periods in the next window).
    As read, windows of 347 and 265 ms beside the truth's 200 took the recommendation
    to 1.36x the truth's, past test_censoring's 1.25, as in CI (1.7x); attributed by the
    kernel's refills, 1.01x."""
    (run,) = saved("late-booked.json")
    assert truth_is_the_truth(run) and run["late"]["throttle_ratio"] > 0.8
    as_read, attributed = ratios(run)
    assert as_read > 1.25
    assert 0.8 <= attributed <= 1.25
    periods = np.diff(np.asarray(run["late"]["readings"])[:, 4])
    assert 0 in periods.tolist() and 2 in periods.tolist()
    usage, throttled, _ = attribute(late_readings.readings_of(run["late"]),
                                    late_readings.refills_of(run["late"]), 2)  # fmt: skip
    readings = np.asarray(run["late"]["readings"])
    assert sum(usage) == readings[-1, 1] - readings[0, 1]
    assert sum(throttled) == readings[-1, 2] - readings[0, 2]


def test_runs_read_late_recommend_what_their_truth_does() -> None:
    """Six readings of each throttled run taken 60 ms late (bench/results/
    late-readings.json): each run whose truth test_censoring would accept (3 of 4)
    recommends within its bound (0.8-1.25x) and nearer the truth than as read (up to
    1.18x), where each late window holds more usage than one refill grants."""
    runs = [run for run in saved("late-readings.json") if truth_is_the_truth(run)]
    assert runs
    for run in runs:
        late = run["late"]
        as_read, attributed = ratios(run)
        assert 0.8 <= attributed <= 1.25, (as_read, attributed)
        assert abs(attributed - 1) <= abs(as_read - 1)
        as_read_usage = np.diff(np.asarray(late["readings"])[:, 1])
        grant = late_readings.refills_of(late).grant_us
        assert grant is not None
        assert all(as_read_usage[int(k)] > grant for k in late["late_ms"]), as_read_usage


def test_two_threads_throttled_at_one_cpu_read_two_cores_in_the_agents_view_and_no_burst() -> None:
    """A period runs on the runtime its CPUs kept from the one before, so two threads
    throttled at one CPU read up to 104.9 ms of usage beside 98-100 ms of throttled time
    and wait: 200.4-204.9 ms of demand in 1-5 of 108 periods of tune-batch-runs, measured
    on the kernel. The agent divides each window by its own length and never reads more
    than its threads' cores; its histogram takes a window at its bucket's upper bound, so
    the lab's view of it, reading 2.003 cores as 2.5, once asked for a 45 ms burst for
    peaks the two threads cannot pass. Read at no more than the threads' cores, the
    evidence holds 2 cores and the answer keeps no burst; the lab's own samples in order
    are left as they were read."""
    busy = [(104_826, 97_955, 98_097), (100_780, 99_608, 100_003)]
    busy += [(100_000, 99_500, 99_800)] * 14
    busy[5] = (101_452, 99_054, 99_899)
    busy[9] = (101_384, 99_234, 99_884)
    busy[12] = (101_347, 99_411, 100_008)
    rounds = (busy + [(0, 0, 0)] * 11) * 4  # 4 rounds: 0.8 s of two cores' work at one CPU
    usage, throttled, wait = np.asarray(rounds, dtype=np.int64).T
    samples = PeriodSamples(usage, throttled, P // 1000, wait, threads=2)
    in_order = evidence_of(samples, 0.6)
    assert in_order.demand_us.max() > 200_000  # as read
    evidence = as_read(in_order, View.AGENT, threads=samples.threads)
    assert evidence.demand_us.max() == 200_000
    policy = Policy(min_millicores=10, max_millicores=64_000, max_step_up=100.0,
                    max_step_down=0.01)  # fmt: skip
    rec = recommend(evidence, Current(1000, period_us=P // 1000), policy)
    assert rec.burst_us == 0 and (rec.limit_millicores or 0) >= 2000, rec.reasons  # 2 threads
