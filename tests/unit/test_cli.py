"""The command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT, SCENARIOS

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UNTHROTTLE_LAB = Path(sys.executable).with_name("unthrottle-lab")


def cli(*args: str, binary: Path = UNTHROTTLE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], check=False, capture_output=True, text=True, timeout=120
    )


def lab(*args: str) -> subprocess.CompletedProcess[str]:
    """The laboratory's command (``unthrottle-lab``, apart from the product's)."""
    return cli(*args, binary=UNTHROTTLE_LAB)


def test_help_lists_every_command_with_a_line_of_help() -> None:
    out = cli("--help").stdout
    assert "recommend" in out and "agent" in out
    assert "simulate" not in out and "real cgroups" not in out  # the laboratory's
    out = lab("--help").stdout
    assert "simulate" in out and "Predict each scenario" in out
    assert "run" in out and "real cgroups" in out


def test_simulate_json_has_the_lab_shape_for_every_run() -> None:
    out = lab("simulate", "--json", "--cores", "2", *map(str, SCENARIOS))
    assert out.returncode == 0, out.stderr
    objects = [json.loads(line) for line in out.stdout.splitlines()]
    assert [o["name"] for o in objects] == [p.stem for p in SCENARIOS]
    for obj in objects:
        for run in obj["runs"]:
            assert set(run["latency_ms"]) == {"p50", "p95", "p99", "max"}
            for key in (
                "wall_ms",
                "nr_periods",
                "nr_throttled",
                "throttled_ms",
                "nr_bursts",
                "burst_ms",
                "throttle_ratio",
                "limit",
            ):
                assert key in run
    serial = next(o for o in objects if o["name"] == "seed-000-serial-30ms")
    assert serial["runs"][1]["limit"] == {"cpus": 0.5}
    assert serial["runs"][1]["latency_ms"]["p50"] > 60


def test_simulate_prints_a_table_by_default() -> None:
    out = lab("simulate", "--cores", "2", str(ROOT / "scenarios" / "seed-002-burst.yaml"))
    assert out.returncode == 0
    assert "seed-002-burst" in out.stdout and "25 ms burst" in out.stdout


def test_more_cores_for_a_parallel_batch_change_nothing_without_a_limit() -> None:
    batch = str(ROOT / "scenarios" / "seed-000-batch-parallel.yaml")
    one = json.loads(lab("simulate", "--json", "--cores", "1", batch).stdout)
    two = json.loads(lab("simulate", "--json", "--cores", "2", batch).stdout)
    assert one["runs"][0]["latency_ms"]["p50"] == pytest.approx(120)
    assert two["runs"][0]["latency_ms"]["p50"] == pytest.approx(60)


@pytest.mark.parametrize("command", [["simulate"], ["run"]], ids=["simulate", "lab-run"])
def test_a_malformed_file_is_named_with_its_field_and_nothing_runs(
    tmp_path: Path, command: list[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkload: {kind: stream, task_cpu_ms: 5}\nruns: [{}]\n")
    good = ROOT / "scenarios" / "seed-000-serial-5ms.yaml"
    out = lab(*command, "--json", str(good), str(bad))
    assert out.returncode == 2
    assert "bad.yaml: workload.kind" in out.stderr
    assert "nothing was run" in out.stderr
    assert out.stdout == ""


def test_the_package_never_shadows_the_standard_library_operator_module() -> None:
    assert not (ROOT / "src" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import operator, unthrottle; print(operator.add(2, 3))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == "5"
