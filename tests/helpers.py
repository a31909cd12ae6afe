"""Small helpers for tests that start processes."""

from __future__ import annotations

from pathlib import Path

from unthrottle.cgroups import Cgroup, Layout
from unthrottle.units import Bandwidth


def worker_pids() -> set[int]:
    """PIDs of every lab worker process running now (found by command line)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"unthrottle/lab/worker.py" in cmdline:
            found.add(int(proc.name))
    return found


def kubepods_levels(root: str, uid: str) -> list[str]:
    """The cgroups from ``root`` down to a burstable pod, nested as by the cgroupfs driver."""
    return [root, f"{root}/kubepods", f"{root}/kubepods/burstable",
            f"{root}/kubepods/burstable/pod{uid}"]  # fmt: skip


class CgroupTree:
    """Real cgroups made for a test, in order, and removed in reverse order."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.made: list[Cgroup] = []

    def make(self, path: str, quota_us: int | None = None) -> Cgroup:
        """Create a cgroup (its parent must exist), with a quota if given."""
        cg = Cgroup(self.layout, path)
        cg.create()
        self.made.append(cg)
        if quota_us is not None:
            cg.write_bandwidth(Bandwidth(quota_us))
        return cg

    def remove(self, cg: Cgroup) -> None:
        """Remove one of them now (a container that went away)."""
        cg.remove()
        self.made.remove(cg)

    def cleanup(self) -> None:
        """Remove every cgroup still here, children first."""
        for cg in reversed(self.made):
            cg.remove()
        self.made.clear()
