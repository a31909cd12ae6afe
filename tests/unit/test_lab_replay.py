"""The model against saved kernel measurements, without the kernel: deterministic.

``bench/results/lab-vs-model.json`` holds every seed scenario measured twice by
``bench/lab_vs_model.py`` (each run with the period phase, tick phase, HZ and wake-up
the lab measured). The model is run at those phases and held to the rules of
``unthrottle_lab.agreement``; docs/benchmarks.md §3 quotes the table printed here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from support.paths import ROOT, SCENARIOS
from unthrottle_lab.agreement import (
    RATIO_TOLERANCE,
    Comparison,
    compare,
    latency_close,
    machine_for,
    ratio_bands,
)
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.output import lost_notes
from unthrottle_lab.scenario import RunSpec, load_scenario
from unthrottle_lab.workload import Workload

sys.path.insert(0, str(ROOT / "bench"))
import lab_vs_model

RESULTS = ROOT / "bench" / "results" / "lab-vs-model.json"


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(RESULTS.read_text())
    return loaded


def test_every_seed_scenario_was_measured_twice_with_its_phases(results: dict[str, Any]) -> None:
    names = {load_scenario(p).name for p in SCENARIOS}
    assert len(results["measurements"]) >= 2
    limited = phased = 0
    for measurement in results["measurements"]:
        assert {e["name"] for e in measurement["scenarios"]} == names
        for entry in measurement["scenarios"]:
            for run in entry["runs"]:
                assert run["hz"] and run["wakeup_ms"] is not None
                if "cpus" in run["limit"]:
                    limited += 1
                    phased += run["period_phase_ms"] is not None
    # A calibration can fail (a preemption each time, not a throttle): that run is
    # simulated at phase 0. Nearly all have theirs.
    assert phased >= 0.8 * limited, (phased, limited)


def test_the_model_agrees_with_every_saved_run(results: dict[str, Any]) -> None:
    found = lab_vs_model.agreements(results)
    assert len(found) == sum(len(load_scenario(p).runs) for p in SCENARIOS)
    assert [a.describe() for a in found if not a.agrees] == []


def test_a_model_without_the_quota_disagrees_with_the_throttled_runs(
    results: dict[str, Any],
) -> None:
    """The rules can fail: the same runs simulated without their limit miss, each one
    the kernel throttled in over a third of its periods."""
    cores = int(results["cores"])
    throttled = 0
    for path in SCENARIOS:
        scenario = load_scenario(path)
        workload = scenario.workload.to_workload()
        for measurement in results["measurements"]:
            entry = next(e for e in measurement["scenarios"] if e["name"] == scenario.name)
            for spec, run in zip(scenario.runs, entry["runs"], strict=True):
                if run["throttle_ratio"] > 1 / 3:
                    throttled += 1
                    fig = RunFigures.from_json(run)
                    unlimited = RunSpec(period_ms=spec.period_ms)
                    assert compare(workload, unlimited, fig, cores).misses, spec.label()
    assert throttled >= 10


def test_a_knife_edge_run_says_so_in_its_scenario_file() -> None:
    """A ratio is widened once, by the model's band over wake-ups: no seed run widens it
    again in its scenario file. The one widened latency is the scenario file's, for the
    run it names."""
    widened = {(load_scenario(p).name, r.label()): r.ratio_tolerance
               for p in SCENARIOS for r in load_scenario(p).runs if r.ratio_tolerance}  # fmt: skip
    assert widened == {}
    runs = [(load_scenario(p).name, r) for p in SCENARIOS for r in load_scenario(p).runs]
    latency = {(name, r.label()): r.latency_tolerance for name, r in runs if r.latency_tolerance}
    assert latency == {("seed-004-open-pool", "0.6 CPU"): 0.25}
    source = Path(ROOT / "lab" / "src" / "unthrottle_lab" / "agreement.py").read_text()
    assert "seed-" not in source  # the product knows no scenario by name


def test_a_ratio_decided_by_tenths_of_a_millisecond_is_held_to_the_models_band(
    results: dict[str, Any],
) -> None:
    """The burst seed at 0.25 CPU, as a CI run measured it: 12 and 13 of 55 periods
    throttled, where the model at that machine's median wake-up said 6. The model itself
    gives 3 to 12 of 55 as the wake-up moves from 0 to 0.5 ms, and 15 with each task
    costing what the kernel charged for it (0.6 % above the task's CPU time), so those
    agree with the default tolerance; what an average says (no throttling) and what no
    band reaches (a third of the periods) still miss."""
    scenario = load_scenario(ROOT / "scenarios" / "seed-002-burst.yaml")
    index, spec = next((i, r) for i, r in enumerate(scenario.runs) if not r.burst_ms)
    assert spec.ratio_tolerance is None  # nothing widened in the file
    entry = next(e for e in results["measurements"][0]["scenarios"] if e["name"] == scenario.name)
    saved = RunFigures.from_json(entry["runs"][index])
    workload, cores = scenario.workload.to_workload(), int(results["cores"])
    periods = saved.stat.nr_periods

    def throttled(n: int, wakeup_ms: float = 0.3) -> Comparison:
        stat = dataclasses.replace(saved.stat, nr_throttled=n)
        extra = {**saved.extra, "wakeup_ms": wakeup_ms}
        return compare(workload, spec, dataclasses.replace(saved, stat=stat, extra=extra), cores)

    at_ci = throttled(12)
    assert round(at_ci.predicted.stat.throttle_ratio * periods) == 6  # the point: a miss
    assert [round(r * periods) for r in at_ci.band] == [3, 15]
    at_task_cost = ratio_bands(workload, spec, machine_for(saved, cores))[0]
    assert [round(r * periods) for r in at_task_cost] == [3, 12]
    assert at_ci.misses == [] and throttled(13).misses == []
    assert throttled(0).misses == ["throttle ratio 0.000 vs 0.055–0.273 (±0.05)"]
    assert throttled(periods // 3).misses


def test_only_a_run_on_a_knifes_edge_has_a_band(results: dict[str, Any]) -> None:
    """Every other seed run's ratio is the same over wake-ups from 0 to 0.5 ms, or within
    the default tolerance (the open pool at 0.6 CPU), before the cost the kernel charged
    widens the two whose band is not a point: the band widens nothing else. The batch at
    2 CPU, charged 0.2 % above its tasks like the others, stays a point."""
    found = lab_vs_model.agreements(results)
    bands = {(a.scenario, a.spec.label()): round(c.band[1] - c.band[0], 3)
             for a in found for c in a.comparisons if c.band[1] > c.band[0]}  # fmt: skip
    assert set(bands) == {("seed-002-burst", "0.25 CPU"), ("seed-004-open-pool", "0.6 CPU")}
    assert bands[("seed-002-burst", "0.25 CPU")] > 0.15
    scenario = load_scenario(ROOT / "scenarios" / "seed-004-open-pool.yaml")
    index, spec = next((i, r) for i, r in enumerate(scenario.runs) if r.cpus == 0.6)
    for measurement in results["measurements"]:
        entry = next(e for e in measurement["scenarios"] if e["name"] == scenario.name)
        saved = RunFigures.from_json(entry["runs"][index])
        low, high = ratio_bands(scenario.workload.to_workload(), spec,
                                machine_for(saved, int(results["cores"])))[0]  # fmt: skip
        assert 0 < high - low <= RATIO_TOLERANCE


def test_the_cost_the_kernel_charged_holds_a_slower_hosts_open_pool() -> None:
    """The open pool at 0.6 CPU on a slower host (``open-pool-cost.json``): 8.22–8.28 ms of
    usage a task, 27 of 48 periods throttled in each of 6 runs, as on CI. The model at the
    task's 8 ms (22–24 of 48, ±0.05) misses every one; at the cost charged it throttles 27,
    and every run agrees. Where the host charged no more than the tasks, nothing widens."""
    saved = json.loads((ROOT / "bench" / "results" / "open-pool-cost.json").read_text())
    workload, index, spec = open_pool()
    cores = int(saved["cores"])
    for measurement in saved["measurements"]:
        run = RunFigures.from_json(measurement["runs"][index])
        assert (run.stat.nr_throttled, run.stat.nr_periods) == (27, 48)
        low, high = ratio_bands(workload, spec, machine_for(run, cores))[0]
        assert run.stat.throttle_ratio > high + RATIO_TOLERANCE
        comparison = compare(workload, spec, run, cores)
        assert round(comparison.band[1] * 48) == 27
        assert not any("throttle ratio" in miss for miss in comparison.misses)
        cheap = dataclasses.replace(run.stat, usage_us=2_400_000)
        assert compare(workload, spec, dataclasses.replace(run, stat=cheap), cores).band == (
            low,
            high,
        )


def open_pool() -> tuple[Workload, int, RunSpec]:
    """The open pool's workload, and its run at 0.6 CPU with that run's index."""
    scenario = load_scenario(ROOT / "scenarios" / "seed-004-open-pool.yaml")
    index, spec = next((i, r) for i, r in enumerate(scenario.runs) if r.cpus == 0.6)
    return scenario.workload.to_workload(), index, spec


def test_the_open_pools_ratio_is_held_to_its_band_and_the_default_tolerance_alone(
    results: dict[str, Any],
) -> None:
    """The open pool at 0.6 CPU: its band (0.458–0.562, with the cost the kernel charged
    its tasks) and the default ±0.05 hold every ratio measured (0.43–0.52 over 14 runs
    beside a hog, ``placement.json``; 0.458 and 0.510 saved), which need up to 0.03
    beyond the band; a ratio 0.08 beyond it misses."""
    workload, index, spec = open_pool()
    entry = next(e for e in results["measurements"][0]["scenarios"]
                 if e["name"] == "seed-004-open-pool")  # fmt: skip
    saved = RunFigures.from_json(entry["runs"][index])
    cores = int(results["cores"])
    low, high = compare(workload, spec, saved, cores).band
    assert (round(low, 3), round(high, 3)) == (0.458, 0.562)
    placement = json.loads((ROOT / "bench" / "results" / "placement.json").read_text())
    ratios = [r for way in ("pinned", "unpinned") for r in placement["open_pool"][way]["ratio"]]
    ratios += [e["runs"][index]["throttle_ratio"] for m in results["measurements"]
               for e in m["scenarios"] if e["name"] == "seed-004-open-pool"]  # fmt: skip
    beyond = max(max(low - r, r - high) for r in ratios)
    assert 0.02 < beyond <= RATIO_TOLERANCE, (beyond, ratios)

    def at(ratio: float) -> list[str]:
        periods = saved.stat.nr_periods
        stat = dataclasses.replace(saved.stat, nr_throttled=round(ratio * periods))
        return compare(workload, spec, dataclasses.replace(saved, stat=stat), cores).misses

    assert at(min(ratios)) == [] and at(max(ratios)) == []
    assert at(low - 0.08) and at(high + 0.08)


def test_the_open_pools_latency_tolerance_is_what_its_measurements_need() -> None:
    """Its p95 over 14 runs beside a hog (61.5–93.6 ms, ``placement.json``) against the
    model's: the tolerance is the smallest 5 % step that admits each of them on its own
    (without the machine's excess, which those runs did not measure)."""
    _, _, spec = open_pool()
    placement = json.loads((ROOT / "bench" / "results" / "placement.json").read_text())
    pool = placement["open_pool"]
    model = pool["model_p95_ms"]
    p95s = [p for way in ("pinned", "unpinned") for p in pool[way]["p95_ms"]]
    assert len(p95s) == 14
    needed = max(abs(p - model) / p for p in p95s)
    assert 0.20 < needed < 0.25  # 61.5 against 75.4 ms
    assert spec.latency_tolerance == math.ceil(needed / 0.05) * 0.05
    assert all(latency_close(p, model, tolerance=spec.latency_tolerance) for p in p95s)


def test_the_docs_quote_the_table_of_the_saved_runs(results: dict[str, Any]) -> None:
    table = lab_vs_model.table(lab_vs_model.agreements(results))
    assert table in (ROOT / "docs" / "benchmarks.md").read_text()


def test_a_runs_latency_tolerance_widens_its_latency_and_only_that(
    results: dict[str, Any],
) -> None:
    """The open pool at 0.6 CPU, measured 22 % slower at p95 than the model: a miss by the
    default 15 %, within the 25 % its scenario file gives it."""
    scenario = load_scenario(ROOT / "scenarios" / "seed-004-open-pool.yaml")
    index, spec = next((i, r) for i, r in enumerate(scenario.runs) if r.latency_tolerance)
    entry = next(e for e in results["measurements"][0]["scenarios"] if e["name"] == scenario.name)
    measured = RunFigures.from_json(entry["runs"][index])
    workload, cores = scenario.workload.to_workload(), int(results["cores"])
    predicted = compare(workload, spec, measured, cores).predicted.latency
    slower = dataclasses.replace(
        measured, latency=dataclasses.replace(measured.latency, p50=predicted.p50,
                                              p95=1.22 * predicted.p95))  # fmt: skip
    plain = spec.model_copy(update={"latency_tolerance": None})
    assert [m for m in compare(workload, plain, slower, cores).misses if "p95" in m]
    assert [m for m in compare(workload, spec, slower, cores).misses if "p95" in m] == []


def test_what_the_host_took_is_taken_out_of_the_latency_and_said(
    results: dict[str, Any],
) -> None:
    """The burst run with 25 ms burst, as one CI run measured it in a spell of the host's
    steal: p95 38.5 ms against the model's 20.2, unthrottled. Less what each task lost to
    the host (the lab's ``latency_less_lost_ms``) it agrees, and the verdict says so; a
    measurement without that record is held to its latency as it is."""
    scenario = load_scenario(ROOT / "scenarios" / "seed-002-burst.yaml")
    index, spec = next((i, r) for i, r in enumerate(scenario.runs) if r.burst_ms)
    entry = next(e for e in results["measurements"][0]["scenarios"] if e["name"] == scenario.name)
    measured = RunFigures.from_json(entry["runs"][index])
    workload, cores = scenario.workload.to_workload(), int(results["cores"])
    assert compare(workload, spec, measured, cores).misses == []  # as saved: it agrees
    kept = measured.latency
    stolen = dataclasses.replace(
        measured,
        latency=dataclasses.replace(kept, p95=38.5, max=83.6),
        extra={**measured.extra, "lost_ms": 84.8, "latency_less_lost_ms": {
            "p50": kept.p50, "p95": kept.p95, "p99": kept.p99, "max": kept.max}},
    )  # fmt: skip
    held = compare(workload, spec, stolen, cores)
    assert held.misses == []
    assert held.verdict() == "agrees (host took 85 ms: p95 38.5 ms with it)"
    unrecorded = dataclasses.replace(stolen, extra=measured.extra)
    assert [m for m in compare(workload, spec, unrecorded, cores).misses if "p95 38.5" in m]
    # `lab run` says so under its table, for that run only
    other = RunFigures.from_json(entry["runs"][1 - index])
    runs = [stolen, other] if index == 0 else [other, stolen]
    assert lost_notes([(scenario, runs)]) == [
        f"seed-002-burst / {spec.label()}: the host took 85 ms from its tasks (steal); "
        f"p95 {kept.p95:.1f} ms without it"
    ]
