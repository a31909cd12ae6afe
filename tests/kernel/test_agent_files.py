"""The agent on a node whose containers hold more threads than it may open files
(agent/files.py): root only, real cgroups, the real `unthrottle agent` process.

Each thread whose wait is measured keeps a file open; a container's runtime may give the
agent a soft limit of 1,024 (containerd 2.x under systemd). Before agent/files.py, 20
containers of 16 threads under a limit of 256 files left most containers unexported: the
counters of the cgroups found after the files ran out could not be opened, and discovery
failed on them for good.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CgroupTree
from prom import free_port
from support.agent_kernel import (
    UNTHROTTLE,
    get,
    stop,
    wait_for,
)
from unthrottle.cgroups import Layout

pytestmark = pytest.mark.kernel
CONTAINERS = 20
THREADS = 16
THREADED = (
    "import sys, threading, time\n"
    "def work():\n"
    "    while True:\n"
    "        end = time.thread_time() + 0.00005\n"
    "        while time.thread_time() < end: pass\n"
    "        time.sleep(0.1)\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=work, daemon=True).start()\n"
    "work()\n"
)


@pytest.fixture
def node(layout: Layout) -> Iterator[str]:
    """CONTAINERS cgroups with a quota, each running a process of THREADS threads."""
    tree, procs = CgroupTree(layout), []
    root = f"unthrottle-test-files-{os.getpid()}"
    try:
        tree.make(root)
        for i in range(CONTAINERS):
            cg = tree.make(f"{root}/c{i:02d}", 50_000)
            procs.append(subprocess.Popen([sys.executable, "-c", THREADED, str(THREADS)]))
            cg.add_process(procs[-1].pid)
        yield root
    finally:
        for proc in procs:
            stop(proc)
        tree.cleanup()


def start_agent(root: str, port: int, log: Path, soft: int, hard: int) -> subprocess.Popen[bytes]:
    """The agent under an open-files limit of (soft, hard), as a container runtime sets it:
    a Python that sets the limit, then execs the agent in its place (same PID)."""
    limited = (
        "import os, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))\n"
        "os.execv(sys.argv[3], sys.argv[3:])\n"
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", limited, str(soft), str(hard), str(UNTHROTTLE), "agent",
             "--standalone", "--cgroup-root", root, "--listen", f"127.0.0.1:{port}"],
            stderr=out,
        )  # fmt: skip


def exported(port: int) -> set[str]:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {line.split('pod="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith("unthrottle_cpu_cfs_periods_total{")}  # fmt: skip


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


@pytest.mark.parametrize("soft, hard", [(256, 20_000), (256, 256)], ids=["raised", "held"])
def test_every_container_is_sampled_however_few_files_the_agent_may_open(
    node: str, tmp_path: Path, soft: int, hard: int
) -> None:
    port, log = free_port(), tmp_path / "agent.log"
    agent = start_agent(node, port, log, soft, hard)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", 30, log=log)
        deadline = time.monotonic() + 20
        while len(seen := exported(port)) < CONTAINERS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(seen) == CONTAINERS, (sorted(seen), log.read_text()[-2000:])
        if hard > soft:  # the soft limit is raised to the hard one, as Go programs do
            assert soft_limit(agent.pid) == hard
            assert "soft limit raised from 256 to 20000" in log.read_text()
        else:  # held at 256 files: the waits that do not fit are given up, said once
            assert soft_limit(agent.pid) == 256
            assert len(os.listdir(f"/proc/{agent.pid}/fd")) <= 256
            assert "Too many open files" in log.read_text()
    finally:
        stop(agent)
