"""Busy nodes: the demand that contention hides, in the model and in the engine (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.metrics.promql import counter_queries, recording_rules
from unthrottle.recommend import (
    CounterEvidence,
    Current,
    PeriodEvidence,
    Policy,
    Strategy,
    Waits,
    recommend,
)
from unthrottle.units import Bandwidth
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.scenario import parse_scenario
from unthrottle_lab.sim.tasks import Machine, simulate_tasks
from unthrottle_lab.workload import Kind, Workload

# One thread, 50 ms tasks back to back: it wants a whole core.
BUSY_THREAD = Workload(kind=Kind.SERIAL, task_cpu_us=50_000, workers=1, tasks=40)
POLICY = Policy(strategy=Strategy.LIMIT_ONLY, max_step_up=100, min_millicores=10)


def run(millicores: int | None, other_threads: int = 0, cores: int = 2) -> RunFigures:
    quota = None if millicores is None else millicores * 100
    return simulate_tasks(BUSY_THREAD, Bandwidth(quota, 100_000),
                          Machine(cores=cores, other_threads=other_threads))  # fmt: skip


class TestTheModelSharesTheCoresWithOtherLoad:
    def test_other_threads_that_leave_a_core_free_change_nothing(self) -> None:
        assert run(600, other_threads=1).stat == run(600).stat

    def test_beside_a_busy_thread_on_each_core_a_thread_gets_half_a_core(self) -> None:
        quiet, busy = run(None), run(None, other_threads=2)
        assert quiet.latency.p50 == pytest.approx(50)
        assert busy.latency.p50 == pytest.approx(100)  # 50 ms of CPU at half a core
        assert busy.stat.usage_us == quiet.stat.usage_us
        assert busy.stat.wait_us == pytest.approx(busy.stat.usage_us, rel=0.01)
        # three: two on one core and one on the other; the thread shares the less busy one
        assert run(None, other_threads=3).latency.p50 == pytest.approx(100)
        assert run(None, other_threads=1).latency.p50 == pytest.approx(50)
        assert busy.stat.throttled_us == 0 and quiet.stat.wait_us == 0

    def test_contention_hides_demand_that_usage_plus_throttled_time_misses(self) -> None:
        quiet, busy = run(600), run(600, other_threads=2)
        # Quiet: throttled 40 ms of every 100; the wait is exactly the throttled time.
        assert quiet.stat.wait_us == quiet.stat.throttled_us > 0
        assert quiet.stat.contention_us == 0
        # Busy: the thread runs slower, so the quota throttles it less...
        assert busy.stat.throttled_us < quiet.stat.throttled_us / 2
        # ...and usage + throttled time says it wanted less than a core. The wait shows it all.
        seen = (busy.stat.usage_us + busy.stat.throttled_us) / (busy.wall_ms * 1000)
        wanted = (busy.stat.usage_us + max(busy.stat.throttled_us, busy.stat.wait_us)) / (
            busy.wall_ms * 1000)  # fmt: skip
        assert seen < 0.85
        assert wanted == pytest.approx(1.0, abs=0.02)

    def test_a_scenario_run_asks_for_other_threads_and_says_so(self) -> None:
        scenario = parse_scenario({
            "name": "busy", "workload": {"kind": "serial", "task_cpu_ms": 50},
            "runs": [{"cpus": 0.6, "other_threads": 2}, {"other_threads": 1}],
        })  # fmt: skip
        assert [r.label() for r in scenario.runs] == [
            "0.6 CPU, 2 other busy threads", "no limit, 1 other busy thread"]  # fmt: skip
        assert scenario.runs[0].bandwidth() == Bandwidth(60_000, 100_000)
        with pytest.raises(ValueError, match="other_threads"):
            parse_scenario({"name": "x", "workload": {"kind": "serial", "task_cpu_ms": 5},
                            "runs": [{"other_threads": -1}]})  # fmt: skip


def period_evidence(demand_ms: list[int], waits: Waits | None, ratio: float) -> PeriodEvidence:
    demand = np.asarray([d * 1000 for d in demand_ms] * 50, dtype=np.int64)
    return PeriodEvidence(demand, observed_throttle_ratio=ratio, waits=waits)


class TestTheEngineCountsTheWait:
    def test_a_throttled_container_is_sized_for_the_demand_its_wait_shows(self) -> None:
        # Throttled in most periods at 600m; its threads also waited behind other processes.
        evidence = period_evidence([100, 100, 95], Waits(throttled_s=0.5, contention_s=1.5), 0.6)
        rec = recommend(evidence, Current(600), POLICY)
        assert rec.limit_millicores is not None and rec.limit_millicores >= 1000
        said = ("the demand counts the time its threads waited (1.5 s waiting for a CPU "
                "behind other processes, 0.5 s on its quota)")  # fmt: skip
        assert any(said in r for r in rec.reasons), rec.reasons

    def test_on_an_oversubscribed_node_the_limit_is_not_raised_for_the_wait(self) -> None:
        # Under the target at 1000m: it waited behind other processes, not on its quota.
        evidence = period_evidence([100, 120, 130], Waits(throttled_s=0.0, contention_s=4.0), 0.0)
        without = recommend(period_evidence([100, 120, 130], None, 0.0), Current(1000), POLICY)
        rec = recommend(evidence, Current(1000), POLICY)
        assert without.limit_millicores is not None and without.limit_millicores > 1000
        assert rec.limit_millicores == 1000
        assert any(r.startswith("the node is oversubscribed (4.0 s waiting for a CPU") and
                   f"({without.limit_millicores}m with it)" in r for r in rec.reasons)  # fmt: skip

    def test_a_limit_held_for_the_wait_expects_what_was_measured_at_it(self) -> None:
        # The wait behind others counted as demand would throttle 1000m in most windows;
        # the quota did not (0 of its periods): kept, the measure is the expectation.
        evidence = period_evidence([100, 120, 130], Waits(throttled_s=0.0, contention_s=4.0), 0.0)
        rec = recommend(evidence, Current(1000), POLICY)
        assert rec.limit_millicores == 1000
        assert rec.expected_throttle_ratio == 0.0
        assert not any("is not met" in r for r in rec.reasons), rec.reasons
        throttled = period_evidence([100, 120, 130], Waits(throttled_s=0.5, contention_s=1.5), 0.6)
        raised = recommend(throttled, Current(600), POLICY)  # over the target: not held
        assert raised.expected_throttle_ratio != raised.current_throttle_ratio

    def test_a_lower_limit_is_still_given_on_an_oversubscribed_node(self) -> None:
        evidence = period_evidence([20, 25, 30], Waits(throttled_s=0.0, contention_s=3.0), 0.0)
        rec = recommend(evidence, Current(1000), POLICY)
        assert rec.limit_millicores is not None and rec.limit_millicores < 1000
        assert any("the node is oversubscribed" in r for r in rec.reasons)

    def test_cadvisor_counters_say_that_contention_can_hide_demand(self) -> None:
        counters = CounterEvidence(window_s=3600, usage_cores=0.5, nr_periods=36_000,
                                   nr_throttled=18_000, throttled_s=900.0)  # fmt: skip
        rec = recommend(counters, Current(600), POLICY)
        assert any(r.startswith("contention can hide demand: cAdvisor's counters")
                   for r in rec.reasons)  # fmt: skip
        with_agent = CounterEvidence(window_s=3600, usage_cores=0.5, nr_periods=36_000,
                                     nr_throttled=18_000, throttled_s=900.0,
                                     waits=Waits(900.0, 10.0))  # fmt: skip
        agent_rec = recommend(with_agent, Current(600), POLICY)
        assert not any("cAdvisor" in r for r in agent_rec.reasons)


class TestPrometheusCarriesTheWait:
    def test_the_agents_wait_counter_is_read_with_the_others_and_recorded(self) -> None:
        queries = counter_queries(["shop"], 3600)
        assert queries["wait_seconds"] == (
            "sum by (namespace, pod, container) (increase(unthrottle_cpu_wait_seconds_total"
            '{namespace=~"shop",container!="",container!="POD"}[3600s]))'
        )
        records = {r["record"]: r["expr"] for g in recording_rules()["groups"]  # type: ignore[index]
                   for r in g["rules"]}  # fmt: skip
        assert "unthrottle_cpu_wait_seconds_total" in records[
            "namespace_pod_container:unthrottle_cpu_wait_seconds:increase5m"]  # fmt: skip

    def test_the_wait_splits_into_the_quotas_part_and_the_rest(self) -> None:
        item = ContainerEvidence(WorkloadKey("shop", "web", "app"), throttled_s=30.0, wait_s=80.0)
        assert item.waits() == Waits(throttled_s=30.0, contention_s=50.0)
        assert ContainerEvidence(WorkloadKey("shop", "web", "app")).waits() is None


def test_the_docs_quote_what_the_kernel_measured_and_the_design_rests_on_it() -> None:
    import json
    import sys

    from support.paths import ROOT

    sys.path.insert(0, str(ROOT / "bench"))
    import tune_busy
    import wait_facts

    facts = json.loads((ROOT / "bench/results/wait-facts.json").read_text())["cases"]
    busy = json.loads((ROOT / "bench/results/tune-busy.json").read_text())["rows"]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert wait_facts.table(facts) in docs and tune_busy.table(busy) in docs
    by = {(c["limit"], c["beside"]): c for c in facts}
    alone = by["0.5 CPU", "alone on its CPU"]
    beside = by["0.5 CPU", "a busy process on its CPU"]
    # the run delay holds the throttled time, and the time behind another process
    assert alone["run_delay_s"] == pytest.approx(alone["throttled_s"], abs=0.05)
    assert beside["throttled_s"] < 0.1 and beside["run_delay_s"] > 0.8
    # and a limit sized without it throttles once the node is quiet; with it, it does not
    blind, fixed = busy[1]["usage + throttled"], busy[1]["with the wait"]
    assert blind["quiet_throttle_ratio"] > 0.5 and fixed["quiet_throttle_ratio"] <= 0.05
