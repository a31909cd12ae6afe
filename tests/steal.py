"""How much the host took (steal time) during each test, and over the whole run.

This machine kind is a virtual machine, and its host takes the virtual CPUs now and then,
in spells of a few seconds (docs/benchmarks.md §3): a timed kernel test in such a spell
measures the host, not the kernel. A pytest plugin (``pytest_plugins`` in conftest): a
test during which the host took 10 ms or more has a "host steal" section in its report,
shown with a failure; every run ends with the steal over the run, the tests that met the
most, and the steal each failed test met. It asserts nothing. (PYTEST_DONT_REWRITE.)

``UNTHROTTLE_TEST_PROC_STAT`` names another file to read instead of /proc/stat (this
plugin's own test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from unthrottle_lab.noise import steal_ms

STAT = Path(os.environ.get("UNTHROTTLE_TEST_PROC_STAT", "/proc/stat"))
SHOWN_MS = 10.0
"""Steal during a test from which its report says so."""
_met: dict[str, float] = {}
_start: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _start.append(steal_ms(STAT))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = steal_ms(STAT)
    yield
    _met[item.nodeid] = steal_ms(STAT) - before


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    met = _met.get(item.nodeid, 0.0)
    if call.when == "call" and met >= SHOWN_MS:
        report.sections.append(
            ("host steal", f"the host took {met:.0f} ms (steal, all CPUs) during this test")
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The steal over the run, the three tests that met the most, and each failed one's."""
    terminalreporter.section("host steal")
    total = steal_ms(STAT) - _start[0] if _start else 0.0
    terminalreporter.line(f"the host took {total / 1000:.1f} s of CPU (steal, all CPUs) "
                          "over the run")  # fmt: skip
    most = sorted(((ms, test) for test, ms in _met.items() if ms >= SHOWN_MS), reverse=True)
    for ms, test in most[:3]:
        terminalreporter.line(f"{ms:8.0f} ms during {test}")
    for report in terminalreporter.stats.get("failed", []):
        terminalreporter.line(f"{_met.get(report.nodeid, 0.0):8.0f} ms during {report.nodeid} "
                              "(failed)")  # fmt: skip
