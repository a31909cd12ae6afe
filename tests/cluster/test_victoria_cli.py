"""`unthrottle recommend` as a user runs it, against VictoriaMetrics: test_recommend_cli's
tests, run here with their ``prometheus`` fixture serving the same hour from
VictoriaMetrics, and the two backends' reports compared."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from prom import PrometheusServer, requires_prometheus
from support.recommend_cli import (
    cli,
    cli_history,
    test_a_selector_chooses_deployments_from_kube_state_metrics_labels,
    test_cluster_mode_takes_deployments_and_gomaxprocs_from_the_api,
    test_deployments_without_cpu_counters_name_the_missing_scrapes,
    test_json_has_every_workload_most_harmful_first,
    test_top_keeps_the_most_harmful_and_says_how_many_were_left_out,
    test_without_agent_series_it_falls_back_to_counters_and_says_so,
    test_yaml_and_csv_carry_the_same_workloads,
)
from support.victoria_shared import (
    RATIO_SLACK,
    assert_close,
)
from victoria import VictoriaMetricsServer, requires_victoria

pytestmark = requires_victoria


@pytest.fixture(scope="module")
def history_server() -> type[VictoriaMetricsServer]:
    """The control plane's shop's history, served by VictoriaMetrics here."""
    return VictoriaMetricsServer


REUSED = (
    test_json_has_every_workload_most_harmful_first,
    test_yaml_and_csv_carry_the_same_workloads,
    test_without_agent_series_it_falls_back_to_counters_and_says_so,
    test_deployments_without_cpu_counters_name_the_missing_scrapes,
    test_cluster_mode_takes_deployments_and_gomaxprocs_from_the_api,
    test_a_selector_chooses_deployments_from_kube_state_metrics_labels,
    test_top_keeps_the_most_harmful_and_says_how_many_were_left_out,
)
"""test_recommend_cli's tests that read its history, each run here against VictoriaMetrics."""


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of VictoriaMetrics holding test_recommend_cli's hour (the name is the one
    those tests ask for: ``--prometheus`` takes any PromQL-compatible API)."""
    with VictoriaMetricsServer(tmp_path_factory.mktemp("vm"), openmetrics=cli_history()) as vm:
        yield vm.url


def _report(url: str) -> dict[str, Any]:
    out = cli("--prometheus", url, "--no-cluster", "--namespace", "shop", "--window", "1h",
              "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@requires_prometheus
def test_the_report_from_victoria_metrics_is_prometheus_s_within_a_bucket(
    prometheus: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=cli_history()) as prom:
        theirs = _report(prom.url)
    ours = _report(prometheus)
    assert [w["deployment"] for w in ours["workloads"]] == [
        w["deployment"] for w in theirs["workloads"]]  # fmt: skip
    for mine, other in zip(ours["workloads"], theirs["workloads"], strict=True):
        for c, d in zip(mine["containers"], other["containers"], strict=True):
            assert (c["evidence"], c["current"], c["demand"]) == (
                d["evidence"], d["current"], d["demand"])  # fmt: skip
            assert c["throttle_ratio"] == pytest.approx(d["throttle_ratio"], abs=RATIO_SLACK)
            if c["recommendation"] is None or d["recommendation"] is None:
                assert c["recommendation"] == d["recommendation"]
                continue
            a, b = c["recommendation"], d["recommendation"]
            assert_close((a["limit_millicores"], a["burst_us"]),
                         (b["limit_millicores"], b["burst_us"]))  # fmt: skip
