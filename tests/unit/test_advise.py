"""Recommendations for many containers: worker processes give what one process gives."""

from __future__ import annotations

from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.recommend import Current, Policy
from unthrottle.scan.advise import PARALLEL_FROM, Job, advise_all


def jobs(n: int) -> list[Job]:
    out: list[Job] = []
    for i in range(n):
        item = ContainerEvidence(WorkloadKey("shop", f"app-{i}", "main"))
        if i % 3 == 0:  # the agent's histogram: 80 % of windows quiet, the rest up to `high`
            high = 0.4 + i / 100
            item.buckets = {0.25: 800.0, high: 1000.0, float("inf"): 1000.0}
            item.periods, item.throttled_periods = 1000 + i, 100.0
        elif i % 3 == 1:  # cAdvisor only
            item.periods, item.throttled_periods, item.usage_s = 3600.0, i * 10.0, 90.0 + i
            item.throttled_s = i * 0.5
        out.append((item, Current(500, 250), Policy(max_step_up=4), 3600))
    return out


def test_workers_give_the_same_recommendations_in_the_same_order() -> None:
    work = jobs(PARALLEL_FROM + 16)
    alone = advise_all(work, workers=1)
    assert advise_all(work, workers=2) == alone
    # and they are real ones: a third had no evidence, the rest were sized
    assert sum(r is None for r in alone) == len(work) // 3
    limits = [r.limit_millicores for r in alone[::3] if r is not None]
    assert limits == sorted(limits) and limits[-1] > limits[0]  # more demand, larger limit
