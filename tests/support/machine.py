"""What the tests share about this machine: the host's real cgroup layout (or why there is
none), the lab's cgroups present now, a process's CPU cgroup. Fixtures and hooks stay in
tests/conftest.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

from unthrottle.cgroups import CgroupError, Layout, detect_layout

CLUSTER_OPT_IN = "UNTHROTTLE_TEST_CLUSTER"


def _kernel_layout() -> tuple[Layout | None, str]:
    if os.geteuid() != 0:
        return None, "needs root (it creates real cgroups)"
    try:
        return detect_layout(), ""
    except CgroupError as err:
        return None, f"needs a cgroup CPU controller: {err}"


KERNEL_LAYOUT, KERNEL_MISSING = _kernel_layout()


_OWNER = re.compile(r"^unthrottle-\D*?(\d+)")


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def _someone_elses(name: str) -> bool:
    """A cgroup named after a live process that is neither this one nor one it started:
    another engineer's test run on the same machine, not a leak of ours."""
    match = _OWNER.match(name)
    if match is None:
        return False
    pid: int | None = int(match.group(1))
    if not Path(f"/proc/{pid}").exists():
        return False  # its owner is gone: ours if it appeared during our test
    while pid is not None and pid > 1:
        if pid == os.getpid():
            return False
        pid = _parent_of(pid)
    return True


def cpu_cgroup_of(pid: int) -> str:
    """The process's path in the CPU hierarchy (v1 ``cpu`` or v2's ``0::``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    raise AssertionError(f"{pid}: no CPU hierarchy")


def lab_cgroups(layout: Layout) -> set[Path]:
    """Every lab or test cgroup present now, in every hierarchy, except those of other
    processes' test runs (the machine is shared)."""
    found: set[Path] = set()
    for root in layout.roots:
        found |= {p for p in root.glob("unthrottle-*") if not _someone_elses(p.name)}
    return found
