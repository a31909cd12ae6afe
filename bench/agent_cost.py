"""What the agent costs: sampling 200 real containers every 100 ms, and rendering a scrape.

    sudo .venv/bin/python bench/agent_cost.py [--layout flat|kubelet|both] [--seconds 10]
                                              [--busy 10] [--repeat 2]

Creates real cgroups below unthrottle-bench-PID (removed at the end), in one of two
layouts:

- ``flat``: 200 containers with a quota side by side (standalone mode);
- ``kubelet``: ``kubepods/burstable/pod<uid>/<id>``, 100 pods × 2 containers, each
  pod with the sum of its containers' quota; named as in Kubernetes mode, so the
  100 pod cgroups are sampled too (300 series).

``--busy`` containers run a process that burns 2 ms every 100 ms (the rest are
idle). The agent's own ``Sampler`` samples them every 100 ms for ``--seconds``,
discovery included, once reading every cgroup each window and once skipping the
subtrees whose usage did not move (``skip_idle_subtrees``), alternately
``--repeat`` times. Reported: this process's CPU time as a share of one core
(goal ≤ 1 %), the sampling and discovery threads' shares of it, and µs per
container per window. Then ``/metrics`` is rendered 50
times for the flat layout (goal ≤ 0.2 ms per container). The machine's other
load (less the busy containers') is printed beside each figure: a shared
machine's figures are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from unthrottle.agent.discovery import Found, discover_kubepods, discover_standalone
from unthrottle.agent.exposition import render
from unthrottle.agent.naming import PodInfo, name_cgroups
from unthrottle.agent.sampling import Sampler
from unthrottle.agent.settings import AgentSettings
from unthrottle.cfs import Bandwidth
from unthrottle.cgroups import Cgroup, Layout, detect_layout
from unthrottle.lab.noise import OtherLoad

BUSY = (
    "import time\n"
    "while True:\n"
    "    end = time.thread_time() + 0.002\n"
    "    while time.thread_time() < end: pass\n"
    "    time.sleep(0.098)\n"
)
Discover = Callable[[frozenset[str]], list[Found]]


class Tree:
    """Cgroups made for the bench, removed in reverse order; busy processes ended by PID."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.made: list[Cgroup] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.running: list[Cgroup] = []

    def make(self, path: str, quota_us: int | None = None) -> Cgroup:
        cg = Cgroup(self.layout, path)
        cg.create()
        self.made.append(cg)
        if quota_us is not None:
            cg.write_bandwidth(Bandwidth(quota_us))
        return cg

    def busy(self, cg: Cgroup) -> None:
        proc = subprocess.Popen([sys.executable, "-c", BUSY])
        self.procs.append(proc)
        self.running.append(cg)
        cg.add_process(proc.pid)

    def running_s(self) -> float:
        """CPU seconds the busy containers have used (they are not reaped while measured,
        so the machine's other load includes them: it is taken out)."""
        return sum(cg.read_stat().usage_us for cg in self.running) / 1e6

    def cleanup(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for cg in reversed(self.made):
            cg.remove()


def flat(tree: Tree, root: str, containers: int, busy: int) -> Discover:
    cgroups = [tree.make(f"{root}/c{i:03d}", 50_000) for i in range(containers)]
    for cg in cgroups[:: max(1, containers // busy)][:busy] if busy else []:
        tree.busy(cg)
    layout = tree.layout
    return lambda known: discover_standalone(layout, root, known)


def kubelet(tree: Tree, root: str, containers: int, busy: int) -> Discover:
    tree.make(f"{root}/kubepods")
    tree.make(f"{root}/kubepods/burstable")
    pods: list[PodInfo] = []
    cgroups: list[Cgroup] = []
    for p in range(containers // 2):
        uid = f"{p:08x}-0000-4000-8000-{p:012x}"
        pod = tree.make(f"{root}/kubepods/burstable/pod{uid}", 100_000)
        ids = {f"{p:06x}{c:02x}" + "0" * 56: f"c{c}" for c in range(2)}
        cgroups += [tree.make(f"{pod.path}/{cid}", 50_000) for cid in ids]
        pods.append(PodInfo("bench", f"pod-{p}", uid, ids))
    for cg in cgroups[:: max(1, len(cgroups) // busy)][:busy] if busy else []:
        tree.busy(cg)
    layout = tree.layout
    return lambda known: name_cgroups(discover_kubepods(layout, root), pods)


@contextlib.contextmanager
def sampling(sampler: Sampler) -> Iterator[list[threading.Thread]]:
    stop = threading.Event()
    threads = sampler.start(stop)
    try:
        yield threads
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU time a running thread has used, s (its schedstat; 0 once it has ended)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9
    except (OSError, ValueError):
        return 0.0


def measure(tree: Tree, discover: Discover, *, skip: bool, seconds: float) -> str:
    sampler = Sampler(tree.layout, discover, AgentSettings(skip_idle_subtrees=skip))
    try:
        sampler.refresh()
        series = len(sampler.series)
        running0 = tree.running_s()
        with OtherLoad() as noise:
            cpu0, wall0, windows0 = time.process_time(), time.monotonic(), sampler.windows
            with sampling(sampler) as threads:
                start = {t.name: thread_cpu_s(t) for t in threads}
                time.sleep(seconds)
                split = {t.name: thread_cpu_s(t) - start[t.name] for t in threads}
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            windows = sampler.windows - windows0
        others = max(0.0, noise.cores - (tree.running_s() - running0) / wall)
    finally:
        sampler.close()
    how = "skipping quiet subtrees" if skip else "reading every cgroup"
    return (
        f"{how:>24}: {series} series, {windows} windows in {wall:.1f} s, CPU {cpu:.3f} s = "
        f"**{100 * cpu / wall:.2f} %** of one core (sampling thread "
        f"{100 * split['sampler'] / wall:.2f} %, "
        f"discovery {100 * split['discovery'] / wall:.2f} %); "
        f"{1e6 * cpu / windows / series:.1f} µs per "
        f"series per window (machine: other processes used {others:.2f} cores on average)"
    )


def scrape_cost(layout: Layout, discover: Discover, containers: int) -> str:
    sampler = Sampler(layout, discover)
    try:
        sampler.refresh()
        sampler.sample()
        with sampler.lock:
            render(sampler.snapshot())  # warm up
            cpu0 = time.process_time()
            for _ in range(50):
                body = render(sampler.snapshot())  # reads every cgroup's counters, as a scrape
            per = (time.process_time() - cpu0) / 50
    finally:
        sampler.close()
    lines = body.count(b"\n")
    return (
        f"rendering /metrics for {containers} containers: {1000 * per:.2f} ms CPU per scrape "
        f"= {1000 * per / containers:.3f} ms per container (goal ≤ 0.2 ms); "
        f"{len(body) // 1024} KiB, {lines} lines"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["flat", "kubelet", "both"], default="both")
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--busy", type=int, default=10, help="containers that run")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    layout = detect_layout()
    builders = {"flat": flat, "kubelet": kubelet}
    for name in ["flat", "kubelet"] if args.layout == "both" else [args.layout]:
        tree = Tree(layout)
        root = f"unthrottle-bench-{os.getpid()}-{name}"
        try:
            tree.make(root)
            discover = builders[name](tree, root, args.containers, args.busy)
            print(f"## {name}: {args.containers} containers, {args.busy} of them running "
                  f"2 ms every 100 ms ({layout.version})", flush=True)  # fmt: skip
            for _ in range(args.repeat):
                for skip in (True, False):
                    print(measure(tree, discover, skip=skip, seconds=args.seconds), flush=True)
            if name == "flat":
                print(scrape_cost(layout, discover, args.containers), flush=True)
        finally:
            tree.cleanup()


if __name__ == "__main__":
    main()
