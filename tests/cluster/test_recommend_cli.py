"""`unthrottle recommend` as a user runs it, against a real Prometheus with history; in
cluster mode, against the real Kubernetes API server too."""

from __future__ import annotations

import json

import pytest

from prom import PrometheusServer, free_port, requires_prometheus
from support.recommend_cli import (  # noqa: F401 (autouse fixtures; its tests)
    ClusterShop,
    cli,
    test_a_selector_chooses_deployments_from_kube_state_metrics_labels,
    test_cluster_mode_takes_deployments_and_gomaxprocs_from_the_api,
    test_deployments_without_cpu_counters_name_the_missing_scrapes,
    test_json_has_every_workload_most_harmful_first,
    test_top_keeps_the_most_harmful_and_says_how_many_were_left_out,
    test_without_agent_series_it_falls_back_to_counters_and_says_so,
    test_yaml_and_csv_carry_the_same_workloads,
)
from unthrottle.units import format_cpu


@requires_prometheus
def test_a_namespace_without_deployments_is_an_error(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "empty", "--window", "1h")
    assert out.returncode == 1
    assert "no Deployments, StatefulSets or DaemonSets found in empty" in out.stderr
    only = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "empty", "--window",
               "1h", "--kind", "deploy")  # fmt: skip
    assert only.returncode == 1 and "no Deployments found in empty" in only.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--window", "seven days", "--no-cluster"], 2, "--window"),
        (["--format", "xml", "--no-cluster"], 2, "--format"),
        (["--target", "2", "--no-cluster"], 2, "--target: 2.0 is not in (0, 1)"),
        (
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            2,
            "--kubeconfig: /nonexistent/kubeconfig not found; or run with --no-cluster",
        ),
        (["--no-cluster", "--header", "nonsense"], 2, "--header"),
        (["--no-cluster", "--min-limit", "lots"], 2, "--min-limit: 'lots' is not a CPU quantity"),
        (
            ["--no-cluster", "--min-limit", "2", "--max-limit", "1"],
            2,
            "--max-limit: 1000m is below limits.min",
        ),
        (["--no-cluster", "--max-step-up", "0.5"], 2, "--max-step-up: 0.5 is below 1"),
        (["--no-cluster", "--headroom", "-1"], 2, "--headroom: -1.0 is not in [0, 10]"),
    ],
    ids=[
        "window",
        "format",
        "target",
        "no-kubeconfig",
        "header",
        "min-limit",
        "max-below-min",
        "step-up",
        "headroom",
    ],
)
def test_bad_options_are_named(args: list[str], code: int, message: str) -> None:
    out = cli("--prometheus", "http://127.0.0.1:1", *args)
    assert out.returncode == code
    assert message in out.stderr


def test_an_unreachable_prometheus_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = cli("--prometheus", url, "--no-cluster", "--timeout", "2")
    assert out.returncode == 1
    assert f"unreachable at {url}" in out.stderr


@pytest.fixture(scope="module")
def history_server() -> type[PrometheusServer]:
    """What serves the history of the Deployments on the control plane: Prometheus here
    (test_victoria_cli gives VictoriaMetrics)."""
    return PrometheusServer


def test_a_malformed_selector_is_named() -> None:
    out = cli("--prometheus", "http://127.0.0.1:9", "--no-cluster", "-l", "app=web,,x")
    assert out.returncode == 2
    assert "--selector: ',x' is not a requirement" in out.stderr


@requires_prometheus
def test_a_selector_chooses_deployments_by_their_labels_in_the_api(
    cluster_shop: ClusterShop,
) -> None:
    out = cluster_shop.recommend("--format", "json", "--selector", "tier!=front")
    assert out.returncode == 0, out.stderr
    # "batch" (back) and "fresh" (no tier): a missing label is "not front", as kubectl has it
    assert {w["deployment"] for w in json.loads(out.stdout)["workloads"]} == {"batch", "fresh"}


@requires_prometheus
def test_recommend_takes_the_policys_bounds_and_shows_the_uncapped_limit(prometheus: str) -> None:
    args = ("--prometheus", prometheus, "--no-cluster", "--namespace", "shop", "--window", "1h")
    capped = cli(*args, "--format", "json", "--max-step-up", "1.1")
    assert capped.returncode == 0, capped.stderr
    api = json.loads(capped.stdout)["workloads"][0]["containers"][0]["recommendation"]
    assert api["limit_millicores"] <= 550  # ×1.1 from 500m
    assert api["uncapped_limit_millicores"] > 550  # what the evidence asked for
    table = cli(*args, "--max-step-up", "1.1")
    assert table.returncode == 0, table.stderr
    assert "uncapped" in table.stdout
    loose = cli(*args, "--format", "json", "--max-step-up", "10", "--headroom", "0")
    rec = json.loads(loose.stdout)["workloads"][0]["containers"][0]["recommendation"]
    assert rec["limit_millicores"] == rec["uncapped_limit_millicores"] > 550


@requires_prometheus
def test_a_limit_made_from_throttled_data_is_shown_as_a_range(prometheus: str) -> None:
    args = ("--prometheus", prometheus, "--no-cluster", "--namespace", "shop", "--window", "1h")
    out = cli(*args, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    api = doc["workloads"][0]["containers"][0]  # throttled past the target today
    assert api["throttle_ratio"] > doc["target"]
    rec = api["recommendation"]
    low, high = rec["lower_limit_millicores"], rec["limit_millicores"]
    assert 0 < low < high
    assert any(f"between {low}m and {high}m" in r and "refines" in r for r in rec["reasons"])
    table = cli(*args, "--format", "csv")
    row = next(r for r in table.stdout.splitlines() if r.startswith("shop,Deployment,api,api,"))
    assert f"({format_cpu(low)}–{format_cpu(high)})" in row
    for w in doc["workloads"]:  # not throttled past the target: one value
        for c in w["containers"]:
            if c["recommendation"] and (c["throttle_ratio"] or 0) <= doc["target"]:
                assert "lower_limit_millicores" not in c["recommendation"]
