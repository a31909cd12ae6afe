"""The mark of a skip that a CI run must not take.

A test that needs something the project installs or builds itself (``make test``:
prometheus, victoria-metrics, chromium and playwright, the control plane; root and a
cgroup CPU controller for the kernel tests) skips with a reason starting with
:data:`MISSING` when it is not there. On a developer's machine that is a skip; with
``CI=true`` conftest turns it into a failure, since there the Makefile was to provide it
(a bug in ``detect_layout()`` would otherwise turn every kernel test into a skip).

A pytest plugin (``pytest_plugins`` in conftest): it makes that failure, and ends every
run with one line per skip reason and its count. (PYTEST_DONT_REWRITE: conftest imports
it before pytest loads it as a plugin; it asserts nothing.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

MISSING = "missing:"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``CI=true``, a skip for something the Makefile installs or builds (its reason
    starts with ``missing.MISSING``) is a failure, saying what was missing."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") != "true" or not report.skipped:
        return
    reason = _skip_reason(report)
    if reason.startswith(MISSING):
        report.outcome = "failed"
        what = reason.removeprefix(MISSING).strip()
        report.longrepr = f"CI=true: {what} (the Makefile installs or builds it)"


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per skip reason, with its count, at the end of every run."""
    counts: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = _skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.section("skips by reason")
    if not counts:
        terminalreporter.line("no test skipped")
    for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.line(f"{count:4d} skipped: {reason}")
