"""The sampler: windows keep their length whatever discovery does, /healthz says what is
wrong, quiet subtrees are not read, and a cgroup without the cpu controller reads as usage.

Fixture trees stand in for cgroupfs (laid out as the kernel lays them out), except where
a test says it is a kernel test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import CgroupTree
from unthrottle.agent.discovery import Found, NotFound, discover_standalone
from unthrottle.agent.gating import gate_paths, plan
from unthrottle.agent.sampling import Sampler
from unthrottle.agent.server import make_server
from unthrottle.agent.settings import AgentSettings, InvalidAgentSettings
from unthrottle.cgroups import Cgroup, Layout, Version
from unthrottle.units import Bandwidth

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
FAST = AgentSettings(period_ns=20_000_000, refresh_s=0.05)


def v1_cgroup(root: Path, rel: str, *, usage_ns: int = 0, quota: int = 50_000) -> Path:
    """A cgroup directory of a v1 tree with cpu and cpuacct together."""
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").write_text("")
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    (d / "cpuacct.usage").write_text(f"{usage_ns}\n")
    (d / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    return d


def v1_tree(root: Path) -> Layout:
    (root / "cgroup.procs").write_text("")
    return Layout(Version.V1_JOINT, root, root)


def found(*paths: str) -> list[Found]:
    return [Found(p, "", p, "") for p in paths]


@pytest.fixture
def sampler_of() -> Iterator[list[Sampler]]:
    made: list[Sampler] = []
    yield made
    for sampler in made:
        sampler.close()


class TestDiscoveryOffTheSamplingThread:
    def test_a_hung_discovery_neither_merges_windows_nor_fails_healthz(
        self, tmp_path: Path, sampler_of: list[Sampler]
    ) -> None:
        layout = v1_tree(tmp_path)
        v1_cgroup(tmp_path, "web")
        release, hung = threading.Event(), threading.Event()
        calls = 0

        def discover(known: frozenset[str]) -> list[Found]:
            nonlocal calls
            calls += 1
            if calls == 2:  # the pod list hangs (an API server that does not answer)
                hung.set()
                release.wait(10)
            return found("web")

        sampler = Sampler(layout, discover, FAST)
        sampler_of.append(sampler)
        server = make_server(sampler, "127.0.0.1", 0)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        stop = threading.Event()
        threads = sampler.start(stop)
        serving.start()
        try:
            assert hung.wait(5)
            before = sampler.windows
            time.sleep(1.0)  # 50 periods of 20 ms, with discovery stuck
            taken = sampler.windows - before
            with urllib.request.urlopen(
                f"http://127.0.0.1:{server.server_address[1]}/healthz", timeout=5
            ) as reply:
                status, body = reply.status, reply.read()
        finally:
            release.set()
            stop.set()
            for thread in threads:
                thread.join(5)
            server.shutdown()
            server.server_close()
        # Windows kept coming at the period (a loaded 2-core machine may lose a few): none
        # was stretched over the hang and divided by its length.
        assert taken >= 25, taken
        assert (status, body) == (200, b"ok\n")
        with sampler.lock:  # as a scrape sees it: every window, the quiet ones too
            (web,) = sampler.snapshot()
        assert web.total >= taken

    def test_a_failing_discovery_is_logged_reported_and_tried_again(
        self, tmp_path: Path, sampler_of: list[Sampler], caplog: pytest.LogCaptureFixture
    ) -> None:
        layout = v1_tree(tmp_path)
        v1_cgroup(tmp_path, "web")
        failing = threading.Event()
        failing.set()

        def discover(known: frozenset[str]) -> list[Found]:
            if failing.is_set():
                raise RuntimeError("boom")
            return found("web")

        sampler = Sampler(layout, discover, FAST)
        sampler_of.append(sampler)
        stop = threading.Event()
        threads = sampler.start(stop)
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and sampler.health()[1].startswith("stalled"):
                time.sleep(0.02)
            time.sleep(0.1)
            assert sampler.health() == (False, "discovery failed: RuntimeError: boom")
            failing.clear()  # the loop tries again, and it works
            while time.monotonic() < deadline and "web" not in sampler.series:
                time.sleep(0.02)
            time.sleep(0.1)
            assert sampler.health() == (True, "ok")
        finally:
            stop.set()
            for thread in threads:
                thread.join(5)
        assert any("discovery failed" in r.getMessage() for r in caplog.records)


def test_the_sampling_thread_stops_soon_whatever_the_period(
    tmp_path: Path, sampler_of: list[Sampler]
) -> None:
    layout = v1_tree(tmp_path)
    v1_cgroup(tmp_path, "web")
    settings = AgentSettings(period_ns=10_000_000_000, stop_within_s=0.05)  # 10 s windows
    sampler = Sampler(layout, lambda known: found("web"), settings)
    sampler_of.append(sampler)
    stop = threading.Event()
    sampling = threading.Thread(target=sampler.run, args=(stop,))
    sampling.start()
    time.sleep(0.2)
    stopped_at = time.monotonic()
    stop.set()
    sampling.join(5)
    assert not sampling.is_alive()
    assert time.monotonic() - stopped_at < 1.0  # within a sleep of 50 ms, not the 10 s


class TestHealth:
    @pytest.mark.parametrize(
        ("root", "reason"),
        [("nonexistent", "does not exist"), ("../../../etc", "outside the cgroup mount"),
         ("plain-dir", "is not a cgroup"), ("empty", "no cgroups found")],
        ids=["missing-root", "root-outside-the-mount", "not-a-cgroup", "nothing-below"],
    )  # fmt: skip
    def test_healthz_fails_with_the_reason_while_there_is_nothing_to_sample(
        self, tmp_path: Path, sampler_of: list[Sampler], root: str, reason: str
    ) -> None:
        mount = tmp_path / "cpu"
        mount.mkdir()
        layout = v1_tree(mount)
        (mount / "plain-dir").mkdir()
        (mount / "empty").mkdir()
        (mount / "empty" / "cgroup.procs").write_text("")
        sampler = Sampler(layout, lambda known: discover_standalone(layout, root, known), FAST)
        sampler_of.append(sampler)
        sampler.refresh()
        sampler.sample()
        ok, why = sampler.health()
        assert not ok and reason in why, why

    def test_healthz_recovers_when_the_cgroups_appear(
        self, tmp_path: Path, sampler_of: list[Sampler]
    ) -> None:
        layout = v1_tree(tmp_path)
        sampler = Sampler(layout, lambda known: discover_standalone(layout, "apps", known), FAST)
        sampler_of.append(sampler)
        sampler.refresh()
        sampler.sample()
        ok, why = sampler.health()
        assert not ok and why.startswith("cgroup root 'apps' does not exist"), why
        v1_cgroup(tmp_path, "apps", quota=-1)
        v1_cgroup(tmp_path, "apps/web")
        sampler.refresh()
        sampler.sample()
        assert sampler.health() == (True, "ok")

    def test_a_sampler_that_stopped_sampling_is_unhealthy(
        self, tmp_path: Path, sampler_of: list[Sampler]
    ) -> None:
        layout = v1_tree(tmp_path)
        v1_cgroup(tmp_path, "web")
        sampler = Sampler(layout, lambda known: found("web"), FAST)
        sampler_of.append(sampler)
        assert sampler.health()[0] is False  # never sampled
        sampler.refresh()
        sampler.sample()
        assert sampler.health() == (True, "ok")
        time.sleep(0.15)  # 5 periods of 20 ms without a window
        ok, why = sampler.health()
        assert not ok and why.startswith("stalled")

    def test_a_kubelet_tree_that_is_not_there_is_named(self, tmp_path: Path) -> None:
        from unthrottle.agent.discovery import discover_kubepods

        layout = v1_tree(tmp_path)
        with pytest.raises(NotFound, match=r"no kubepods or kubepods\.slice cgroup"):
            discover_kubepods(layout)


class TestSettings:
    def test_a_stop_delay_that_is_not_a_positive_duration_is_refused(self) -> None:
        with pytest.raises(InvalidAgentSettings) as info:
            AgentSettings(stop_within_s=0)
        assert info.value.field == "stop_within_s"

    def test_a_peak_window_shorter_than_the_period_is_refused_naming_it(self) -> None:
        with pytest.raises(InvalidAgentSettings) as info:
            AgentSettings(period_ns=100_000_000, peak_window_s=0.05)
        assert info.value.field == "peak_window_s"
        assert "shorter than the sampling period (100 ms)" in str(info.value)
        assert AgentSettings(period_ns=100_000_000, peak_window_s=0.1).keep == 1

    def test_the_agent_command_names_the_option(self) -> None:
        out = subprocess.run(
            [str(UNTHROTTLE), "agent", "--standalone", "--cgroup-root", "/", "--period", "100ms",
             "--peak-window", "50ms", "--listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "--peak-window" in out.stderr and "period" in out.stderr


class TestQuietSubtreesAreNotRead:
    def test_gates_sit_above_several_series_and_not_on_a_sampled_cgroup(self) -> None:
        pod_a, pod_b = "kubepods/burstable/poda", "kubepods/burstable/podb"
        containers = [f"{pod_a}/c1", f"{pod_a}/c2", f"{pod_b}/c1", "kubepods/podg/c1"]
        assert gate_paths(containers) == {"kubepods", "kubepods/burstable", pod_a}
        assert gate_paths([*containers, pod_a]) == {"kubepods", "kubepods/burstable"}
        steps = plan({p: p for p in containers}, {"kubepods": 0, pod_a: 1})
        assert [(s.path, s.end) for s in steps] == [
            ("kubepods", 6), (pod_a, 4), (f"{pod_a}/c1", 3), (f"{pod_a}/c2", 4),
            (f"{pod_b}/c1", 5), ("kubepods/podg/c1", 6),
        ]  # fmt: skip

    @pytest.mark.parametrize("skip", [True, False], ids=["gated", "every-cgroup-read"])
    def test_containers_of_a_pod_whose_usage_did_not_move_are_not_read(
        self, tmp_path: Path, sampler_of: list[Sampler], skip: bool
    ) -> None:
        layout = v1_tree(tmp_path)
        pod = "kubepods/pod1"
        v1_cgroup(tmp_path, pod, usage_ns=1_000_000, quota=-1)
        c1 = v1_cgroup(tmp_path, f"{pod}/c1", usage_ns=500_000)
        v1_cgroup(tmp_path, f"{pod}/c2", usage_ns=500_000)
        settings = AgentSettings(period_ns=20_000_000, skip_idle_subtrees=skip)
        sampler = Sampler(layout, lambda known: found(f"{pod}/c1", f"{pod}/c2"), settings)
        sampler_of.append(sampler)
        sampler.refresh()
        sampler.sample()
        series = sampler.series[f"{pod}/c1"]
        # c1's counter moves, the pod's does not: impossible on a kernel, so only a read of
        # c1 can see it. Gated, nothing below the quiet pod is read.
        (c1 / "cpuacct.usage").write_text("20500000\n")
        time.sleep(0.02)
        sampler.sample()
        assert (series.sum_cores > 0) is not skip
        # The pod's usage moves: c1 is read, and what it used since its last read counts.
        (tmp_path / pod / "cpuacct.usage").write_text("21000000\n")
        time.sleep(0.02)
        sampler.sample()
        assert series.last_demand_us == 20_500
        with sampler.lock:  # a quiet read is accounted when scraped, or when it next runs
            sampler.snapshot()
        assert series.total == 3
        # A quiet window again: gated, neither container is touched; a scrape still shows
        # every window of each, the skipped ones as zero demand.
        time.sleep(0.02)
        sampler.sample()
        with sampler.lock:
            scraped = {s.found.path: s for s in sampler.snapshot()}
        assert [s.total for s in scraped.values()] == [4, 4]
        other = scraped[f"{pod}/c2"]
        assert (other.counts[0], other.peak) == (4, 0.0)
        assert scraped[f"{pod}/c1"].counts[0] == 3  # one window of 20 ms used: not zero


@pytest.mark.kernel
def test_on_a_kubelet_tree_the_gated_windows_add_up_to_what_the_kernel_counted(
    layout: Layout,
) -> None:
    """Two pods of two containers, one of them busy then idle: every µs of usage and
    throttled time lands in some window, and the idle containers' windows are all zero."""
    root = f"unthrottle-test-gates-{os.getpid()}"
    tree = CgroupTree(layout)
    child = None
    sampler = None
    try:
        tree.make(root)
        tree.make(f"{root}/kubepods")
        paths = []
        for pod in ("poda", "podb"):
            tree.make(f"{root}/kubepods/{pod}")
            for c in ("c1", "c2"):
                paths.append(tree.make(f"{root}/kubepods/{pod}/{c}", 30_000).path)
        busy = Cgroup(layout, paths[0])
        sampler = Sampler(layout, lambda known: found(*paths), AgentSettings())
        sampler.refresh()
        assert set(sampler._gates) == {root, f"{root}/kubepods", f"{root}/kubepods/poda",
                                       f"{root}/kubepods/podb"}  # fmt: skip
        code = "import time\nend = time.monotonic() + 0.6\nwhile time.monotonic() < end: pass"
        child = subprocess.Popen([sys.executable, "-c", code])
        busy.add_process(child.pid)
        while child.poll() is None:
            time.sleep(0.1)
            sampler.sample()
        for _ in range(3):
            time.sleep(0.1)
            sampler.sample()
        stat = busy.read_stat()
        series = sampler.series[busy.path]
        # Demand = usage + throttled time + the wait beyond the throttled time, window by
        # window: the first two to the µs, whatever the third.
        demand = series.last_demand_us - series.contention_us
        assert abs(demand - (stat.usage_us + stat.throttled_us)) <= 1
        assert stat.nr_throttled >= 3 and series.sum_cores > 3
        # Throttled, it waited in its run queue (the last window's wait left with it).
        assert series.wait_us >= 0.8 * stat.throttled_us
        for path in paths[1:]:
            assert sampler.series[path].sum_cores == 0
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if sampler is not None:
            sampler.close()
        tree.cleanup()


class TestNoCpuController:
    def test_a_v2_cgroup_without_the_cpu_controller_reads_its_usage_as_demand(
        self, tmp_path: Path, sampler_of: list[Sampler]
    ) -> None:
        # A child of a cgroup whose subtree_control lacks `cpu`: cpu.stat has only the
        # usage lines, and there is no cpu.max.
        d = tmp_path / "system.slice" / "db.service"
        d.mkdir(parents=True)
        (d / "cpu.stat").write_text("usage_usec 1000\nuser_usec 600\nsystem_usec 400\n")
        layout = Layout(Version.V2, tmp_path, tmp_path)
        sampler = Sampler(layout, lambda known: found("system.slice/db.service"), FAST)
        sampler_of.append(sampler)
        sampler.refresh()
        series = sampler.series["system.slice/db.service"]
        assert series.bandwidth == Bandwidth(None)
        (d / "cpu.stat").write_text("usage_usec 51000\nuser_usec 30600\nsystem_usec 20400\n")
        sampler.sample()
        # demand is usage alone (50 ms), not usage + system_usec (the last field)
        assert series.last_demand_us == 51_000
        with sampler.lock:
            (latest,) = sampler.snapshot()
        assert latest.latest.usage_us == 51_000 and latest.latest.throttled_us == 0


def test_healthz_over_http_says_why(tmp_path: Path, sampler_of: list[Sampler]) -> None:
    layout = v1_tree(tmp_path)
    sampler = Sampler(layout, lambda known: discover_standalone(layout, "gone", known), FAST)
    sampler_of.append(sampler)
    sampler.refresh()
    sampler.sample()
    server = make_server(sampler, "127.0.0.1", 0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/healthz")
        assert info.value.code == 503
        assert b"cgroup root 'gone' does not exist" in info.value.read()
    finally:
        server.shutdown()
        server.server_close()
