"""A real Prometheus server for tests: the launcher of ``unthrottle_lab.prometheus``
(shared with the demo and the benchmarks), and the marker that skips without it.

Re-exported here so that ``from prom import PrometheusServer, free_port`` keeps working.
"""

from __future__ import annotations

import pytest

from missing import MISSING
from unthrottle_lab.prometheus import PrometheusServer, free_port, have_prometheus

__all__ = ["PrometheusServer", "free_port", "requires_prometheus"]

requires_prometheus = pytest.mark.skipif(
    not have_prometheus(),
    reason=f"{MISSING} prometheus is not installed (make test installs it as root)",
)
