"""Scenario files: the seeds load, and a malformed file names its field before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import SCENARIOS
from unthrottle.cfs import Bandwidth, Kind
from unthrottle.model.scenario import ScenarioError, load_scenario, parse_scenario


def scenario(workload: dict[str, Any] | None = None, runs: list[Any] | None = None) -> Any:
    return {
        "name": "t",
        "workload": workload or {"kind": "serial", "task_cpu_ms": 10},
        "runs": runs if runs is not None else [{}],
    }


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_seed_scenario_loads(path: Path) -> None:
    loaded = load_scenario(path)
    assert loaded.runs


def test_settings_become_kernel_integers() -> None:
    loaded = parse_scenario(scenario(runs=[{"cpus": 0.5, "period_ms": 10, "burst_ms": 2}]))
    assert loaded.runs[0].bandwidth() == Bandwidth(5_000, 10_000, 2_000)
    work = loaded.workload.to_workload()
    assert (work.kind, work.task_cpu_us) == (Kind.SERIAL, 10_000)


def test_the_output_keeps_the_settings_as_the_file_gave_them() -> None:
    loaded = parse_scenario(scenario(runs=[{}, {"cpus": 1}]))
    assert [r.as_given() for r in loaded.runs] == [{}, {"cpus": 1}]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (scenario({"kind": "stream", "task_cpu_ms": 5}), "workload.kind"),
        (scenario({"kind": "serial", "task_cpu_ms": -5}), "workload.task_cpu_ms"),
        (scenario({"kind": "serial", "task_cpu_ms": 5, "think_ms": -1}), "workload.think_ms"),
        (scenario({"kind": "open", "task_cpu_ms": 5}), "workload.rate_per_s"),
        (scenario({"kind": "serial", "task_cpu_ms": 5, "workerz": 2}), "workload.workerz"),
        (scenario(runs=[{}, {"cpus": 0.5, "burst_ms": 60}]), "runs[1].burst_ms"),
        (scenario(runs=[{"cpus": 0.005}]), "runs[0].cpus"),
        (scenario(runs=[{"cpus": 1, "period_ms": 0.5}]), "runs[0].period_ms"),
        (scenario(runs=[{"burst_ms": 5}]), "runs[0].burst_ms"),
        (scenario(runs=[]), "runs"),
    ],
    ids=[
        "unknown-kind",
        "negative-time",
        "negative-think",
        "open-without-rate",
        "unknown-key",
        "burst-over-quota",
        "quota-under-1ms",
        "period-under-1ms",
        "burst-without-limit",
        "no-runs",
    ],
)
def test_a_malformed_scenario_is_refused_naming_the_field(data: Any, field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "bad.yaml")
    assert str(info.value).startswith("bad.yaml: ")
    assert f"{field}:" in str(info.value)


def test_a_file_that_is_not_yaml_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.yaml")
