"""Shared fixtures: the real cgroup layout for kernel tests, and leak checks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from unthrottle.cgroups import CgroupError, Layout, detect_layout

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("seed-*.yaml"))


def _kernel_layout() -> Layout | None:
    if os.geteuid() != 0:
        return None
    try:
        return detect_layout()
    except CgroupError:
        return None


KERNEL_LAYOUT = _kernel_layout()


def lab_cgroups(layout: Layout) -> set[Path]:
    """Every lab or test cgroup present now, in every hierarchy."""
    found: set[Path] = set()
    for root in layout.roots:
        found |= set(root.glob("unthrottle-*"))
    return found


@pytest.fixture
def layout() -> Iterator[Layout]:
    """The host's real cgroup layout; the test is skipped without root or a CPU controller.

    After the test, no cgroup it created may be left behind.
    """
    if KERNEL_LAYOUT is None:
        pytest.skip("needs root and a cgroup CPU controller")
    before = lab_cgroups(KERNEL_LAYOUT)
    yield KERNEL_LAYOUT
    left = lab_cgroups(KERNEL_LAYOUT) - before
    assert not left, f"cgroups left behind: {sorted(map(str, left))}"
