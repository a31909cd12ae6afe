"""The tooling the lab and kernel tests stand on: markers that skip by themselves, and a
Prometheus launcher that the demo and the benchmarks use without the test framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]


def test_kernel_and_cluster_markers_skip_by_themselves_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This project's conftest, on a machine without root: the layout comes back None.
    # (its collection hook reads the module's names when it runs: rebound after its imports)
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert "KERNEL_LAYOUT is None" in conftest  # the rule this test holds is still there
    conftest += '\nKERNEL_LAYOUT, KERNEL_MISSING = None, "needs root (it creates real cgroups)"\n'
    pytester.makeconftest(conftest)
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        "markers =\n    kernel: k\n    cluster: c\n"
    )
    pytester.makepyfile(
        "import pytest\n"
        "@pytest.mark.kernel\n"
        "def test_asks_for_no_fixture():\n    raise AssertionError('ran without root')\n"
        "@pytest.mark.cluster\n"
        "def test_a_cluster():\n    raise AssertionError('ran without being asked')\n"
    )
    monkeypatch.delenv("UNTHROTTLE_TEST_CLUSTER", raising=False)
    monkeypatch.delenv("CI", raising=False)  # a developer's machine: CI=true fails the skip
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*kernel test: needs root*", "*UNTHROTTLE_TEST_CLUSTER=1*"])


def test_the_prometheus_launcher_is_importable_without_pytest() -> None:
    # The demo and the benchmarks start Prometheus through it; pytest is a test extra.
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None  # importing it now raises ImportError\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "from unthrottle_lab.prometheus import PrometheusServer, free_port\n"
        "import cluster_query\n"
        "import runpy\n"
        f"runpy.run_path({str(ROOT / 'demo' / 'recommend_demo.py')!r}, run_name='not_main')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_tests_keep_their_names_for_the_launcher() -> None:
    from prom import PrometheusServer, free_port
    from unthrottle_lab import prometheus

    assert PrometheusServer is prometheus.PrometheusServer
    assert free_port is prometheus.free_port
