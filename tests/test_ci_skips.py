"""A CI run takes no skip for what the project installs, and every run counts its skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

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
