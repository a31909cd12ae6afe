"""The agent on real cgroups, scraped over HTTP and by a real Prometheus (root only).

A busy thread runs in a cgroup laid out like the kubelet's
(``kubepods/burstable/pod<uid>/<id>``) under a 0.3 CPU quota: it uses 0.3 of
a core and is throttled for the rest, so its demand is about 1 core per window.
Beside a hog pinned to its CPU, it gets half a core or its quota, and waits for
the rest: its threads' wait (schedstat run delay) brings the demand back to 1 core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import CgroupTree, kubepods_levels
from kube import Kube
from prom import PrometheusServer, free_port, requires_prometheus
from test_agent_naming import bound_pod, container_ids, fake_nodes
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.metrics.promql import ACTIVE_COUNTER, BACKLOG_COUNTER, BY_BACKLOG, BY_CONTAINER
from unthrottle_lab.children import stop as stop_process
from unthrottle_lab.isolation import Isolation
from unthrottle_lab.noise import steal_ms

pytestmark = pytest.mark.kernel
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
UID = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f"
CID = "3f2a9c8d7e6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f"


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(url: str, seconds: float = 15, *, log: Path | None = None) -> None:
    """Until ``url`` answers 200; else fail with its last answer and the agent's log."""
    deadline = time.monotonic() + seconds
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = get(url, timeout=1)
            if last[0] == 200:  # type: ignore[index]
                return
        except OSError as err:
            last = err
        time.sleep(0.1)
    text = log.read_text()[-2000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{url} never answered 200 (last: {last!r})\n{text}")


def start_agent(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``unthrottle agent ARGS``, its stderr (JSON logs) into ``log``: a pipe nobody reads
    would fill up and block the agent."""
    with log.open("ab") as out:
        return subprocess.Popen([str(UNTHROTTLE), "agent", *args], stderr=out)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a process we started, by PID."""
    stop_process(proc, timeout_s=10)


class Workload(CgroupTree):
    """A busy thread in the cgroup of container ``cid`` of burstable pod ``uid``, laid out as
    the kubelet lays them out (cgroupfs driver) below ``root``."""

    def __init__(self, layout: Layout, quota_us: int = 30_000, *, uid: str = UID,
                 cid: str = CID) -> None:  # fmt: skip
        super().__init__(layout)
        self.quota_us = quota_us
        self.root = f"unthrottle-test-agent-{os.getpid()}"
        self.levels = [
            *kubepods_levels(self.root, uid),
            f"{self.root}/kubepods/burstable/pod{uid}/{cid}",
        ]
        self.container = Cgroup(layout, self.levels[-1])
        self.child: subprocess.Popen[bytes] | None = None

    def prepare(self) -> None:
        """Create the cgroups (an agent started now finds the container, idle)."""
        if self.made:
            return
        for path in self.levels[:-1]:
            self.make(path)
        self.container = self.make(self.levels[-1], self.quota_us)

    def start(self, seconds: float, *, cpu: int | None = None) -> None:
        """The busy thread, for ``seconds`` of wall time; pinned to ``cpu`` if given."""
        self.prepare()
        code = (
            f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
        )
        self.child = subprocess.Popen([sys.executable, "-c", code])
        if cpu is not None:
            os.sched_setaffinity(self.child.pid, {cpu})
        self.container.add_process(self.child.pid)

    def finish(self) -> None:
        if self.child is not None:
            self.child.wait(timeout=60)

    def cleanup(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        super().cleanup()


@pytest.fixture
def workload(layout: Layout, request: pytest.FixtureRequest) -> Iterator[Workload]:
    """The workload, with the quota a test passes (``indirect``), else 0.3 CPU."""
    w = Workload(layout, getattr(request, "param", 30_000))
    try:
        yield w
    finally:
        w.cleanup()


@pytest.fixture
def agent(workload: Workload, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    workload.prepare()
    proc = start_agent(
        ["--standalone", "--cgroup-root", workload.root, "--listen", f"127.0.0.1:{port}",
         "--period", "100ms", "--discover-every", "500ms"],
        tmp_path / "agent.log",
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", log=tmp_path / "agent.log")
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_the_agent_exports_what_the_kernel_counts_and_the_demand_usage_hides(
    workload: Workload, agent: str
) -> None:
    # The machine's other processes at idle priority (the agent, started by this test,
    # keeps its own): the thread gets a core whatever else runs.
    with Isolation(workload.layout) as isolation:
        workload.start(seconds=3)
        workload.finish()  # discovered within 0.5 s of starting
    print(isolation.describe())
    time.sleep(0.5)  # counters frozen; the agent has sampled them since
    status, text = get(f"http://{agent}/metrics")
    assert status == 200
    kernel = workload.container.read_stat()
    got = samples(text)
    pod = f"kubepods/burstable/pod{UID}/{CID}"
    mine = {k: [v for labels, v in rows if labels.get("pod") == pod] for k, rows in got.items()}
    assert mine["unthrottle_cpu_cfs_periods_total"] == [kernel.nr_periods]
    assert mine["unthrottle_cpu_cfs_throttled_periods_total"] == [kernel.nr_throttled]
    assert mine["unthrottle_cpu_cfs_throttled_seconds_total"] == [kernel.throttled_us / 1e6]
    assert mine["unthrottle_cpu_cfs_quota_seconds"] == [0.03]
    assert kernel.nr_throttled >= 15
    buckets = {labels["le"]: v for labels, v in got["unthrottle_cpu_demand_cores_bucket"]
               if labels["pod"] == pod}  # fmt: skip
    # Whatever the load: a window that throttled reads above the capped 0.3 (its usage,
    # then the stall to the period's end), so the demand is not the usage.
    assert buckets["+Inf"] - buckets["0.4"] >= 12, buckets
    # A thread with a core to itself: ~0.3 used + ~0.7 throttled = ~1 core.
    assert buckets["1.25"] - buckets["0.75"] >= 12, buckets
    assert buckets["0.4"] - buckets["0.05"] <= 6  # hardly any window reads as 0.3
    assert mine["unthrottle_cpu_demand_peak_cores"][0] >= 0.9
    # The pod-level and QoS cgroups have neither quota nor processes: not containers here.
    assert {labels["pod"] for labels, _ in got["unthrottle_cpu_cfs_periods_total"]} == {pod}
    # With a core to itself, the thread waited only while throttled: its wait is the
    # throttled time (but for the last window, when it exited: ≤ 0.1 s), not more demand.
    (wait,) = mine["unthrottle_cpu_wait_seconds_total"]
    throttled = kernel.throttled_us / 1e6
    assert abs(wait - throttled) <= 0.05 * throttled + 0.1, (wait, throttled)


CPU = max(os.sched_getaffinity(0))
BESIDE_A_HOG = {
    # standalone mode finds a cgroup with a quota or processes: 2 CPUs is no limit for one
    # thread, and the cgroup is found before its thread starts
    "no limit (2 CPU, one thread)": 200_000,
    "0.6 CPU (not binding)": 60_000,
    "0.3 CPU": 30_000,
}
HOG_SECONDS = 3.0
WINDOW_MS_LOST = (25, 40)
"""What the host must take from the thread in one window (steal while it runs: neither
usage nor wait) for the window to read below 0.75 core instead of about 1, and for it to
read 0.6 core or less, ms."""
MOST_WINDOWS_LOST = 12
"""At most this many windows are excused for steal; past it a measurement is the host's."""
REMEASURE_STOLEN_MS = 50
"""Steal taken from the thread (ms) above which a measurement that missed is measured
again, at most :data:`MORE_MEASUREMENTS` times (``tests/test_lab_seeds.py``'s
``REMEASURE_LOST_MS``). Once on CI the host took about 1 s of the 3 s from the hog's CPU
(2.5 s over the test, both CPUs): usage read 0.99 and 0.94 s, wait 1.59 and 1.56 s."""
MORE_MEASUREMENTS = 2
STOLEN_ALLOWED_S = 2.0
"""The most steal (the thread's CPU, over its 8 s) the Prometheus test's median may be
excused for: the floor 0.75 x (1 - stolen / 8) stops at 0.56 core. Past it the workload is
measured again, at most :data:`MORE_MEASUREMENTS` times, then the test fails saying what
the host took (once 3.6 s of steal read the median at 0.64, before the workload waited for
Prometheus's first scrape)."""


def scrape(agent: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, text = get(f"http://{agent}/metrics")
    assert status == 200
    return samples(text)


@dataclass(frozen=True)
class Held:
    """The agent's counters for the thread over one run beside the hog (s; the demand
    histogram's buckets, windows), and the steal on its CPU meanwhile (s, 10 ms ticks)."""

    quota_us: int
    usage: float
    throttled: float
    wait: float
    buckets: dict[str, float]
    stolen: float

    @property
    def stolen_from_thread(self) -> float:
        """The host's steal falls on whatever the CPU runs: the thread's part is its share
        of what the guest ran there (the hog had the rest), s."""
        guest = HOG_SECONDS - self.stolen
        return self.stolen * self.usage / guest if guest > 0 else self.stolen

    def misses(self) -> list[str]:
        """What the agent read that the thread beside the hog did not do."""
        out = []
        # Half the CPU, or its quota if less: half of what the host left the hog and it
        # (the host's steal is neither usage nor wait).
        share = min(self.quota_us / 100_000 * HOG_SECONDS, (HOG_SECONDS - self.stolen) / 2)
        if self.usage != pytest.approx(share, rel=0.2):
            out.append(f"usage {self.usage:.3f} s, not {share:.2f} s")
        # It waited for the rest of its wall time, behind the hog or on its quota, but
        # for what the host took while it ran.
        demand = self.usage + max(self.throttled, self.wait) + self.stolen_from_thread
        if demand != pytest.approx(HOG_SECONDS, rel=0.12):
            out.append(f"usage + wait + stolen {demand:.3f} s, not {HOG_SECONDS} s")
        # Windows at about 1 core, where usage + throttled time reads half of that or
        # less; a window the host took 25 ms from the thread in reads less.
        below, half_or_less = (min(round(self.stolen_from_thread * 1000 / ms), MOST_WINDOWS_LOST)
                               for ms in WINDOW_MS_LOST)  # fmt: skip
        about_one = self.buckets["1.25"] - self.buckets["0.75"]
        if about_one < 18 - below:
            out.append(f"{about_one:.0f} windows at about 1 core, not {18 - below}+")
        half = self.buckets["0.6"] - self.buckets["0.05"]
        if half > 6 + half_or_less:
            out.append(f"{half:.0f} windows at 0.05-0.6 core, not {6 + half_or_less} or fewer")
        return out


def run_beside_a_hog(workload: Workload, agent: str) -> Held:
    """The thread for :data:`HOG_SECONDS`, pinned beside a hog on :data:`CPU`; what the
    agent counted for it meanwhile (its counters before and after)."""
    pod = f"kubepods/burstable/pod{UID}/{CID}"

    def mine(name: str, got: dict[str, list[tuple[dict[str, str], float]]]) -> float:
        (value,) = [v for labels, v in got[name] if labels.get("pod") == pod]
        return value

    def buckets(got: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
        return {labels["le"]: v for labels, v in got["unthrottle_cpu_demand_cores_bucket"]
                if labels["pod"] == pod}  # fmt: skip

    hog_path = f"{workload.root}-hog"
    if not any(cg.path == hog_path for cg in workload.made):
        workload.make(hog_path)  # beside the workload's tree, at its weight
    before = scrape(agent)
    with Isolation(workload.layout):  # the hog is this test's: it keeps its priority
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(hog.pid, {CPU})
            Cgroup(workload.layout, hog_path).add_process(hog.pid)
            stolen_before = steal_ms(cpu=CPU)
            workload.start(seconds=HOG_SECONDS, cpu=CPU)
            workload.finish()
            stolen = (steal_ms(cpu=CPU) - stolen_before) / 1e3
        finally:
            stop(hog)
    time.sleep(0.5)
    after = scrape(agent)
    counted = {name: mine(name, after) - mine(name, before) for name in (
        "unthrottle_cpu_usage_seconds_total", "unthrottle_cpu_cfs_throttled_seconds_total",
        "unthrottle_cpu_wait_seconds_total")}  # fmt: skip
    was = buckets(before)
    return Held(
        workload.quota_us,
        counted["unthrottle_cpu_usage_seconds_total"],
        counted["unthrottle_cpu_cfs_throttled_seconds_total"],
        counted["unthrottle_cpu_wait_seconds_total"],
        {le: v - was.get(le, 0.0) for le, v in buckets(after).items()},
        stolen,
    )


@pytest.mark.parametrize("workload", BESIDE_A_HOG.values(), ids=BESIDE_A_HOG.keys(),
                         indirect=True)  # fmt: skip
def test_beside_a_hog_the_wait_shows_the_demand_that_usage_and_throttling_hide(
    workload: Workload, agent: str
) -> None:
    """A run that missed while the host took from the thread is measured again (the same
    agent, its counters' increases); one the host left alone that missed fails at once."""
    held = run_beside_a_hog(workload, agent)
    for _ in range(MORE_MEASUREMENTS):
        if not held.misses() or held.stolen_from_thread * 1000 < REMEASURE_STOLEN_MS:
            break
        print(f"measured again: {held.misses()} while the host took "
              f"{held.stolen_from_thread * 1000:.0f} ms from the thread")  # fmt: skip
        held = run_beside_a_hog(workload, agent)
    print(held)
    misses = held.misses()
    assert not misses, f"{misses}: {held}"


def test_healthz_answers_while_sampling(agent: str) -> None:
    assert get(f"http://{agent}/healthz") == (200, "ok\n")
    assert get(f"http://{agent}/nope")[0] == 404


@requires_prometheus
def test_a_real_prometheus_scrapes_the_agent_and_promql_sees_the_demand(
    workload: Workload, agent: str, tmp_path: Path
) -> None:
    scrape = (
        f"scrape_configs:\n  - job_name: agent\n    static_configs: [{{targets: ['{agent}']}}]\n"
    )
    with PrometheusServer(tmp_path, scrape=scrape) as prom:
        # Prometheus first scrapes 5-6 s after it is ready: the workload waits for it, so
        # that the 8 s range below holds the workload's windows, not mostly the idle ones
        # after it (scraped from its 6th second on, the median read 0.68 and 0.72)
        prom.until_scraped("agent")
        for _ in range(1 + MORE_MEASUREMENTS):
            with Isolation(workload.layout):  # Prometheus and the agent are this test's: kept
                stolen_before = steal_ms(cpu=CPU)
                workload.start(seconds=8, cpu=CPU)
                workload.finish()
                stolen = (steal_ms(cpu=CPU) - stolen_before) / 1e3
            time.sleep(2)  # the last scrape after the workload ended
            if stolen <= STOLEN_ALLOWED_S:
                break
            print(f"measured again: the host took {stolen:.1f} s of the thread's 8 s")
        # past the cap the median is the host's: measured again above, else fail saying so
        assert stolen <= STOLEN_ALLOWED_S, f"the host took {stolen:.1f} s of the thread's 8 s"
        query = (
            "histogram_quantile(0.5, sum by (le) (increase("
            f'unthrottle_cpu_demand_cores_bucket{{pod=~".*{CID}"}}[8s])))'
        )
        url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        status, body = get(url)
        # the windows in each bucket over the same range, for the message of a miss
        each = f'sum by (le) (increase(unthrottle_cpu_demand_cores_bucket{{pod=~".*{CID}"}}[8s]))'
        _, each_body = get(f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": each}))
        # the backlog series, grouped as recommend and the operator group them
        backlog = (
            f'sum by ({BY_BACKLOG}) (increase({BACKLOG_COUNTER}{{pod=~".*{CID}"}}[12s])) '
            f'or sum by ({BY_CONTAINER}) (increase({ACTIVE_COUNTER}{{pod=~".*{CID}"}}[12s]))'
        )
        url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": backlog})
        backlog_status, backlog_body = get(url)
    assert status == 200, body
    result = json.loads(body)["data"]["result"]
    assert result, body
    median = float(result[0]["value"][1])
    windows = {r["metric"]["le"]: round(float(r["value"][1]), 1)
               for r in json.loads(each_body)["data"]["result"]}  # fmt: skip
    # The workload's per-window demand is ~1 core with a core to itself (buckets around
    # it: 0.9, 1.0, 1.25), well above the 0.3 its usage is capped at; less what the host
    # took from its CPU, which is neither usage nor wait (once 3.6 s of steal over the
    # test read the median at 0.64, when Prometheus did not yet wait for its first
    # scrape). The range holds ~60 of its windows and the ~20 idle ones after it.
    assert 0.75 * (1 - stolen / 8) <= median <= 1.25, (median, stolen, windows)
    # Its demand stays near 1 core window after window: above 0.5 core the backlog grows
    # by up to half a quota a window, so after its first windows it is past two quotas;
    # at 2 cores there is never any. What the burst depends on came through Prometheus.
    assert backlog_status == 200, backlog_body
    found = {(r["metric"].get("level"), r["metric"].get("over")): float(r["value"][1])
             for r in json.loads(backlog_body)["data"]["result"]}  # fmt: skip
    active = found[(None, None)]
    assert active >= 40, found  # windows with demand (fewer than 80 where the sampler ran late)
    assert found[("0.5", "2")] >= 0.5 * active, found
    assert found[("2", "0")] == 0 and found[("8", "0")] == 0, found


def test_the_agent_names_pods_and_containers_through_the_kubernetes_api(
    layout: Layout, kube: Kube, tmp_path: Path
) -> None:
    here, there = fake_nodes(kube)
    api = bound_pod(kube, "api-1", here, ["api"], {"unthrottle.io/cpu-burst": "40ms"})
    bound_pod(kube, "elsewhere", there, ["api"])
    # the pod's cgroups as its kubelet names them: the server's UID, the reported ID
    workload = Workload(layout, uid=api["metadata"]["uid"], cid=container_ids(api)["api"])
    try:
        port = free_port()
        workload.prepare()
        proc = start_agent(
            ["--kubeconfig", str(kube.kubeconfig(tmp_path / "kc")), "--node-name", here,
             "--kubepods-parent", workload.root, "--listen", f"127.0.0.1:{port}",
             "--discover-every", "500ms", "--burst", "--burst-namespace", kube.namespace,
             "--burst-node-threshold", "1.0"],
            tmp_path / "agent.log",
        )  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", log=tmp_path / "agent.log")
            workload.start(seconds=1.5)
            workload.finish()
            time.sleep(0.3)
            status, text = get(f"http://127.0.0.1:{port}/metrics")
        finally:
            stop(proc)
        assert status == 200
        names = {
            (labels["namespace"], labels["pod"], labels["container"])
            for labels, _ in samples(text)["unthrottle_cpu_cfs_periods_total"]
        }
        # the container by its name, and the pod-level cgroup (its own quota) with container=""
        assert names == {(kube.namespace, "api-1", "api"), (kube.namespace, "api-1", "")}
        periods = {labels["container"]: v for labels, v in samples(text)[
            "unthrottle_cpu_cfs_throttled_periods_total"]}  # fmt: skip
        assert periods["api"] == workload.container.read_stat().nr_throttled >= 5
        # The annotation asked 40 ms; the quota is 30 ms: the kernel holds 30 ms, and it was
        # counted.
        assert workload.container.read_bandwidth().burst_us == 30_000
        assert "unthrottle_agent_burst_clamped_total 1" in text
    finally:
        workload.cleanup()
