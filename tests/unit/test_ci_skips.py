"""A CI run takes no skip for what the project installs, and every run counts its skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from missing import MISSING
from support.paths import ROOT

SAMPLE = """
import pytest
from missing import MISSING

requires_tool = pytest.mark.skipif(True, reason=f"{MISSING} prometheus is not installed")

@requires_tool
def test_needs_prometheus():
    pass

def test_kernel():
    pytest.skip(f"{MISSING} kernel test: needs root")

def test_opt_in():
    pytest.skip("real-cluster suite is opt-in")

def test_opt_in_too():
    pytest.skip("real-cluster suite is opt-in")

def test_runs():
    pass
"""


def run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT / "tests")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "missing", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip


def test_with_ci_a_skip_for_what_the_makefile_installs_fails_naming_it(tmp_path: Path) -> None:
    out = run(tmp_path, "true")
    assert out.returncode == 1, out.stdout
    # the skipif's skip comes in setup, so its failure counts as an error
    assert "1 failed, 1 passed, 2 skipped, 1 error" in out.stdout
    assert "CI=true: prometheus is not installed (the Makefile installs or builds it)" in out.stdout
    assert "CI=true: kernel test: needs root" in out.stdout
    assert "   2 skipped: real-cluster suite is opt-in" in out.stdout


def test_elsewhere_it_is_a_skip_and_the_run_ends_with_each_reason_counted(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, None)
    assert out.returncode == 0, out.stdout
    assert "1 passed, 4 skipped" in out.stdout
    summary = out.stdout.split("skips by reason", 1)[1].splitlines()
    lines = [line.strip() for line in summary if "skipped:" in line]
    assert lines == [
        "2 skipped: real-cluster suite is opt-in",
        "1 skipped: missing: kernel test: needs root",
        "1 skipped: missing: prometheus is not installed",
    ]


PROMTOOL_TEST = (
    "tests/servers/test_chart.py::test_promtool_accepts_the_prometheus_rule_the_chart_renders"
)


def ci_run(tmp_path: Path, tools: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``.ci/run`` as it is, in a clone whose Makefile's ``test`` runs one test that needs
    promtool the way ``make test`` runs pytest, with nothing but ``tools`` on the PATH and
    no CI variable from outside. The real Makefile's ``test`` first installs what is
    missing (as root, with apt-get) and then runs the whole suite: too slow for a test."""
    clone, bin_dir = tmp_path / "clone", tmp_path / "bin"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy2(ROOT / ".ci" / "run", clone / ".ci" / "run")
    (clone / "Makefile").write_text(
        f"test:\n\t{sys.executable} -m pytest -p no:cacheprovider --rootdir {ROOT} "
        f"{ROOT / PROMTOOL_TEST}\n"
    )
    bin_dir.mkdir()
    for name, path in tools.items():
        (bin_dir / name).symlink_to(path)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(bin_dir)
    return subprocess.run(
        [tools["bash"], str(clone / ".ci" / "run")],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip


def basic_tools() -> dict[str, str]:
    found = {name: shutil.which(name) for name in ("bash", "make", "dirname")}
    missing = [name for name, path in found.items() if path is None]
    assert not missing, f"no {missing} on this machine's PATH"
    return {name: path for name, path in found.items() if path is not None}


def test_ci_run_fails_where_a_tool_the_makefile_installs_is_missing(tmp_path: Path) -> None:
    """Whatever the CI system exports: ``.ci/run`` sets ``CI=true`` itself, so promtool
    missing from the PATH fails the run instead of skipping its test."""
    out = ci_run(tmp_path, basic_tools())
    assert out.returncode != 0, out.stdout
    # the skipif's skip comes in setup, so its failure counts as an error
    assert "1 error" in out.stdout, out.stdout
    assert "CI=true: promtool is not installed" in out.stdout


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason=f"{MISSING} promtool is not installed (make prometheus installs Debian's as root)",
)
def test_ci_run_passes_where_the_tool_is_on_the_path(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    out = ci_run(tmp_path, {**basic_tools(), "promtool": promtool})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout and "no test skipped" in out.stdout
