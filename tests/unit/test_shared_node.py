"""A shared node's demand as a range (docs/recommend.md, "Busy nodes"; issue 41), pure: the
engine sizes to what the threads wanted (usage + wait) and expects throttling over the
range down to what the quota hid (usage + throttled time), and every output shows it.

The kernel's side is tests/kernel/test_lab_shared_node.py."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from unthrottle.operator.status import container_status
from unthrottle.recommend import (
    CounterEvidence,
    Current,
    PeriodEvidence,
    Policy,
    Recommendation,
    Runtime,
    Strategy,
    Waits,
    recommend,
)
from unthrottle.report import Report, render
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult
from unthrottle_lab.agentview import View, as_read

PERIODS = 300


def pool_beside_a_neighbour(seed: int = 1) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A pool throttled at 600m (usage at the quota) whose threads also waited behind a
    neighbour: (usage + throttled time, usage + the whole wait) per period, µs."""
    rng = np.random.default_rng(seed)
    usage = np.full(PERIODS, 60_000, dtype=np.int64)
    throttled = rng.integers(20_000, 40_000, PERIODS)
    behind = rng.integers(30_000, 60_000, PERIODS)
    return usage + throttled, usage + throttled + behind


def evidence(*, per_period: bool = True, seed: int = 1, pressure: bool = False) -> PeriodEvidence:
    quota_side, whole = pool_beside_a_neighbour(seed)
    waits = Waits(float((quota_side - 60_000).sum()) / 1e6, float((whole - quota_side).sum()) / 1e6,
                  from_pressure=pressure)  # fmt: skip
    return PeriodEvidence(whole, observed_throttle_ratio=0.94, waits=waits,
                          quota_demand_us=quota_side if per_period else None)  # fmt: skip


UNCAPPED = Policy(max_step_up=100, min_millicores=10)


class TestTheDemandIsARange:
    def test_the_limit_is_sized_to_what_the_threads_wanted(self) -> None:
        rec = recommend(evidence(), Current(600), UNCAPPED)
        whole = recommend(PeriodEvidence(evidence().demand_us, observed_throttle_ratio=0.94),
                          Current(600), UNCAPPED)  # fmt: skip
        assert rec.limit_millicores == whole.limit_millicores
        assert rec.expected_throttle_ratio is not None
        assert rec.expected_throttle_ratio <= UNCAPPED.target_ratio

    def test_the_bottom_is_what_the_quota_hid_or_what_certainly_ran_whichever_is_less(
        self,
    ) -> None:
        rec = recommend(evidence(), Current(600), UNCAPPED)
        quota_side = recommend(
            PeriodEvidence(pool_beside_a_neighbour()[0], observed_throttle_ratio=0.94),
            Current(600), UNCAPPED,
        )  # fmt: skip
        censored = recommend(PeriodEvidence(evidence().demand_us, observed_throttle_ratio=0.94),
                             Current(600), UNCAPPED)  # fmt: skip
        assert rec.limit_millicores is not None and quota_side.limit_millicores is not None
        assert censored.lower_limit_millicores is not None
        assert rec.lower_limit_millicores == min(
            censored.lower_limit_millicores, quota_side.limit_millicores
        )
        assert rec.lower_limit_millicores < rec.limit_millicores
        # what it asks for beside the same neighbours is in the reason
        assert any(f"about {quota_side.limit_millicores}m asked" in r for r in rec.reasons)
        assert rec.expected_throttle_ratio_range is not None
        low, high = rec.expected_throttle_ratio_range
        assert low <= high == rec.expected_throttle_ratio
        assert low == 0.0  # the quota's end of the demand fits well under the larger limit

    def test_unthrottled_on_a_shared_node_the_bottom_is_what_the_quota_hid(self) -> None:
        quota_side, whole = pool_beside_a_neighbour()
        usage = quota_side - 20_000  # ran under a larger limit: no throttled time
        ev = PeriodEvidence(whole, observed_throttle_ratio=0.0,
                            waits=Waits(0.0, float((whole - usage).sum()) / 1e6),
                            quota_demand_us=usage)  # fmt: skip
        free = Policy(max_step_up=100, max_step_down=0.01, min_millicores=10)
        rec = recommend(ev, Current(2000), free)
        alone = recommend(PeriodEvidence(usage, observed_throttle_ratio=0.0), Current(2000), free)
        assert rec.limit_millicores is not None and alone.limit_millicores is not None
        assert rec.lower_limit_millicores == alone.limit_millicores < rec.limit_millicores

    def test_the_reason_says_how_much_of_the_wait_was_behind_others_and_how_it_was_split(
        self,
    ) -> None:
        rec = recommend(evidence(), Current(600), UNCAPPED)
        waits = evidence().waits
        assert waits is not None
        total = waits.contention_s + waits.throttled_s
        said = [r for r in rec.reasons if r.startswith("on a shared node the demand is a range")]
        assert len(said) == 1, rec.reasons
        assert f"{waits.contention_s:.1f} s of the {total:.1f} s its threads waited" in said[0]
        assert f"({waits.contention_s / total:.0%}) was behind other processes" in said[0]
        assert "split period by period" in said[0]
        assert "m asked) and" in said[0]

    @pytest.mark.parametrize(("pressure", "how"), [
        (False, "split in proportion: the agent's histogram keeps only their sum per window"),
        (True, "from the kubelet's PSI: wall time, a lower bound for several threads"),
    ], ids=["agent-histogram", "psi"])  # fmt: skip
    def test_without_the_periods_the_wait_is_taken_out_in_proportion(
        self, pressure: bool, how: str
    ) -> None:
        rec = recommend(evidence(per_period=False, pressure=pressure), Current(600), UNCAPPED)
        per_period = recommend(evidence(), Current(600), UNCAPPED)
        assert rec.limit_millicores == per_period.limit_millicores
        assert rec.lower_limit_millicores is not None and rec.limit_millicores is not None
        assert rec.lower_limit_millicores < rec.limit_millicores
        assert any(how in r for r in rec.reasons), rec.reasons

    @pytest.mark.parametrize("seed", range(8))
    def test_the_range_is_ordered_for_any_split(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        usage = rng.integers(5_000, 60_000, PERIODS)
        stalled = rng.integers(0, 40_000, PERIODS)
        behind = rng.integers(0, 80_000, PERIODS)
        waits = Waits(stalled.sum() / 1e6, behind.sum() / 1e6)
        ev = PeriodEvidence(usage + stalled + behind, observed_throttle_ratio=0.5, waits=waits,
                            quota_demand_us=usage + stalled)  # fmt: skip
        for strategy in Strategy:
            rec = recommend(ev, Current(600), Policy(strategy=strategy, max_step_up=4))
            assert rec.expected_throttle_ratio_range is not None
            low, high = rec.expected_throttle_ratio_range
            assert 0 <= low <= high <= 1
            assert rec.limit_millicores is not None
            assert rec.lower_limit_millicores is None or (
                rec.lower_limit_millicores < rec.limit_millicores
            )


class TestAStepHeldItBack:
    """The demo's pool: 600m → 1200m (maxStepUp 2), the whole demand throttled at 1200m in
    nearly every window; beside the same neighbour, at most what the quota hid."""

    def test_the_target_is_met_beside_the_neighbours_and_the_reason_says_so(self) -> None:
        rec = recommend(evidence(), Current(600), Policy())
        assert rec.limit_millicores == 1200
        assert rec.expected_throttle_ratio_range is not None
        low, high = rec.expected_throttle_ratio_range
        assert low <= 0.05 and high > 0.9 and high == rec.expected_throttle_ratio
        assert rec.reasons[-1].startswith(
            "the target 0.05 is met beside the same neighbours (expected 0.000) and not if the "
            f"node goes quiet (expected {high:.3f})"
        ), rec.reasons
        assert not any("is not met under this recommendation" in r for r in rec.reasons)


class TestAQuietNode:
    def test_the_range_is_one_point_and_no_shared_node_reason(self) -> None:
        quota_side, _ = pool_beside_a_neighbour()
        waits = Waits(float((quota_side - 60_000).sum()) / 1e6, 0.0)
        ev = PeriodEvidence(quota_side, observed_throttle_ratio=0.94, waits=waits)
        rec = recommend(ev, Current(600), UNCAPPED)
        assert rec.expected_throttle_ratio_range == (rec.expected_throttle_ratio,) * 2
        assert not any("shared node" in r for r in rec.reasons)
        assert rec.to_json()["expected_throttle_ratio_range"] == [rec.expected_throttle_ratio] * 2


class TestOversubscribedAndKept:
    def test_todays_settings_kept_expect_todays_ratio_and_the_quiet_nodes_above_it(self) -> None:
        # under the target at 1000m; its threads waited mostly behind others
        demand = np.asarray([100_000, 120_000, 130_000] * 50, dtype=np.int64)
        quota_side = np.asarray([60_000, 70_000, 80_000] * 50, dtype=np.int64)
        waits = Waits(0.0, float((demand - quota_side).sum()) / 1e6)
        ev = PeriodEvidence(demand, observed_throttle_ratio=0.01, waits=waits,
                            quota_demand_us=quota_side)  # fmt: skip
        rec = recommend(ev, Current(1000), Policy(strategy=Strategy.LIMIT_ONLY))
        assert rec.limit_millicores == 1000
        assert rec.expected_throttle_ratio == 0.01
        assert rec.expected_throttle_ratio_range is not None
        assert rec.expected_throttle_ratio_range[0] == 0.01
        assert rec.expected_throttle_ratio_range[1] > 0.5  # if the node goes quiet
        assert rec.lower_limit_millicores is None


class TestCounters:
    def test_counters_with_the_agents_wait_give_a_limit_range_and_no_ratio_range(self) -> None:
        counters = CounterEvidence(window_s=3600, usage_cores=0.6, nr_periods=36_000,
                                   nr_throttled=30_000, throttled_s=900.0,
                                   waits=Waits(900.0, 1800.0))  # fmt: skip
        rec = recommend(counters, Current(600), UNCAPPED)
        assert rec.limit_millicores is not None and rec.lower_limit_millicores is not None
        assert rec.lower_limit_millicores < rec.limit_millicores
        assert rec.expected_throttle_ratio_range is None
        assert rec.to_json()["expected_throttle_ratio_range"] is None
        said = [r for r in rec.reasons if r.startswith(
            "on a shared node the demand is a range: beside the same neighbours it asks for "
            "about ")]  # fmt: skip
        assert len(said) == 1, rec.reasons
        asked = int(said[0].split("about ")[1].split("m ")[0])
        assert rec.lower_limit_millicores <= asked < rec.limit_millicores


# -- what a reviewer reads -----------------------------------------------------------------


def _scan(rec: Recommendation) -> ScanResult:
    container = ContainerResult("app", 600, 100, 0, None, Runtime.UNKNOWN, "period", 1, 0.94,
                                {"p50_millicores": 1400, "p99_millicores": 1600,
                                 "max_millicores": 1700}, rec)  # fmt: skip
    return ScanResult(1_800_000_000.0, 600, 0.05, (WorkloadResult("shop", "pool", (container,)),))


@pytest.fixture
def held() -> Recommendation:
    rec = recommend(evidence(), Current(600, request_millicores=100), Policy())
    assert rec.expected_throttle_ratio_range is not None
    assert rec.expected_throttle_ratio_range[0] < rec.expected_throttle_ratio_range[1]
    return rec


def _shown(rec: Recommendation) -> str:
    assert rec.expected_throttle_ratio_range is not None
    low, high = rec.expected_throttle_ratio_range
    return f"{high * 100:.1f} % ({low * 100:.1f}–{high * 100:.1f} %)"


class TestEveryOutputShowsTheRange:
    def test_json_carries_it_beside_the_expected_ratio(self, held: Recommendation) -> None:
        report = Report.from_scan(_scan(held))
        doc = json.loads(str(render(report, "json")))
        (rec,) = [c["recommendation"] for w in doc["workloads"] for c in w["containers"]]
        assert rec["expected_throttle_ratio_range"] == list(
            held.expected_throttle_ratio_range or ()
        )
        assert rec["expected_throttle_ratio"] == held.expected_throttle_ratio

    @pytest.mark.parametrize("fmt", ["markdown", "html", "table"])
    def test_markdown_html_and_the_table_show_both_ends(
        self, held: Recommendation, fmt: str
    ) -> None:
        text = str(render(Report.from_scan(_scan(held)), fmt))
        if fmt == "table":
            low, high = held.expected_throttle_ratio_range or (0.0, 0.0)
            assert f"{low:.3f}–{high:.3f}" in text, text
        else:
            assert _shown(held) in text

    def test_csv_has_a_column_for_it(self, held: Recommendation) -> None:
        text = str(render(Report.from_scan(_scan(held)), "csv"))
        header, row = text.splitlines()[:2]
        assert "expected_throttle_ratio_range" in header.split(",")
        low, high = held.expected_throttle_ratio_range or (0.0, 0.0)
        assert f"{low:.3f}–{high:.3f}" in row

    def test_the_policy_status_carries_it(self, held: Recommendation) -> None:
        (container,) = _scan(held).workloads[0].containers
        status = container_status(container)
        assert status["expectedThrottleRatioRange"] == list(
            held.expected_throttle_ratio_range or ()
        )
        assert status["reason"] == held.reasons[-1]


class TestTheReportShowsBothSteps:
    """Apply's change (600m → 1200m), then the recommendation from the evidence since, the
    container unthrottled beside its neighbour: the limit steps down by maxStepDown."""

    APPLIED: ClassVar[dict[str, object]] = {
        "at": 1_799_990_000.0, "policy": "demo", "method": "InPlace", "verdict": "kept",
        "containers": [{"name": "app",
                        "before": {"limit_millicores": 600, "burst_us": 0, "gomaxprocs": None},
                        "after": {"limit_millicores": 1200, "burst_us": 0, "gomaxprocs": None}}],
    }  # fmt: skip

    def refined(self) -> Recommendation:
        rng = np.random.default_rng(3)
        usage = rng.integers(30_000, 50_000, PERIODS)
        behind = rng.integers(10_000, 30_000, PERIODS)
        ev = PeriodEvidence(usage + behind, observed_throttle_ratio=0.0,
                            waits=Waits(0.0, float(behind.sum()) / 1e6),
                            quota_demand_us=usage)  # fmt: skip
        return recommend(ev, Current(1200, request_millicores=100), Policy())

    def test_the_refinement_steps_down_by_max_step_down(self) -> None:
        rec = self.refined()
        assert rec.limit_millicores == 960  # 1200m × 0.8
        assert any("step limited to ×0.8" in r for r in rec.reasons), rec.reasons

    @pytest.mark.parametrize("fmt", ["markdown", "html"])
    def test_the_report_shows_the_applied_change_and_the_next_step(self, fmt: str) -> None:
        rec = self.refined()
        scan = _scan(rec)
        container = replace(scan.workloads[0].containers[0], limit_millicores=1200)
        workload = replace(scan.workloads[0], containers=(container,), applied=self.APPLIED)
        text = str(render(Report.from_scan(replace(scan, workloads=(workload,))), fmt))
        assert "limit 600m → 1200m" in text
        assert "next step 1200m → 960m, from the evidence since" in text


class TestAsTheOperatorReadsIt:
    """The agent's histogram and backlog series (``lab tune --evidence agent``'s view): the
    wait is taken out in proportion, and the backlog's order, of the whole, holds for the
    quota's end read at the limit ÷ the share kept. Read on the rebuilt windows themselves,
    the whole's bound made the quota's end throttled in every period with a burst (the
    demo's pool: 100.0 % beside the same neighbours at 1200m + 120 ms, 0.0 % measured)."""

    @pytest.mark.parametrize("view", [View.AGENT, View.HISTOGRAM], ids=["backlog", "histogram"])
    def test_a_step_held_answer_meets_the_target_beside_the_neighbours(self, view: View) -> None:
        rng = np.random.default_rng(5)
        quota_side = np.where(rng.random(PERIODS) < 0.03, 200_000, 80_000).astype(np.int64)
        whole = np.minimum(quota_side + rng.integers(60_000, 100_000, PERIODS), 200_000)
        waits = Waits(float((quota_side - 60_000).clip(0).sum()) / 1e6,
                      float((whole - quota_side).sum()) / 1e6)  # fmt: skip
        ev = as_read(PeriodEvidence(whole, observed_throttle_ratio=0.5, waits=waits,
                                    quota_demand_us=quota_side), view, threads=2)  # fmt: skip
        rec = recommend(ev, Current(600), Policy())
        assert rec.limit_millicores == 1200
        assert rec.expected_throttle_ratio_range is not None
        low, high = rec.expected_throttle_ratio_range
        assert low <= 0.05 and high > 0.9, (rec.burst_us, low, high)
        assert any("split in proportion" in r for r in rec.reasons)

    def test_with_a_burst_the_quota_end_is_not_held_to_the_wholes_order(self) -> None:
        # short peaks: a burst confirmed by the backlog at 1470m, the step holds it to 1200m
        rng = np.random.default_rng(5)
        quota_side = np.where(rng.random(PERIODS) < 0.05, 140_000, 30_000).astype(np.int64)
        whole = np.minimum(quota_side + rng.integers(30_000, 60_000, PERIODS)
                           + np.where(rng.random(PERIODS) < 0.05, 60_000, 0), 200_000)  # fmt: skip
        waits = Waits(float((quota_side - 60_000).clip(0).sum()) / 1e6,
                      float((whole - quota_side).sum()) / 1e6)  # fmt: skip
        ev = as_read(PeriodEvidence(whole, observed_throttle_ratio=0.5, waits=waits,
                                    quota_demand_us=quota_side), View.AGENT, threads=2)  # fmt: skip
        rec = recommend(ev, Current(600), Policy())
        assert rec.limit_millicores == 1200 and rec.burst_us > 0
        assert rec.uncapped_limit_millicores is not None and rec.uncapped_limit_millicores > 1200
        assert rec.expected_throttle_ratio_range is not None
        low, high = rec.expected_throttle_ratio_range
        assert low <= 0.05 < high  # the whole's backlog read on the quota's end gave 0.13

    def test_throttled_today_the_low_end_is_what_certainly_ran(self) -> None:
        # usage + throttled time is an upper bound too when throttled past the target: the
        # demo's pool read 57.5 % at 1200m beside its neighbour from it, the kernel 0 %
        rng = np.random.default_rng(5)
        quota_side = np.where(rng.random(PERIODS) < 0.1, 200_000, 120_000).astype(np.int64)
        whole = np.minimum(quota_side + rng.integers(60_000, 100_000, PERIODS), 200_000)
        waits = Waits(float((quota_side - 60_000).clip(0).sum()) / 1e6,
                      float((whole - quota_side).sum()) / 1e6)  # fmt: skip

        def read(ratio: float) -> Recommendation:
            ev = PeriodEvidence(whole, observed_throttle_ratio=ratio, waits=waits,
                                quota_demand_us=quota_side)  # fmt: skip
            return recommend(as_read(ev, View.AGENT, threads=2), Current(600), Policy())

        throttled, calm = read(0.5), read(0.01)
        assert throttled.limit_millicores == calm.limit_millicores == 1200
        assert throttled.expected_throttle_ratio_range == (0.0, 1.0)
        assert any("beside the same neighbours (what certainly ran;" in r
                   for r in throttled.reasons)  # fmt: skip
        # not throttled past the target: usage + throttled time is the demand itself
        assert calm.expected_throttle_ratio_range is not None
        assert calm.expected_throttle_ratio_range[0] > 0.5
        assert not any("what certainly ran" in r for r in calm.reasons)
