"""Apply mode's verification reads the new pods' counters after a patch: test_apply's tests
of a change that helped, one that made things worse and a metrics backend away mid-verify,
run here with their ``world`` serving the same history from VictoriaMetrics (the new
ReplicaSet's history imported through its API once the real controller has made it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.apply import (
    World,
    shop_world,
    test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds,
    test_a_regression_after_verification_is_rolled_back_to_the_recorded_values,
    test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch,
)
from unthrottle_lab.kube import ControlPlane
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
REUSED = (
    test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds,
    test_a_regression_after_verification_is_rolled_back_to_the_recorded_values,
    test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch,
)
"""test_apply's tests, each run here against VictoriaMetrics."""


@pytest.fixture
def world(tmp_path: Path, control_plane: ControlPlane,
          throttlepolicy_crd: None) -> Iterator[World]:  # fmt: skip
    with shop_world(tmp_path, control_plane, VictoriaMetricsServer) as world:
        yield world
