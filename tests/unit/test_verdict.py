"""What a change's result is judged against: the ratio before it, or what the engine
expected when that was higher (a capped step predicted to stay throttled)."""

from __future__ import annotations

from unthrottle.kube.patching import ContainerChange, Settings
from unthrottle.operator.changes import judged_against


def change(before: float | None, expected: float | None) -> ContainerChange:
    return ContainerChange("app", Settings(500, 0, None), Settings(1000, 45_000, None),
                           before, expected)  # fmt: skip


def test_a_capped_step_predicted_to_stay_throttled_is_judged_against_the_prediction() -> None:
    # the chart journey's record (CI, f1a4f15): 92 % before, 100 % expected, 100 % after
    assert judged_against(change(0.9196558996176182, 1.0)) == 1.0


def test_a_step_expected_to_help_is_judged_against_the_ratio_before() -> None:
    assert judged_against(change(0.3, 0.01)) == 0.3
    assert judged_against(change(0.3, None)) == 0.3
    assert judged_against(change(None, 0.2)) == 0.2
