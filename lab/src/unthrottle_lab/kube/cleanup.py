"""Making room for a real node on the host, and taking it all away again.

:func:`sweep` removes what a node leaves on the host, from a record of it (a dict, as
:class:`~unthrottle_lab.kube.node.RealNode` writes it): the processes of its pods
and containerd's shims (by PID, found by their cgroups and their executable), the mounts
below its folder and containerd's state, the pods' network namespaces, its cgroups in
every hierarchy, its bridge, and the kernel settings the kubelet changed, put back.
Every step tolerates what is already gone, so it can run twice.

``python -m unthrottle_lab.kube.cleanup RECORD`` is the node's guard: it reads the
record, waits until its standard input closes (the node's owner stopped it, or died,
even by SIGKILL), then sweeps and ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["cpu_mount", "kill_in_cgroups", "make_cgroup_root", "read_sysctls", "sweep"]

KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")  # fmt: skip
"""What a kubelet sets on start (``setupKernelTunables``, protectKernelDefaults off)."""
NETNS = Path("/run/netns")
_MNT_DETACH = 2
_LIBC = ctypes.CDLL(None, use_errno=True)


def _cgroup_mounts() -> list[Path]:
    """Each cgroup hierarchy's mount point (v1 controllers, named ones and v2)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in {"cgroup", "cgroup2"}:
            mounts.append(Path(left.split()[4]))
    return mounts


def cpu_mount() -> Path:
    """The mount of the hierarchy with the CPU controller."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        kind, _, options = right.split()[:3]
        if kind == "cgroup" and "cpu" in options.split(","):
            return Path(left.split()[4])
        if (
            kind == "cgroup2"
            and "cpu" in _read(Path(left.split()[4]) / "cgroup.controllers").split()
        ):
            return Path(left.split()[4])
    raise RuntimeError("no cgroup hierarchy with the cpu controller is mounted")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def make_cgroup_root(parent: str) -> None:
    """``/<parent>`` in every hierarchy: the kubelet checks its cgroup root exists. A v1
    cpuset child starts with no CPUs and no memory nodes: give it its parent's."""
    for mount in _cgroup_mounts():
        here = mount / parent
        here.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (mount / name).exists() and not _read(here / name).strip():
                (here / name).write_text(_read(mount / name))


def _cgroups_below(parent: str) -> list[Path]:
    """Every cgroup folder below ``/<parent>`` in every hierarchy, deepest first."""
    found = []
    for mount in _cgroup_mounts():
        top = mount / parent
        if top.is_dir():
            found += [Path(root) for root, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def kill_in_cgroups(parent: str, *, timeout_s: float = 20.0) -> int:
    """SIGKILL every process in a cgroup below ``/<parent>``, until none is left; how many."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = {int(p) for c in _cgroups_below(parent) for p in _read(c / "cgroup.procs").split()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    return len(killed)


def _pids_of(executable: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "exe") == executable:
                    pids.append(int(entry.name))
    return pids


def _mounts_below(*roots: Path) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
            points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _unmount(points: list[str]) -> None:
    for point in points:
        _LIBC.umount2(point.encode(), _MNT_DETACH)


def read_sysctls() -> dict[str, str]:
    """The kernel settings the kubelet changes, as they are now."""
    return {name: _read(Path("/proc/sys") / name).strip() for name in KUBELET_SYSCTLS
            if (Path("/proc/sys") / name).exists()}  # fmt: skip


def sweep(record: dict[str, Any]) -> None:
    """Remove everything the record's node left on the host (see the module docstring)."""
    parent, shim = record["cgroup_parent"], record["shim"]
    folder = Path(record["folder"]) if record.get("folder") else None
    state = Path(record["containerd_state"])
    for pid in _pids_of(shim):  # a shim outlives containerd by design
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    kill_in_cgroups(parent)
    roots = [state, *([folder] if folder else [])]
    netns = [
        NETNS / p for p in (os.listdir(NETNS) if NETNS.is_dir() else ()) if p.startswith("cni-")
    ]
    _unmount(_mounts_below(*roots, *netns))
    for path in netns:
        with contextlib.suppress(OSError):
            path.unlink()
    for _ in range(50):  # a killed process leaves its cgroup a moment later
        left = [c for c in _cgroups_below(parent) if c.exists()]
        for cgroup in left:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        if not [c for c in left if c.exists()]:
            break
        time.sleep(0.1)
    subprocess.run(["ip", "link", "del", record["bridge"]], capture_output=True, check=False)
    for root in roots:
        _unmount(_mounts_below(root))
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], capture_output=True,
                       check=False)  # fmt: skip
    for name, value in (record.get("sysctls") or {}).items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value)


def main(argv: list[str]) -> int:
    record = json.loads(Path(argv[0]).read_text())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the guard outlives its owner's Ctrl-C
    sys.stdin.buffer.read()  # until the owner closes it or dies
    sweep(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
