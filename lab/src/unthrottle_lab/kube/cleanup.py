"""Making room for a real node on the host, and taking it all away again.

:func:`sweep` removes what a node leaves on the host, from a record of it (a dict, as
:class:`~unthrottle_lab.kube.node.RealNode` writes it): the processes of its pods
and containerd's shims (by PID, found by their cgroups and their executable), the mounts
below its folder and containerd's state, the pods' network namespaces, its cgroups in
every hierarchy, its bridge, the iptables chains kube-proxy and the kubelet made, and the
kernel settings they changed, put back. Every step tolerates what is already gone, so it
can run twice.

The iptables chains: every chain named ``KUBE-*`` in every table, for IPv4 and IPv6, and
the rules of other chains that jump to one (kube-proxy's ``KUBE-SERVICES``,
``KUBE-POSTROUTING``…, the kubelet's ``KUBE-KUBELET-CANARY`` and ``KUBE-IPTABLES-HINT``,
which ``kube-proxy --cleanup`` leaves). They are removed by one ``iptables-restore
--noflush`` per table, from what ``iptables-save`` shows, so another program's rules stay
and a run killed mid-way leaves none of ours for the next node's sweep. One real node
runs per machine at a time, so the ``KUBE-`` chains on it are its own.

``python -m unthrottle_lab.kube.cleanup RECORD`` is the node's guard: it reads the
record, waits until its standard input closes (the node's owner stopped it, or died,
even by SIGKILL), then sweeps and ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "cpu_mount",
    "kill_in_cgroups",
    "kube_chains_removal",
    "make_cgroup_root",
    "read_sysctls",
    "sweep",
    "sweep_iptables",
]

KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")  # fmt: skip
"""What a kubelet sets on start (``setupKernelTunables``, protectKernelDefaults off)."""
NETWORK_SYSCTLS = ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables",
                   "net/ipv4/conf/all/route_localnet", "net/netfilter/nf_conntrack_max",
                   "net/netfilter/nf_conntrack_tcp_timeout_established",
                   "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                   "net/netfilter/nf_conntrack_tcp_be_liberal")  # fmt: skip
"""What the node sets for Service traffic (forwarding, bridged packets through iptables)
and what kube-proxy may set (``route_localnet`` for localhost NodePorts, conntrack's
table size and timeouts; the node asks it to leave each alone), put back after."""
KUBE_CHAIN = "KUBE-"
IPTABLES = ("iptables", "ip6tables")
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
    """The kernel settings the kubelet, kube-proxy and the node change, as they are now."""
    return {name: _read(Path("/proc/sys") / name).strip()
            for name in (*KUBELET_SYSCTLS, *NETWORK_SYSCTLS)
            if (Path("/proc/sys") / name).exists()}  # fmt: skip


_JUMP = re.compile(rf"\s(?:-j|-g|--jump|--goto) {KUBE_CHAIN}")


def kube_chains_removal(saved: str) -> str:
    """An ``iptables-restore --noflush`` script that removes every ``KUBE-*`` chain that
    ``saved`` (``iptables-save``'s output) shows, and the rules of other chains that jump to
    one; empty when there is none. Per table: delete the jumps, flush the chains, then
    delete them (a chain cannot go while a rule refers to it)."""
    script: list[str] = []
    table, jumps, chains = "", list[str](), list[str]()
    for line in saved.splitlines():
        if line.startswith("*"):
            table, jumps, chains = line[1:], [], []
        elif line.startswith(f":{KUBE_CHAIN}"):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A ") and not line.split()[1].startswith(KUBE_CHAIN):
            if _JUMP.search(line):
                jumps.append(f"-D {line[3:]}")
        elif line == "COMMIT" and (jumps or chains):
            script += [f"*{table}", *jumps, *(f"-F {c}" for c in chains),
                       *(f"-X {c}" for c in chains), "COMMIT"]  # fmt: skip
    return "\n".join(script) + "\n" if script else ""


def sweep_iptables() -> list[str]:
    """Remove the ``KUBE-*`` chains (see the module docstring) for IPv4 and IPv6; the
    tables of each family that still hold one after (none when all went well)."""
    left = []
    for tool in IPTABLES:
        save, restore = shutil.which(f"{tool}-save"), shutil.which(f"{tool}-restore")
        if save is None or restore is None:
            continue  # no iptables, no rules of ours
        saved = subprocess.run([save], capture_output=True, text=True, check=False).stdout
        script = kube_chains_removal(saved)
        if script:
            subprocess.run([restore, "-w", "--noflush"], input=script, capture_output=True,
                           text=True, check=False)  # fmt: skip
            again = subprocess.run([save], capture_output=True, text=True, check=False).stdout
            left += [f"{tool} {line[1:]}" for line in kube_chains_removal(again).splitlines()
                     if line.startswith("*")]  # fmt: skip
    return left


def sweep(record: dict[str, Any]) -> None:
    """Remove everything the record's node left on the host (see the module docstring)."""
    parent, shim = record["cgroup_parent"], record["shim"]
    folder = Path(record["folder"]) if record.get("folder") else None
    state = Path(record["containerd_state"])
    proxy = [record["kube_proxy"]] if record.get("kube_proxy") else []
    for pid in [p for exe in (shim, *proxy) for p in _pids_of(exe)]:
        # A shim outlives containerd by design; kube-proxy would write its rules again.
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
    sweep_iptables()
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
