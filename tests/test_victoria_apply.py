"""Apply mode's verification reads the new pods' counters after a patch: test_apply's tests
of a change that helped, one that made things worse and a metrics backend away mid-verify,
run here with their ``world`` serving the same history from VictoriaMetrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_emulator import KubeEmulator
from shop import objects, openmetrics
from test_apply import (  # collected here too, against this module's fixture
    AFTER,
    BEFORE,
    HOUR,
    NOW,
    T0,
    World,
    test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds,
    test_a_regression_after_verification_is_rolled_back_to_the_recorded_values,
    test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch,
)
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria
REUSED = (
    test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds,
    test_a_regression_after_verification_is_rolled_back_to_the_recorded_values,
    test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch,
)
"""test_apply's tests, each run here against VictoriaMetrics."""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    history = openmetrics(BEFORE, T0, span=2 * HOUR) + "".join(
        openmetrics([w], NOW, span=NOW - T0 - 120) for w in AFTER)  # fmt: skip
    with (KubeEmulator(vpa=True) as kube,
          VictoriaMetricsServer(tmp_path, openmetrics=history) as vm):  # fmt: skip
        for w in BEFORE:
            for resource, obj in objects(w):
                kube.put(resource, obj)
            kube.complete_rollout(w.namespace, w.name)
        api = kube.api_client(kube.kubeconfig(tmp_path / "kubeconfig"))
        yield World(kube, vm, api)  # type: ignore[arg-type]  # stands in for PrometheusServer
