"""What the agent costs: sampling 200 real containers every 100 ms, and rendering a scrape.

    sudo .venv/bin/python bench/agent_cost.py [--layout flat|kubelet|both] [--seconds 10]
                                              [--busy 10 0] [--repeat 2] [--wait on off]
                                              [--save bench/results/agent-cost.json]

Creates real cgroups below unthrottle-bench-PID (removed at the end), in one of two
layouts:

- ``flat``: 200 containers with a quota side by side (standalone mode);
- ``kubelet``: ``kubepods/burstable/pod<uid>/<id>``, 100 pods × 2 containers, each
  pod with the sum of its containers' quota; named as in Kubernetes mode, so the
  100 pod cgroups are sampled too (300 series).

``--busy`` containers (one run per number given) run a process that burns 2 ms
every 100 ms (the rest are idle). The agent's own ``Sampler`` samples them every
100 ms for ``--seconds``, discovery included, once reading every cgroup each window
and once skipping the subtrees whose usage did not move (``skip_idle_subtrees``), each
with and without the threads' wait (``measure_wait``; ``--wait`` picks), alternately
``--repeat`` times. Reported: this process's CPU time as a share of one
core (goal ≤ 1 %), the sampling and discovery threads' shares of it, the sampling
thread's CPU per window, and µs per series per window. Then ``/metrics`` is rendered
50 times for the flat layout (goal ≤ 0.2 ms per container). The machine's other load
(less the busy containers') is printed beside each figure: a shared machine's
figures are noisy. ``--save`` writes every figure, the options and the machine's
load to a JSON file (docs/benchmarks.md §5 quotes it).

The busy containers have one thread each; the wait costs a ``pread`` per thread of a
container that ran. So the cost of reading one thread's wait, and of re-reading a
container's thread list, is measured apart on a container of ``--threads`` threads.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unthrottle.agent.discovery import Found, discover_kubepods, discover_standalone
from unthrottle.agent.exposition import render
from unthrottle.agent.naming import PodInfo, name_cgroups
from unthrottle.agent.sampling import Sampler
from unthrottle.agent.settings import AgentSettings
from unthrottle.cgroups import Cgroup, Layout, detect_layout
from unthrottle.cgroups.waits import WaitReader
from unthrottle.units import Bandwidth
from unthrottle_lab.noise import OtherLoad

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


def measure(
    tree: Tree, discover: Discover, *, skip: bool, wait: bool, seconds: float
) -> dict[str, Any]:
    settings = AgentSettings(skip_idle_subtrees=skip, measure_wait=wait)
    sampler = Sampler(tree.layout, discover, settings)
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
    return {
        "skip_quiet_subtrees": skip,
        "measure_wait": wait,
        "series": series,
        "windows": windows,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 4),
        "core_pct": round(100 * cpu / wall, 2),
        "sampling_thread_pct": round(100 * split["sampler"] / wall, 2),
        "discovery_thread_pct": round(100 * split["discovery"] / wall, 2),
        "sampling_thread_ms_per_window": round(1000 * split["sampler"] / windows, 3),
        "us_per_series_per_window": round(1e6 * cpu / windows / series, 1),
        "other_load_cores": round(others, 2),
    }


def describe(m: dict[str, Any]) -> str:
    how = "skipping quiet subtrees" if m["skip_quiet_subtrees"] else "reading every cgroup"
    how += ", with the wait" if m["measure_wait"] else ", without the wait"
    return (
        f"{how:>42}: {m['series']} series, {m['windows']} windows in {m['wall_s']:.1f} s, "
        f"CPU {m['cpu_s']:.3f} s = **{m['core_pct']:.2f} %** of one core (sampling thread "
        f"{m['sampling_thread_pct']:.2f} %, {m['sampling_thread_ms_per_window']:.2f} ms a window; "
        f"discovery {m['discovery_thread_pct']:.2f} %); "
        f"{m['us_per_series_per_window']:.1f} µs per series per window "
        f"(machine: other processes used {m['other_load_cores']:.2f} cores on average)"
    )


def scrape_cost(layout: Layout, discover: Discover, containers: int) -> dict[str, Any]:
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
    return {
        "containers": containers,
        "ms_per_scrape": round(1000 * per, 2),
        "ms_per_container": round(1000 * per / containers, 4),
        "kib": len(body) // 1024,
        "lines": body.count(b"\n"),
    }


THREADS = (
    "import sys, threading, time\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "time.sleep(3600)\n"
)


def wait_read_cost(layout: Layout, root: str, threads: int, reads: int = 200) -> dict[str, Any]:
    """CPU per thread of one wait read (a ``pread`` per thread), and of re-reading the
    thread list (the ``tasks`` file, then an open per new thread), on a container of
    ``threads`` threads."""
    tree = Tree(layout)
    try:
        tree.make(root)
        cg = tree.make(f"{root}/threads")
        proc = subprocess.Popen([sys.executable, "-c", THREADS, str(threads)])
        tree.procs.append(proc)
        cg.add_process(proc.pid)
        while len((layout.cpu_root / cg.path / "tasks").read_text().split()) < threads:
            time.sleep(0.05)
        waits = WaitReader(layout, cg.path, refresh_ns=10**15)
        try:
            waits.read()
            cpu0 = time.process_time()
            for _ in range(reads):
                waits.read(100_000_000)
            read_s = (time.process_time() - cpu0) / reads
            cpu0 = time.process_time()
            for _ in range(reads // 10):
                waits.close()
                waits.read()  # the list, and an open per thread
            list_s = (time.process_time() - cpu0) / (reads // 10)
            seen = waits.threads
        finally:
            waits.close()
    finally:
        tree.cleanup()
    return {
        "threads": seen,
        "us_per_read": round(1e6 * read_s, 1),
        "us_per_thread_per_read": round(1e6 * read_s / seen, 2),
        "us_per_list_and_open": round(1e6 * list_s, 1),
    }


def lab_cgroups() -> list[str]:
    """The other engineer's kernel lab parks every other process in an idle-priority
    cgroup while it runs (``unthrottle-lab-others-…``), and runs its workloads in
    ``unthrottle-lab-…``: a figure taken beside either is not comparable."""
    return sorted(glob.glob("/sys/fs/cgroup/cpu/unthrottle-lab-*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["flat", "kubelet", "both"], default="both")
    parser.add_argument("--containers", type=int, default=200)
    parser.add_argument("--busy", type=int, nargs="+", default=[10],
                        help="containers that run (one run of each layout per number)")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--wait",
        choices=["on", "off"],
        nargs="+",
        default=["on", "off"],
        help="measure with the threads' wait read, without, or both",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=100,
        help="threads of the container whose wait read is timed apart",
    )
    parser.add_argument("--save", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args()
    layout = detect_layout()
    builders = {"flat": flat, "kubelet": kubelet}
    result: dict[str, Any] = {
        "measured": time.strftime("%Y-%m-%d"),
        "command": " ".join(["bench/agent_cost.py", *sys.argv[1:]]),
        "options": {k: v for k, v in vars(args).items() if k != "save"},
        "cgroup": layout.version,
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "lab_cgroups_seen": lab_cgroups(),
        "runs": [],
        "scrape": None,
        "wait_read": None,
    }
    for busy in args.busy:
        for name in ["flat", "kubelet"] if args.layout == "both" else [args.layout]:
            tree = Tree(layout)
            root = f"unthrottle-bench-{os.getpid()}-{name}"
            try:
                tree.make(root)
                discover = builders[name](tree, root, args.containers, busy)
                print(f"## {name}: {args.containers} containers, {busy} of them running "
                      f"2 ms every 100 ms ({layout.version})", flush=True)  # fmt: skip
                for _ in range(args.repeat):
                    for skip, wait in itertools.product((True, False), args.wait):
                        m = measure(tree, discover, skip=skip, wait=wait == "on",
                                    seconds=args.seconds)  # fmt: skip
                        result["runs"].append({"layout": name, "busy": busy, **m})
                        print(describe(m), flush=True)
                        result["lab_cgroups_seen"] = sorted({*result["lab_cgroups_seen"],
                                                             *lab_cgroups()})  # fmt: skip
                if name == "flat" and result["scrape"] is None:
                    scrape = scrape_cost(layout, discover, args.containers)
                    result["scrape"] = scrape
                    print(f"rendering /metrics for {args.containers} containers: "
                          f"{scrape['ms_per_scrape']:.2f} ms CPU per scrape = "
                          f"{scrape['ms_per_container']:.3f} ms per container (goal ≤ 0.2 ms); "
                          f"{scrape['kib']} KiB, {scrape['lines']} lines", flush=True)  # fmt: skip
            finally:
                tree.cleanup()
    if "on" in args.wait:
        cost = wait_read_cost(layout, f"unthrottle-bench-{os.getpid()}-threads", args.threads)
        result["wait_read"] = cost
        print(
            f"reading the wait of {cost['threads']} threads: {cost['us_per_read']:.1f} µs "
            f"CPU = {cost['us_per_thread_per_read']:.2f} µs per thread; re-reading the "
            f"list and opening each: {cost['us_per_list_and_open']:.0f} µs",
            flush=True,
        )
        result["lab_cgroups_seen"] = sorted({*result["lab_cgroups_seen"], *lab_cgroups()})
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if result["lab_cgroups_seen"]:
        print(f"the kernel lab ran beside this bench ({result['lab_cgroups_seen']}): "
              "run it again for figures to quote", file=sys.stderr)  # fmt: skip
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
