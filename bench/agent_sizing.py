"""The agent's requests and memory limit: the real `unthrottle agent` process on a node whose
containers all run, with many threads each.

    sudo .venv/bin/python bench/agent_sizing.py [--containers 200] [--threads 1 16]
                                                [--seconds 30] [--scrape-every 5]
                                                [--save bench/results/agent-sizing.json]

``bench/agent_cost.py`` measures the sampler in-process with 10 of 200 containers busy,
one thread each. What a request and a memory limit must cover is the worst node: every
container running in every window (no quiet subtree to skip) and every thread's wait read
(a ``pread`` of ``/proc/<tid>/schedstat`` per thread that ran). So this bench makes
``--containers`` real cgroups with a quota below ``unthrottle-bench-PID`` (removed at the
end), each running a process of ``--threads`` threads (one run per number given) that
each wake every 100 ms and burn 10 µs, so that every container and every thread has run in
every window. It starts the real agent (``unthrottle agent --standalone``: the same
sampler, the HTTP server, the wait on), scrapes ``/metrics`` every ``--scrape-every``
seconds as a tight Prometheus would, and reads from ``/proc/<agent pid>``: its CPU over
``--seconds`` (``stat`` utime + stime), its resident memory at the end and at its peak
(``status`` VmRSS, VmHWM), its threads and open files. The machine's other load is
printed beside it (the busy containers are most of it: 200 × 16 threads is 32,000 wake-ups
a second on 2 cores, so the agent's own windows compete for the CPU as on a full node).

docs/install.md and docs/benchmarks.md §5 quote the results; the chart's
``agent.resources`` are sized from them (docs/install.md, "Resources").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from unthrottle.cgroups import Cgroup, Layout, detect_layout
from unthrottle.units import Bandwidth
from unthrottle_lab.noise import OtherLoad

AGENT = Path(sys.executable).with_name("unthrottle")
BUSY = (
    "import sys, threading, time\n"
    "def work():\n"
    "    while True:\n"
    "        end = time.thread_time() + 0.00001\n"
    "        while time.thread_time() < end: pass\n"
    "        time.sleep(0.1)\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=work, daemon=True).start()\n"
    "work()\n"
)
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads of a process."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


class Node:
    """The bench's cgroups and busy processes, removed and ended (by PID) at the end."""

    def __init__(self, layout: Layout, root: str) -> None:
        self.layout, self.root = layout, root
        self.made: list[Cgroup] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def make(self, path: str, quota_us: int | None = None) -> Cgroup:
        cg = Cgroup(self.layout, path)
        cg.create()
        self.made.append(cg)
        if quota_us is not None:
            cg.write_bandwidth(Bandwidth(quota_us))
        return cg

    def fill(self, containers: int, threads: int) -> None:
        self.make(self.root)
        for i in range(containers):
            cg = self.make(f"{self.root}/c{i:03d}", 50_000)
            proc = subprocess.Popen([sys.executable, "-c", BUSY, str(threads)])
            self.procs.append(proc)
            cg.add_process(proc.pid)

    def threads(self) -> int:
        return sum(len(os.listdir(f"/proc/{p.pid}/task")) for p in self.procs)

    def cleanup(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()
        for cg in reversed(self.made):
            cg.remove()
        self.made.clear()


def one_run(layout: Layout, containers: int, threads: int, seconds: float,
            scrape_every: float) -> dict[str, Any]:  # fmt: skip
    node = Node(layout, f"unthrottle-bench-{os.getpid()}")
    port = free_port()
    agent: subprocess.Popen[bytes] | None = None
    try:
        node.fill(containers, threads)
        time.sleep(1.0)  # every thread started
        agent = subprocess.Popen(
            [str(AGENT), "agent", "--standalone", "--cgroup-root", node.root,
             "--listen", f"127.0.0.1:{port}"],
            stderr=open(os.environ.get("AGENT_LOG", os.devnull), "ab"),  # noqa: SIM115
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        while True:  # the first discovery and windows
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    body = answer.read()
                if body.count(b"unthrottle_cpu_cfs_periods_total{") >= containers:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not export every container within 60 s")
            time.sleep(0.5)
        time.sleep(3.0)  # settled: its first windows of every thread
        scrapes, kib = 0, 0
        with OtherLoad() as noise:
            cpu0, wall0 = proc_cpu_s(agent.pid), time.monotonic()
            while time.monotonic() - wall0 < seconds:
                time.sleep(scrape_every)
                with urllib.request.urlopen(url, timeout=10) as answer:
                    kib = len(answer.read()) // 1024
                scrapes += 1
            cpu, wall = proc_cpu_s(agent.pid) - cpu0, time.monotonic() - wall0
        status = proc_status(agent.pid)
        fds = len(os.listdir(f"/proc/{agent.pid}/fd"))
        node_threads = node.threads()
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        node.cleanup()
    return {
        "containers": containers,
        "threads_per_container": threads,
        "threads_on_node": node_threads,
        "wall_s": round(wall, 1),
        "scrapes": scrapes,
        "scrape_kib": kib,
        "cpu_s": round(cpu, 3),
        "millicores": round(1000 * cpu / wall, 1),
        "rss_mib": round(status["VmRSS"] / 1024, 1),
        "peak_rss_mib": round(status["VmHWM"] / 1024, 1),
        "agent_threads": status["Threads"],
        "open_files": fds,
        "machine_load_cores": round(noise.cores, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--scrape-every", type=float, default=5.0)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: it makes cgroups")
    layout = detect_layout()
    runs = []
    for threads in args.threads:
        run = one_run(layout, args.containers, threads, args.seconds, args.scrape_every)
        print(f"{run['containers']} containers × {threads} threads ({run['threads_on_node']} "
              f"on the node), all running: agent {run['millicores']:.1f}m CPU over "
              f"{run['wall_s']} s ({run['scrapes']} scrapes of {run['scrape_kib']} KiB), "
              f"RSS {run['rss_mib']} MiB (peak {run['peak_rss_mib']}), "
              f"{run['agent_threads']} threads, {run['open_files']} open files; "
              f"the machine's other load {run['machine_load_cores']:.2f} cores")  # fmt: skip
        runs.append(run)
    if args.save:
        command = ("sudo .venv/bin/python bench/agent_sizing.py --containers "
                   f"{args.containers} --threads {' '.join(map(str, args.threads))} "
                   f"--seconds {args.seconds:g} --scrape-every {args.scrape_every:g} "
                   f"--save {args.save}")  # fmt: skip
        result = {"measured": time.strftime("%Y-%m-%d"), "command": command,
                  "cpus": os.cpu_count(), "runs": runs}  # fmt: skip
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
