"""What test_victoria.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

from bisect import bisect_left

import pytest

from unthrottle.agent.sampling import BUCKETS_CORES
from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.recommend import Current, Policy, Recommendation, Strategy, recommend

HOUR = 3600
COUNTERS = ("usage_s", "periods", "throttled_periods", "throttled_s")
API = WorkloadKey("shop", "api", "api")


# What a user would notice between a recommendation from VictoriaMetrics' evidence and one
# from Prometheus's: the increases differ by Prometheus's extrapolation at the edges of a
# range (under 0.1 % on a steady hour, more where pods come and go), which may move a
# limit across one rounding step and a burst by a millisecond or two, never across a bucket
# of the agent's histogram (the resolution of the evidence) and never to another state.
LIMIT_SLACK_M = 10
"""One rounding step of a limit (``recommend``'s ``ROUND_TO_MILLICORES``)."""
BURST_SLACK_US = 2000
"""Two rounding steps of a burst: measured 2 ms apart as a rollout leaves the window."""
RATIO_SLACK = 0.002
"""Throttled periods over periods, absolute: measured 0.0013 apart at most."""


def bucket(millicores: int | None) -> int | None:
    """The agent histogram's bucket a limit falls in: what its evidence can tell apart."""
    return None if millicores is None else bisect_left(BUCKETS_CORES, millicores / 1000)


LEAVING_SLACK_M = 2 * LIMIT_SLACK_M
"""Two rounding steps, at the one read in which the last pods of a rollout leave the
window: Prometheus extrapolates their last samples and counts 0.8 % more periods (71,400
against 70,800) and 9 % more throttled ones than VictoriaMetrics, all in the bursty tail;
where the backlog series says a burst would drain, the limit is the 95th percentile of the
windows without one, which sits in that tail: measured 426m against 444m before headroom,
470m against 490m after (``test_victoria_sliding``)."""


def assert_close(ours: tuple[int | None, int], theirs: tuple[int | None, int], *,
                 limit_slack_m: int = LIMIT_SLACK_M) -> None:  # fmt: skip
    """(limit, burst) from VictoriaMetrics and from Prometheus, as a user would compare them."""
    assert bucket(ours[0]) == bucket(theirs[0]), (ours, theirs)
    assert abs((ours[0] or 0) - (theirs[0] or 0)) <= limit_slack_m, (ours, theirs)
    assert abs(ours[1] - theirs[1]) <= BURST_SLACK_US, (ours, theirs)


def source(url: str) -> PrometheusSource:
    return PrometheusSource(PrometheusConfig(url, retries=0))


def counter(name: str, now: int, values: list[float], every: int = 15) -> str:
    """A series whose last sample is at ``now``, one every ``every`` seconds."""
    first = now - every * (len(values) - 1)
    return "".join(f'{name}{{a="1"}} {v:g} {first + k * every}\n' for k, v in enumerate(values))


def _same(a: ContainerEvidence, b: ContainerEvidence, rel: float) -> None:
    assert (a.pods, a.kind, a.limit_millicores, a.request_millicores) == (
        b.pods, b.kind, b.limit_millicores, b.request_millicores)  # fmt: skip
    for name in COUNTERS:
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=rel), name
    assert set(a.buckets) == set(b.buckets)
    for le, count in a.buckets.items():
        assert count == pytest.approx(b.buckets[le], rel=rel), le


def _recommended(item: ContainerEvidence) -> tuple[Recommendation, Recommendation]:
    evidence, today = item.period_evidence(), Current(500, 250)
    alone = recommend(evidence, today, Policy(strategy=Strategy.LIMIT_ONLY, max_step_up=4))
    return alone, recommend(evidence, today, Policy(max_step_up=4))
