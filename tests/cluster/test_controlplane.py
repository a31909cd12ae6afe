"""`python -m unthrottle_lab.kube up DIR`: the command other checks start a control
plane with. It prints ``ready DIR/kubeconfig`` once every component is ready, puts the
binaries it runs in ``DIR/bin``, and on SIGTERM or SIGINT ends what it started and removes
what it wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from unthrottle_lab.kube import BINARIES, ControlPlane, ensure_built


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for task in Path("/proc").glob("[0-9]*"):
        try:
            if int(task.joinpath("stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(task.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_is_ready_with_a_kubeconfig_and_kubectl_and_leaves_nothing_behind(
    tmp_path: Path, control_plane: ControlPlane, sig: signal.Signals
) -> None:
    folder = tmp_path / "cluster"
    proc = subprocess.Popen([sys.executable, "-m", "unthrottle_lab.kube", "up",
                             str(folder), "--nodes", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # blocks until ready (or the command ends)
        assert line == f"ready {folder / 'kubeconfig'}", proc.stderr.read() if proc.stderr else ""
        assert {p.name for p in (folder / "bin").iterdir()} == set(BINARIES)
        env = {**os.environ, "KUBECONFIG": str(folder / "kubeconfig")}
        nodes = subprocess.run([str(folder / "bin" / "kubectl"), "get", "nodes", "-o", "json"],
                               capture_output=True, text=True, env=env, timeout=60,
                               check=True)  # fmt: skip
        items = json.loads(nodes.stdout)["items"]
        assert len(items) == 2
        assert all(any(c["type"] == "Ready" and c["status"] == "True"
                       for c in n["status"]["conditions"]) for n in items)  # fmt: skip
        components = _children(proc.pid)
        assert len(components) == 5  # etcd, apiserver, controller-manager, scheduler, kwok
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in components) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in components if _alive(pid)]
        assert list(folder.iterdir()) == []  # kubeconfig, bin, pki, etcd and logs removed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_binaries_report_the_pinned_release(control_plane: ControlPlane) -> None:
    built = ensure_built()
    assert built.folder == control_plane.binaries.folder  # cached: built once per inputs
    version = subprocess.run([str(built.path("kubectl")), "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    assert json.loads(version.stdout)["clientVersion"]["gitVersion"] == control_plane.version
    status, info = control_plane.request("GET", "/version")
    assert status == 200 and info["gitVersion"] == control_plane.version
    major, minor = map(int, control_plane.version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (1, 35)  # in-place pod resize is GA from 1.35
