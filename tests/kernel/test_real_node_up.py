"""``python -m unthrottle_lab.kube up DIR --nodes 0 --kubelet``: a cluster of one real
node, as a user starts it, described in ``DIR/kubelet.json``; and after a SIGKILL of
``up`` nothing of the node is left on the host (its guard sweeps it away), kube-proxy's
and the kubelet's iptables chains included."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from unthrottle_lab.kube import BuildError, ensure_built, ensure_node_built
from unthrottle_lab.kube.cleanup import kube_chains_removal
from unthrottle_lab.kube.node import BRIDGE, CONTAINERD_STATE

pytestmark = pytest.mark.kernel


def _kube_chains() -> list[str]:
    """The ``KUBE-*`` iptables chains on the host, as ``iptables TABLE/CHAIN``."""
    found = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save"):
            saved = subprocess.run([f"{tool}-save"], capture_output=True, text=True,
                                   check=False).stdout  # fmt: skip
            table = ""
            for line in saved.splitlines():
                table = line[1:] if line.startswith("*") else table
                if line.startswith(":KUBE-"):
                    found.append(f"{tool} {table}/{line[1:].split()[0]}")
    return found


def _left(info: dict[str, str], node_dir: Path, binaries: Path) -> list[str]:
    """What of the node is still on the host."""
    left = []
    if Path(info["cgroup_root"]).exists():
        left.append(f"cgroup {info['cgroup_root']}")
    shown = subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False)
    if shown.returncode == 0:
        left.append(f"bridge {BRIDGE}")
    mounts = Path("/proc/self/mountinfo").read_text()
    for root in (node_dir, CONTAINERD_STATE):
        if f" {root}/" in mounts or f" {root} " in mounts:
            left.append(f"mounts below {root}")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                exe = os.readlink(entry / "exe")
            except OSError:
                continue
            if exe.startswith(str(binaries)) or Path(exe).name in {"kubelet", "kube-proxy"}:
                left.append(f"process {entry.name} ({exe})")
    return left + _kube_chains()


def test_up_starts_a_real_node_and_a_sigkill_of_it_leaves_nothing(tmp_path: Path) -> None:
    try:
        ensure_built()
        binaries = ensure_node_built().folder
    except BuildError as error:
        pytest.skip(f"missing: the real node cannot be built: {error}")
    info: dict[str, str] = {}
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "unthrottle_lab.kube", "up", str(tmp_path / "k"),
         "--nodes", "0", "--kubelet"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        line = up.stdout.readline()  # after the node is Ready (or empty: up failed)
        assert line.startswith("ready "), (tmp_path / "up.log").read_text()[-3000:]
        info = json.loads((tmp_path / "k" / "kubelet.json").read_text())
        assert set(info) >= {"node", "endpoint", "cgroup_root", "images"}
        assert (Path(info["cgroup_root"]) / "kubepods").is_dir()
        # The admin's client certificate may read the kubelet's cAdvisor.
        pki = tmp_path / "k" / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        with urllib.request.urlopen(info["endpoint"] + "/metrics/cadvisor", context=context,
                                    timeout=10) as reply:  # fmt: skip
            assert b"container_cpu_usage_seconds_total" in reply.read()
        assert len(_left(info, tmp_path / "k" / "node", binaries)) >= 4  # it is all there
        assert "iptables nat/KUBE-SERVICES" in _kube_chains()  # kube-proxy's
    finally:
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=30)
        log.close()
    assert info, "up never got ready"
    deadline = time.monotonic() + 60
    while (left := _left(info, tmp_path / "k" / "node", binaries)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def test_the_sweep_removes_kube_chains_and_the_jumps_to_them_and_nothing_else() -> None:
    saved = """*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:OTHER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-NPX46M4PTMTKRN6Y
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
COMMIT
"""
    assert kube_chains_removal(saved).splitlines() == [
        "*nat",
        '-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        "-F KUBE-SERVICES",
        "-X KUBE-SERVICES",
        "COMMIT",
    ]
    assert kube_chains_removal(saved.replace("KUBE-", "MINE-")) == ""
