"""A cgroup whose usage did not move costs its read and nothing else, and is accounted
later: the histogram, the counts and the peak are still those of accounting every window.

The reference here is the sampler as it was: every window of every series accounted when
it happens (:class:`Eager`). The sampler's clock is the test's, so both see the same
window lengths. Fixture trees stand in for cgroupfs, except in the kernel test, where
the busy processes are stopped while a window is read, so that the test can read the
same counters the sampler read.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import CgroupTree
from unthrottle.agent.discovery import Found
from unthrottle.agent.gating import UsagePass, plan
from unthrottle.agent.sampling import BUCKETS_CORES, Sampler, Series
from unthrottle.agent.settings import AgentSettings
from unthrottle.cgroups import Layout, Version
from unthrottle.cgroups.counters import CounterReader
from unthrottle_lab.children import stop

KEEP_3 = AgentSettings(peak_window_s=0.3)  # a trailing peak of 3 windows: trimming shows


class Clock:
    """The sampler's clock: still within a window, moved by the test between windows."""

    def __init__(self, *, step_ns: int = 0) -> None:
        self.now = 1_000_000_000
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now


@dataclass
class Eager:
    """One series accounted every window, as the sampler did before quiet reads were lazy."""

    demand_us: int
    at_ns: int
    keep: int
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_CORES) + 1))
    total: int = 0
    sum_cores: float = 0.0
    recent: list[float] = field(default_factory=list)

    def window(self, demand_us: int, now_ns: int) -> None:
        demand = max(0, demand_us - self.demand_us) / ((now_ns - self.at_ns) / 1000)
        self.counts[bisect.bisect_left(BUCKETS_CORES, demand)] += 1
        self.total += 1
        self.sum_cores += demand
        self.recent = [*self.recent, demand][-self.keep :]
        self.demand_us, self.at_ns = demand_us, now_ns


def same(series: Series, eager: Eager) -> tuple[object, ...]:
    """What a scrape shows of a series, against the reference (equal when all is well)."""
    return (
        (series.counts, series.total, series.peak, pytest.approx(series.sum_cores, rel=1e-12)),
        (eager.counts, eager.total, max(eager.recent, default=0.0), eager.sum_cores),
    )


class FixtureTree:
    """A v1 tree (cpu and cpuacct together) whose parents' usage is the sum of their
    children's, as the kernel keeps it."""

    def __init__(self, root: Path, paths: list[str]) -> None:
        self.root = root
        (root / "cgroup.procs").write_text("")
        self.layout = Layout(Version.V1_JOINT, root, root)
        self.usage: dict[str, int] = {}
        self.throttled: dict[str, int] = {}
        for path in paths:
            self.add(path)

    def add(self, path: str) -> None:
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            d = self.root / rel
            if not d.exists():
                d.mkdir()
                (d / "cgroup.procs").write_text("")
                (d / "cpu.cfs_quota_us").write_text("-1\n" if depth < len(parts) else "50000\n")
                (d / "cpu.cfs_period_us").write_text("100000\n")
                self.usage.setdefault(rel, 0)
                self.throttled.setdefault(rel, 0)
                self._write(rel)

    def run(self, path: str, usage_ns: int, throttled_ns: int = 0) -> None:
        """The cgroup ran (and was throttled): it and every cgroup above it count it."""
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            self.usage[rel] += usage_ns
            self.throttled[rel] += throttled_ns
            self._write(rel)

    def _write(self, rel: str) -> None:
        d = self.root / rel
        (d / "cpuacct.usage").write_text(f"{self.usage[rel]}\n")
        (d / "cpu.stat").write_text(
            f"nr_periods 0\nnr_throttled 0\nthrottled_time {self.throttled[rel]}\n"
        )

    def demand_us(self, path: str) -> int:
        return (self.usage[path] + self.throttled[path]) // 1000


FLAT = [f"apps/c{i}" for i in range(7)]
NESTED = ["kubepods/poda/c1", "kubepods/poda/c2", "kubepods/podb/c1", "kubepods/podb/c2",
          "kubepods/podc", "kubepods/podc/c1", "kubepods/c9"]  # fmt: skip
# Per window: which cgroups ran, and how much (ns of usage, ns throttled). Windows 3, 8
# and 11 are quiet everywhere; the rest have one or a few cgroups running.
RUNS = [
    {0: (30_000_000, 0), 3: (5_000_000, 0)},
    {0: (60_000_000, 9_000_000)},
    {},
    {1: (2_000_000, 0), 5: (120_000_000, 40_000_000)},
    {5: (1_000_000, 0)},
    {0: (30_000_000, 0), 2: (700_000, 0), 4: (44_000_000, 0)},
    {6: (10_000_000, 0)},
    {},
    {3: (80_000_000, 0), 6: (3_000_000, 0)},
    {1: (50_000_000, 0)},
    {},
    {0: (1_000_000, 0), 2: (90_000_000, 25_000_000)},
]
LENGTHS_MS = [100, 90, 130, 100, 100, 70, 100, 110, 100, 100, 95, 100]


@pytest.mark.parametrize("skip", [True, False], ids=["gated", "every-cgroup-read"])
@pytest.mark.parametrize("paths", [FLAT, NESTED], ids=["flat", "kubelet-like"])
def test_lazy_accounting_gives_the_histogram_of_accounting_every_window(
    tmp_path: Path, paths: list[str], skip: bool
) -> None:
    """Scrapes after windows 4 and 9, a new cgroup and a rediscovery after window 6."""
    first, later = paths[:-1], paths[-1]
    tree = FixtureTree(tmp_path, first)
    clock = Clock()
    known = list(first)
    settings = AgentSettings(peak_window_s=0.3, skip_idle_subtrees=skip)
    sampler = Sampler(tree.layout, lambda _: [Found(p, "", p, "") for p in known], settings,
                      clock=clock)  # fmt: skip
    try:
        sampler.refresh()
        eager = {p: Eager(tree.demand_us(p), clock.now, sampler.keep) for p in known}
        for window, (runs, length_ms) in enumerate(zip(RUNS, LENGTHS_MS, strict=True), 1):
            for index, (usage_ns, throttled_ns) in runs.items():
                if paths[index] in known:
                    tree.run(paths[index], usage_ns, throttled_ns)
            clock.now += length_ms * 1_000_000
            sampler.sample()
            for path, reference in eager.items():
                reference.window(tree.demand_us(path), clock.now)
            if window in (4, 9):
                with sampler.lock:
                    scraped = {s.found.path: s for s in sampler.snapshot()}
                assert set(scraped) == set(eager)
                for path, reference in eager.items():
                    got, want = same(scraped[path], reference)
                    assert got == want, (window, path)
            if window == 6:  # a new container; every pass is rebuilt
                tree.add(later)
                known.append(later)
                sampler.refresh()
                eager[later] = Eager(tree.demand_us(later), clock.now, sampler.keep)
        with sampler.lock:
            scraped = {s.found.path: s for s in sampler.snapshot()}
        for path, reference in eager.items():
            got, want = same(scraped[path], reference)
            assert got == want, path
            assert scraped[path].last_demand_us == reference.demand_us, path
    finally:
        sampler.close()


def test_a_quiet_read_is_dated_by_its_own_read_and_a_skipped_cgroup_by_the_windows_end(
    tmp_path: Path,
) -> None:
    """Where a window of a cgroup that then runs begins: at its quiet read of the window
    before (as when every window was accounted on the spot), or, when a quiet gate above
    spared it the read, at the end of that window."""
    paths = ["apps/a", "apps/b", "other/c", "other/d"]
    tree = FixtureTree(tmp_path, paths)
    clock = Clock(step_ns=1_000_000)  # each reading 1 ms after the one before
    sampler = Sampler(tree.layout, lambda _: [Found(p, "", p, "") for p in paths], KEEP_3,
                      clock=clock)  # fmt: skip
    try:
        sampler.refresh()
        sampler.sample()
        tree.run("apps/a", 10_000_000)
        sampler.sample()  # b is read and quiet; c and d sit below a quiet gate
        b, c = sampler.series["apps/b"], sampler.series["other/c"]
        assert (b.accounted, c.accounted) == (1, 1)  # neither touched yet
        with sampler.lock:
            sampler.snapshot()
        assert (b.total, c.total) == (2, 2)
        assert sampler.window_start_ns < b.last_ns < sampler.last_sample_ns
        assert c.last_ns == sampler.last_sample_ns
        quiet_b, quiet_c = b.last_ns, c.last_ns
        tree.run("apps/b", 30_000_000)
        tree.run("other/c", 30_000_000)
        sampler.sample()
        assert b.sum_cores == pytest.approx(30_000 / ((b.last_ns - quiet_b) / 1000))
        assert c.sum_cores == pytest.approx(30_000 / ((c.last_ns - quiet_c) / 1000))
    finally:
        sampler.close()


def test_a_new_pass_keeps_what_the_last_one_read(tmp_path: Path) -> None:
    """Rediscovery rebuilds the pass: a cgroup it keeps is not taken for one that moved."""
    files = {name: tmp_path / name for name in ("a", "b", "c")}
    for f in files.values():
        f.write_text("100\n")
    fds = {name: os.open(f, os.O_RDONLY) for name, f in files.items()}
    try:
        moved: list[tuple[str, bytes, int]] = []

        def run(pass_: UsagePass[str], stamp: int) -> list[int]:
            return pass_.run(lambda s, data, at: moved.append((s, data, at)), lambda: stamp)

        old_steps = plan({"a": "a", "b": "b"}, {})
        old = UsagePass(old_steps, [fds[s.path] for s in old_steps], size=32)
        assert run(old, 5) == [] and [m[0] for m in moved] == ["a", "b"]  # first read
        assert run(old, 6) == [] and len(moved) == 2  # quiet: read, nothing else
        steps = plan({"a": "a", "b": "b", "c": "c"}, {})
        new = UsagePass(steps, [fds[s.path] for s in steps], size=32, previous=old)
        files["b"].write_text("150\n")
        files["c"].write_text("0\n")  # an empty file is a cgroup gone; this one is new
        assert run(new, 7) == []
        assert moved[2:] == [("b", b"150\n", 6), ("c", b"0\n", 0)]
        assert new.read_ns("a") == 7 and new.read_ns("gone") == 0
        files["a"].write_text("")
        assert run(new, 8) == [0]  # vanished: reported, and the rest still read
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.mark.kernel
@pytest.mark.parametrize("skip", [True, False], ids=["gated", "every-cgroup-read"])
def test_on_real_cgroups_lazy_accounting_gives_the_histogram_of_every_window(
    layout: Layout, skip: bool
) -> None:
    """Real cgroups in a kubelet-like tree; busy processes run between windows and are
    stopped while each window is read, so the test reads what the sampler read."""
    root = f"unthrottle-test-lazy-{os.getpid()}"
    paths = [f"{root}/pa/c1", f"{root}/pa/c2", f"{root}/pb/c1", f"{root}/c4"]
    # windows (1-based) in which each container's process runs
    schedule = {0: {1, 2, 3, 7}, 1: {2, 5}, 2: set(), 3: {8}}
    tree = CgroupTree(layout)
    procs: list[subprocess.Popen[bytes]] = []
    readers: list[CounterReader] = []
    sampler = None
    try:
        for path in (root, f"{root}/pa", f"{root}/pb"):
            tree.make(path)
        cgroups = [tree.make(path) for path in paths]  # no quota: nothing throttles
        for cg in cgroups:
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            procs.append(proc)
            os.kill(proc.pid, signal.SIGSTOP)
            os.waitpid(proc.pid, os.WUNTRACED)
            cg.add_process(proc.pid)
        readers += [CounterReader(layout, path) for path in paths]
        clock = Clock()
        # usage + throttled time, as the reference reads it: the wait is tests/test_agent_*'s
        settings = AgentSettings(peak_window_s=0.3, skip_idle_subtrees=skip, measure_wait=False)
        sampler = Sampler(layout, lambda _: [Found(p, "", p, "") for p in paths], settings,
                          clock=clock)  # fmt: skip
        sampler.refresh()
        eager = [Eager(r.demand(), clock.now, sampler.keep) for r in readers]
        for window in range(1, 11):
            running = [procs[i] for i, windows in schedule.items() if window in windows]
            for proc in running:
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.03)
            for proc in running:
                os.kill(proc.pid, signal.SIGSTOP)
                os.waitpid(proc.pid, os.WUNTRACED)
            time.sleep(0.01)  # its last CPU time charged: the counters hold still now
            clock.now += 100_000_000
            sampler.sample()
            for reader, reference in zip(readers, eager, strict=True):
                reference.window(reader.demand(), clock.now)
            if window == 4:
                with sampler.lock:
                    sampler.snapshot()
            if window == 6:
                sampler.refresh()
        with sampler.lock:
            scraped = {s.found.path: s for s in sampler.snapshot()}
        for path, reference in zip(paths, eager, strict=True):
            got, want = same(scraped[path], reference)
            assert got == want, path
            assert scraped[path].last_demand_us == reference.demand_us, path
        assert eager[0].sum_cores > 0 and eager[2].sum_cores == 0  # it ran; it did not
    finally:
        for reader in readers:
            reader.close()
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            stop(proc)
        if sampler is not None:
            sampler.close()
        tree.cleanup()
