"""Scenario files: the seeds load, and a malformed file names its field before anything runs.

Every refusal is one line: ``FILE: FIELD: reason``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from support.paths import SCENARIOS
from unthrottle.units import Bandwidth
from unthrottle_lab.scenario import (
    MAX_FILE_BYTES,
    MAX_RUNS,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from unthrottle_lab.workload import Kind


def scenario(workload: dict[str, Any] | None = None, runs: list[Any] | None = None) -> Any:
    return {
        "name": "t",
        "workload": workload or {"kind": "serial", "task_cpu_ms": 10},
        "runs": runs if runs is not None else [{}],
    }


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_seed_scenario_loads_as_the_kernel_settings_its_file_gives(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    loaded = load_scenario(path)
    assert loaded.name == raw["name"] == path.stem
    work = loaded.workload.to_workload()
    assert work.kind.value == raw["workload"]["kind"]
    assert work.task_cpu_us == raw["workload"]["task_cpu_ms"] * 1000
    assert len(loaded.runs) == len(raw["runs"]) >= 2
    for run, given in zip(loaded.runs, raw["runs"], strict=True):
        period_us = round(given.get("period_ms", 100) * 1000)  # the kernel's default 100 ms
        quota_us = round(given["cpus"] * period_us) if "cpus" in given else None
        burst_us = round(given.get("burst_ms", 0) * 1000)
        assert run.bandwidth() == Bandwidth(quota_us, period_us, burst_us), given


def test_the_seeds_ask_the_kernel_for_these_limits() -> None:
    # what `lab` prints for each run, and what it writes into cpu.max / cfs_quota_us
    runs = {p.stem: [(r.label(), r.bandwidth().quota_us, r.bandwidth().period_us,
                      r.bandwidth().burst_us) for r in load_scenario(p).runs]
            for p in SCENARIOS}  # fmt: skip
    assert runs["seed-000-serial-30ms"] == [
        ("no limit", None, 100_000, 0),
        ("0.5 CPU", 50_000, 100_000, 0),
        ("0.5 CPU, 10 ms period", 5_000, 10_000, 0),
    ]
    assert runs["seed-002-burst"] == [
        ("0.25 CPU", 25_000, 100_000, 0),
        ("0.25 CPU, 25 ms burst", 25_000, 100_000, 25_000),
    ]


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


def test_think_time_paces_a_batch_between_rounds() -> None:
    loaded = parse_scenario(scenario({"kind": "batch", "task_cpu_ms": 10, "think_ms": 50}))
    assert loaded.workload.to_workload().think_us == 50_000


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"kind": "serial", "task_cpu_ms": 5, "rate_per_s": 10}, "workload.rate_per_s"),
        ({"kind": "serial", "task_cpu_ms": 5, "seed": 3}, "workload.seed"),
        ({"kind": "batch", "task_cpu_ms": 5, "rate_per_s": 10}, "workload.rate_per_s"),
        ({"kind": "batch", "task_cpu_ms": 5, "seed": 1}, "workload.seed"),
        ({"kind": "open", "task_cpu_ms": 5, "rate_per_s": 10, "think_ms": 5}, "workload.think_ms"),
    ],
    ids=["rate-for-serial", "seed-for-serial", "rate-for-batch", "seed-for-batch",
         "think-for-open"],
)  # fmt: skip
def test_a_field_that_does_nothing_for_the_kind_is_refused_not_ignored(
    workload: dict[str, Any], field: str
) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(scenario(workload), "bad.yaml")
    message = str(info.value)
    assert message.startswith(f"bad.yaml: {field}: has no effect on ")
    assert message.endswith("remove it")


@pytest.mark.parametrize(
    ("run", "field", "says"),
    [
        ({"cpus": True}, "runs[0].cpus", "true is not a number"),
        ({"cpus": "0.5"}, "runs[0].cpus", '"0.5" is not a number'),
        ({"cpus": float("inf")}, "runs[0].cpus", ".inf is not a finite number"),
        ({"cpus": float("nan")}, "runs[0].cpus", ".nan is not a finite number"),
        ({"cpus": 1e308}, "runs[0].cpus", "1e+308 is out of bounds (it must be ≤ 1024)"),
        ({"cpus": 1, "period_ms": 1e9}, "runs[0].period_ms", "out of bounds (it must be ≤ 1000)"),
        ({"cpus": 1, "burst_ms": float("inf")}, "runs[0].burst_ms", "not a finite number"),
    ],
    ids=["bool", "string", "inf", "nan", "huge", "huge-period", "inf-burst"],
)
def test_a_number_must_be_a_finite_number_within_bounds(run: Any, field: str, says: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(scenario(runs=[run]), "bad.yaml")
    assert f"{field}: " in str(info.value) and says in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"kind": "open", "task_cpu_ms": 5, "rate_per_s": float("inf")}, "workload.rate_per_s"),
        ({"kind": "open", "task_cpu_ms": 5, "rate_per_s": 1e9}, "workload.rate_per_s"),
        ({"kind": "serial", "task_cpu_ms": 1e308}, "workload.task_cpu_ms"),
        ({"kind": "serial", "task_cpu_ms": 5, "think_ms": 1e12}, "workload.think_ms"),
        ({"kind": "serial", "task_cpu_ms": 5, "workers": True}, "workload.workers"),
        ({"kind": "serial", "task_cpu_ms": 5, "tasks": 2.5}, "workload.tasks"),
        ({"kind": "serial", "task_cpu_ms": 5, "tasks": 10**30}, "workload.tasks"),
        ({"kind": "open", "task_cpu_ms": 5, "rate_per_s": 5, "seed": -1}, "workload.seed"),
        ({"kind": "serial", "task_cpu_ms": 5, "workers": 200, "tasks": 1000}, "workload.tasks"),
    ],
    ids=["inf-rate", "huge-rate", "huge-task", "huge-think", "bool-workers",
         "fractional-tasks", "huge-tasks", "negative-seed", "too-many-latencies"],
)  # fmt: skip
def test_every_workload_number_has_bounds(workload: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(scenario(workload), "bad.yaml")
    assert f"bad.yaml: {field}: " in str(info.value)


def test_too_many_runs_are_refused_before_any_is_validated() -> None:
    with pytest.raises(
        ScenarioError, match=rf"runs: 4000000 runs; a file holds at most {MAX_RUNS}"
    ):
        parse_scenario(scenario(runs=[{}] * 4_000_000), "bad.yaml")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"name: t\nworkload: {kind: serial, task_cpu_ms: \xff}\n", "not UTF-8 text (byte 0xff"),
        (b"", "the file is empty"),
        (b"# only a comment\n", "the file is empty"),
        (b"- 1\n- 2\n", "holds a list, not a mapping of name, workload and runs"),
        (b"name: [unclosed", "not valid YAML: line 1, column 16: expected ',' or ']'"),
        (b"name: t\nworkload: {kind: serial, task_cpu_ms: 5}\nruns: [{cpus: 0.5, cpus: 4}]\n",
         "line 3, column 20: cpus is given twice (first on line 3)"),
        (b"name: t\nname: u\nworkload: {kind: serial, task_cpu_ms: 5}\nruns: [{}]\n",
         "name is given twice (first on line 1)"),
        (b"name: t\nworkload: {kind: serial, task_cpu_ms: 5}\nruns: [{cpus: 1e308}]\n",
         "runs[0].cpus: 1e+308 is out of bounds"),
        (b"name: t\nworkload: {kind: serial, task_cpu_ms: 5}\nruns: [{cpus: .inf}]\n",
         "runs[0].cpus: .inf is not a finite number"),
        (b"name: t\nworkload: {kind: serial, task_cpu_ms: 5}\nruns: [{cpus: true}]\n",
         "runs[0].cpus: true is not a number"),
        (b"name: t\nworkload: {kind: open, task_cpu_ms: 5, rate_per_s: .inf}\nruns: [{}]\n",
         "workload.rate_per_s: .inf is not a finite number"),
        (b"name: t\x00\n", "not valid YAML"),
    ],
    ids=["not-utf8", "empty", "only-a-comment", "not-a-mapping", "parser-reason",
         "duplicate-key", "duplicate-top-key", "yaml12-float-too-big", "yaml-inf",
         "yaml-true", "infinite-rate", "nul-byte"],
)  # fmt: skip
def test_a_bad_file_is_one_line_naming_the_file_and_what_is_wrong(
    tmp_path: Path, content: bytes, says: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    with pytest.raises(ScenarioError) as info:
        load_scenario(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message
    assert says in message, message


def test_a_merge_key_may_be_overridden_without_counting_as_a_duplicate(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "name: t\nworkload: {kind: serial, task_cpu_ms: 5}\n"
        "runs:\n  - &half {cpus: 0.5}\n  - {<<: *half, cpus: 1, period_ms: 10}\n"
    )
    assert [r.label() for r in load_scenario(good).runs] == ["0.5 CPU", "1 CPU, 10 ms period"]


def test_a_huge_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as out:
        out.write(b"name: t\nworkload: {kind: serial, task_cpu_ms: 5}\nruns:\n")
        out.truncate(64 * 1024 * 1024)  # 64 MB (sparse)
    with pytest.raises(ScenarioError, match=f"bigger than {MAX_FILE_BYTES // 1024} KiB"):
        load_scenario(big)


def test_an_endless_stream_is_refused_too() -> None:
    with pytest.raises(ScenarioError, match="bigger than"):
        load_scenario(Path("/dev/zero"))


class TestAPodQuota:
    def test_a_pod_quota_is_the_runs_limit_on_its_period_with_no_burst(self) -> None:
        loaded = parse_scenario(scenario(runs=[{"cpus": 0.5, "period_ms": 50, "burst_ms": 5,
                                                "pod_quota": True}]))  # fmt: skip
        run = loaded.runs[0]
        assert run.bandwidth() == Bandwidth(25_000, 50_000, 5_000)
        assert run.pod_bandwidth() == Bandwidth(25_000, 50_000)
        assert run.label() == "0.5 CPU, 50 ms period, 5 ms burst, pod quota"
        assert run.as_given()["pod_quota"] is True

    def test_a_run_without_it_has_no_pod(self) -> None:
        assert parse_scenario(scenario(runs=[{"cpus": 1}])).runs[0].pod_bandwidth() is None

    @pytest.mark.parametrize(
        ("run", "says"),
        [
            ({"pod_quota": True}, "runs[0].pod_quota: a pod quota is the run's limit; give cpus"),
            ({"cpus": 1, "pod_quota": "yes"}, 'runs[0].pod_quota: "yes" is not true or false'),
            ({"cpus": 1, "pod_quota": 1}, "runs[0].pod_quota: 1 is not true or false"),
        ],
        ids=["without-a-limit", "text", "number"],
    )
    def test_a_bad_pod_quota_is_refused_naming_the_field(self, run: Any, says: str) -> None:
        with pytest.raises(ScenarioError) as info:
            parse_scenario(scenario(runs=[run]), "bad.yaml")
        assert says in str(info.value), str(info.value)


SIDECAR = {"workload": {"kind": "serial", "task_cpu_ms": 15, "think_ms": 35}, "cpus": 0.25}


class TestASidecar:
    """A two-container pod: each container its own limit and burst, the pod the sum."""

    def test_the_pods_quota_is_the_sum_of_the_limits_and_its_burst_the_sum_of_the_bursts(
        self,
    ) -> None:
        given = {"cpus": 1, "period_ms": 50, "burst_ms": 10, "sidecar": {**SIDECAR, "burst_ms": 5}}
        run = parse_scenario(scenario(runs=[given])).runs[0]
        assert run.bandwidth() == Bandwidth(50_000, 50_000, 10_000)
        assert run.sidecar_bandwidth() == Bandwidth(12_500, 50_000, 5_000)
        assert run.pod_bandwidth() == Bandwidth(62_500, 50_000, 15_000)
        assert run.in_pod and not run.pod_quota
        assert (
            run.label()
            == "1 CPU, 50 ms period, 10 ms burst, sidecar 0.25 CPU (5 ms burst), pod quota"
        )
        assert run.as_given()["sidecar"]["cpus"] == 0.25

    def test_without_bursts_the_pod_has_none(self) -> None:
        run = parse_scenario(scenario(runs=[{"cpus": 1, "sidecar": SIDECAR}])).runs[0]
        assert run.pod_bandwidth() == Bandwidth(125_000, 100_000, 0)

    def test_the_scenarios_of_the_lab_have_one(self) -> None:
        root = Path(__file__).resolve().parents[2] / "scenarios"
        for name in ("pod-sidecar-batch.yaml", "tune-batch-sidecar.yaml"):
            first = load_scenario(root / name).runs[0]
            assert first.sidecar is not None and first.pod_bandwidth() == Bandwidth(
                120_000, 100_000
            )

    @pytest.mark.parametrize(
        ("run", "says"),
        [
            ({"sidecar": SIDECAR}, "runs[0].sidecar: a pod's quota needs a limit on every "
             "container; give cpus"),
            ({"cpus": 1, "pod_quota": False, "sidecar": SIDECAR},
             "runs[0].pod_quota: a run with a sidecar is a pod whose quota is the sum"),
            ({"cpus": 1, "sidecar": {**SIDECAR, "burst_ms": 30}},
             "runs[0].sidecar: burst_ms 30 ms is above its quota of 25 ms"),
            ({"cpus": 1, "sidecar": {**SIDECAR, "cpus": 0.001}},
             "runs[0].sidecar: a quota of 0.1 ms (cpus × the run's period_ms) is under"),
            ({"cpus": 1, "sidecar": {**SIDECAR, "cpus": True}},
             "runs[0].sidecar.cpus: true is not a number"),
            ({"cpus": 1, "sidecar": {"cpus": 0.5}}, "runs[0].sidecar.workload: Field required"),
            ({"cpus": 1, "sidecar": {**SIDECAR, "workload": {"kind": "serial", "task_cpu_ms": 5,
                                                             "seed": 3}}},
             "runs[0].sidecar.workload.seed: has no effect on a serial workload"),
            ({"cpus": 1, "sidecar": 3}, "runs[0].sidecar: 3 is not a mapping"),
        ],
        ids=["without-a-limit", "pod-quota-false", "burst-over-quota", "quota-under-1ms",
             "cpus-bool", "no-workload", "workload-field-for-another-kind", "not-a-mapping"],
    )  # fmt: skip
    def test_a_bad_sidecar_is_refused_naming_the_field(self, run: Any, says: str) -> None:
        with pytest.raises(ScenarioError) as info:
            parse_scenario(scenario(runs=[run]), "bad.yaml")
        assert says in str(info.value), str(info.value)
