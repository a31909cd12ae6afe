"""The host's steal time is reported per test and over the run (tests/steal.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.paths import ROOT

LINE = "cpu  100 0 100 1000 0 0 0 {steal} 0 0\n"  # /proc/stat's first line: steal is the 8th
SAMPLE = """
from pathlib import Path

STAT = Path({stat!r})
LINE = {line!r}

def test_quiet():
    pass

def test_stolen_from_and_failing():
    STAT.write_text(LINE.format(steal=155))  # 50 ticks: 500 ms at USER_HZ 100
    assert False

def test_stolen_from_a_little():
    STAT.write_text(LINE.format(steal=156))
"""


def test_a_test_the_host_took_from_says_so_and_the_run_ends_with_the_steal(
    tmp_path: Path,
) -> None:
    stat = tmp_path / "stat"
    stat.write_text(LINE.format(steal=105))
    (tmp_path / "test_sample.py").write_text(SAMPLE.format(stat=str(stat), line=LINE))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}", "UNTHROTTLE_TEST_PROC_STAT": str(stat)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "steal", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout
    ticks_ms = 1000 / os.sysconf("SC_CLK_TCK")
    stolen = f"{50 * ticks_ms:.0f} ms"
    # the failure shows what the host took meanwhile
    assert f"the host took {stolen} (steal, all CPUs) during this test" in out.stdout
    summary = out.stdout.split("host steal", 1)[1]
    assert f"the host took {51 * ticks_ms / 1000:.1f} s of CPU" in out.stdout, out.stdout
    lines = [line.strip() for line in summary.splitlines() if " ms during " in line]
    assert lines == [  # the most first (10 ms and more only), then each failed test
        f"{stolen} during test_sample.py::test_stolen_from_and_failing",
        f"{ticks_ms:.0f} ms during test_sample.py::test_stolen_from_a_little",
        f"{stolen} during test_sample.py::test_stolen_from_and_failing (failed)",
    ], out.stdout
