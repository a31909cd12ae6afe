"""Keep the rest of the machine out of a lab run: its processes at idle priority meanwhile.

A lab run is a physical measurement on a small machine. Beside one CPU hog on 2
cores, an unlimited open pool measured p95 39 ms instead of 15 ms, and a serial
task at 0.25 CPU was throttled in 0 % of its periods instead of 13–22 % (it got
half a core, so it never used its quota): what was measured was the hog, not
CFS bandwidth control.

``isolate`` does what ``cset shield`` does for CPUs, with the scheduler's idle
class instead: every user process in the root cgroup of the CPU hierarchy is
moved, for the span of the run, into a cgroup with ``cpu.idle`` 1 (Linux ≥ 5.15,
v1 and v2). The kernel then runs a waking lab worker at once on a CPU where only
idle-class work runs, and places it there as on an idle CPU; the other processes
get what the lab leaves. Afterwards they are moved back and the cgroup removed,
also on errors. Isolated beside two hogs, the open pool measured p95 15–20 ms
(docs/benchmarks.md §3, bench/results/open-pool-load.json) and the burst seed's serial
task was throttled in 13–18 % of its periods.

What it leaves alone: this process (the lab's dispatcher; its workers are in the
run's cgroup) and every process it started (a test's agent or Prometheus, which
measure beside the lab), kernel threads, and processes in other cgroups (containers,
systemd slices), which keep their weight: on a host where everything lives in
slices it moves little, and says how many it moved. A cgroup left behind by a
lab that was killed (SIGKILL) is emptied back into the root and removed by the
next isolated run.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType

from unthrottle.cgroups import Layout, Version

PREFIX = "unthrottle-lab-others-"
PF_KTHREAD = 0x00200000
"""``/proc/PID/stat`` flags bit of a kernel thread (include/linux/sched.h)."""
MOVE_PASSES = 5
"""Passes over a cgroup's processes when moving them: processes fork meanwhile."""


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name (state first); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _is_kernel_thread(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or bool(int(fields[6]) & PF_KTHREAD)


def _descends_from(pid: int, ancestor: int) -> bool:
    """True for ``ancestor`` itself and every process it started, and theirs."""
    for _ in range(64):  # deeper than any real tree; a loop guard
        if pid == ancestor:
            return True
        fields = _stat(pid)
        if fields is None or int(fields[1]) <= 1:
            return False
        pid = int(fields[1])
    return False


def _pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _move(pid: int, to: Path) -> bool:
    """Move one process; False when it is gone or may not move (EINVAL, EBUSY…)."""
    try:
        (to / "cgroup.procs").write_text(str(pid))
    except OSError:
        return False
    return True


def _empty_into(source: Path, root: Path) -> None:
    """Move every process of ``source`` back into ``root``, then remove ``source``."""
    for _ in range(MOVE_PASSES):
        pids = _pids(source)
        if not pids:
            break
        for pid in pids:
            _move(pid, root)
    with contextlib.suppress(OSError):
        source.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned(root: Path, prefix: str) -> list[Path]:
    """The cgroups below ``root`` named ``prefix`` + a PID (and ``-…`` after it) whose
    process is gone: what a lab killed outright (SIGKILL) left behind."""
    found = []
    for cgroup in root.glob(f"{prefix}*"):
        owner = cgroup.name.removeprefix(prefix).split("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            found.append(cgroup)
    return found


class Isolation:
    """A context manager: the root cgroup's other processes at idle priority meanwhile.

    ``moved`` is how many processes it moved; ``refused`` why nothing could be (no
    ``cpu.idle`` on this kernel, say), empty when it worked.
    """

    def __init__(self, layout: Layout) -> None:
        self.root = layout.cpu_root
        self.v2 = layout.version is Version.V2
        self.cgroup = self.root / f"{PREFIX}{os.getpid()}"
        self.moved = 0
        self.refused = ""

    def __enter__(self) -> Isolation:
        self._reclaim_stale()
        try:
            if self.v2:  # cpu.idle exists in a child only with cpu enabled below the root
                (self.root / "cgroup.subtree_control").write_text("+cpu")
            self.cgroup.mkdir(exist_ok=True)
            (self.cgroup / "cpu.idle").write_text("1")
        except OSError as error:
            self.refused = f"{self.cgroup / 'cpu.idle'}: {error.strerror or error}"
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
            return self
        me = os.getpid()
        for _ in range(2):  # a second pass catches what forked during the first
            for pid in _pids(self.root):
                if _is_kernel_thread(pid) or _descends_from(pid, me):
                    continue
                self.moved += _move(pid, self.cgroup)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.refused:
            _empty_into(self.cgroup, self.root)

    def _reclaim_stale(self) -> None:
        """Empty and remove the cgroups of isolations whose lab is dead."""
        for stale in orphaned(self.root, PREFIX):
            _empty_into(stale, self.root)

    def describe(self) -> str:
        """``other processes kept at idle priority (12 moved)``, or why they were not."""
        if self.refused:
            return f"other processes not isolated: {self.refused}"
        return f"other processes kept at idle priority ({self.moved} moved)"
