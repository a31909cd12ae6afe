"""The model's agreement over several measurements of a run (docs/model.md, "Agreement"):
judged against the measurements the host left alone taken together, at least half of them,
so that measuring again adds a measurement to judge by, not one more chance to agree.

On the saved pinned measurements of the two-container pod (docs/benchmarks.md §3), without
the kernel: deterministic.
"""

from __future__ import annotations

import dataclasses
import sys
from functools import cache

from support.docs import results
from support.paths import ROOT
from unthrottle_lab.agreement import LEFT_ALONE_LOST_MS, Comparison, RunAgreement

sys.path.insert(0, str(ROOT / "bench"))
import lab_vs_model

PINNED = ["lab-vs-model-sidecar-pinned-first.json", "lab-vs-model-sidecar.json",
          "lab-vs-model-sidecar-pinned-more.json"]  # fmt: skip


@cache
def throttled() -> RunAgreement:
    """The throttled two-container run over eight pinned measurements: it agreed in 1."""
    pool = lab_vs_model.pooled([results(name) for name in PINNED])
    return lab_vs_model.agreements(pool)[0]


def of(*comparisons: Comparison) -> RunAgreement:
    run = throttled()
    return RunAgreement(run.scenario, run.spec, comparisons)


def taken_from(comparison: Comparison, lost_ms: float) -> Comparison:
    """The same measurement, as if the host had taken ``lost_ms`` from its tasks."""
    measured = comparison.measured
    extra = {**measured.extra, "lost_ms": lost_ms}
    return dataclasses.replace(comparison, measured=dataclasses.replace(measured, extra=extra))


def agreeing_and_missing() -> tuple[Comparison, list[Comparison]]:
    run = throttled()
    agreed = [c for c in run.comparisons if not c.misses]
    missed = [c for c in run.comparisons if c.misses]
    assert len(agreed) == 1 and len(missed) == 7 and agreed[0].lost_ms < LEFT_ALONE_LOST_MS
    return agreed[0], missed


def test_a_model_wrong_in_most_measurements_does_not_agree() -> None:
    agreed, missed = agreeing_and_missing()
    assert not throttled().agrees, throttled().describe()
    assert not of(agreed, *missed[:3]).agrees  # right in one of four
    assert not of(agreed, *missed[:2]).agrees  # one of three


def test_at_least_half_of_the_measurements_is_enough() -> None:
    agreed, missed = agreeing_and_missing()
    assert of(agreed, missed[0]).agrees  # one of two: the median measurement's verdict
    assert of(agreed, agreed, *missed[:2]).agrees  # two of four


def test_measuring_again_adds_a_measurement_to_judge_by_not_a_chance() -> None:
    """A run that agreed in one of two and is measured twice more, missing both times, no
    longer agrees: under the old rule (any one) it did, whatever came after."""
    agreed, missed = agreeing_and_missing()
    assert of(agreed, missed[0]).agrees
    assert not of(agreed, missed[0], missed[1], missed[2]).agrees


def test_the_measurements_the_host_took_from_are_set_aside_and_reported() -> None:
    agreed, missed = agreeing_and_missing()
    disturbed = [taken_from(c, LEFT_ALONE_LOST_MS + 10) for c in missed[:3]]
    run = of(agreed, *disturbed)
    assert run.judged == (agreed,) and not run.disturbed
    assert run.agrees, run.describe()
    assert "agrees in 1 of the 1 judged, 3 the host took from set aside" in run.describe()


def test_where_the_host_took_from_every_measurement_all_are_judged() -> None:
    agreed, missed = agreeing_and_missing()
    every = [taken_from(c, LEFT_ALONE_LOST_MS) for c in (agreed, *missed[:3])]
    run = of(*every)
    assert run.disturbed and len(run.judged) == 4
    assert not run.agrees
    assert "the host took from every one" in run.describe()
