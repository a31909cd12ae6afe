"""`lab run --isolate`: the machine's other processes wait at idle priority while a run
measures, and are back where they were afterwards (root, real cgroups)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from support.machine import cpu_cgroup_of
from unthrottle.cgroups import Cgroup, Layout
from unthrottle_lab.children import foreign_hogs
from unthrottle_lab.isolation import PREFIX, Isolation

pytestmark = pytest.mark.kernel


@pytest.fixture
def hogs() -> Iterator[list[int]]:
    """Two CPU hogs that are not this process's descendants, as another program's would be."""
    with foreign_hogs(2) as pids:
        yield pids


def spin_share(layout: Layout, seconds: float) -> float:
    """Cores a busy child of ours got over ``seconds``, measured by its cgroup's usage."""
    cg = Cgroup(layout, f"unthrottle-test-isolation-{os.getpid()}")
    cg.create()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cg.add_process(child.pid)
        before = cg.read_stat().usage_us
        time.sleep(seconds)
        return (cg.read_stat().usage_us - before) / 1e6 / seconds
    finally:
        child.kill()
        child.wait()
        cg.remove()


def test_other_processes_wait_at_idle_priority_meanwhile_and_come_back(
    layout: Layout, hogs: list[int]
) -> None:
    own = cpu_cgroup_of(os.getpid())
    before = {pid: cpu_cgroup_of(pid) for pid in hogs}
    assert set(before.values()) == {"/"}
    with Isolation(layout) as isolation:
        assert not isolation.refused
        assert isolation.moved >= 2
        cgroup = layout.cpu_root / f"{PREFIX}{os.getpid()}"
        assert (cgroup / "cpu.idle").read_text().strip() == "1"
        assert {cpu_cgroup_of(pid) for pid in hogs} == {f"/{cgroup.name}"}
        assert cpu_cgroup_of(os.getpid()) == own  # the lab's own process keeps its place
        share = spin_share(layout, 1.0)
    assert {pid: cpu_cgroup_of(pid) for pid in hogs} == before
    assert not cgroup.exists()
    # Two hogs on two cores would leave a third thread 2/3 of a core; at idle priority
    # they leave it nearly a whole one.
    print(f"a busy thread beside two isolated hogs got {share:.2f} cores")
    assert share >= 0.85


def test_a_cgroup_left_by_a_killed_lab_is_emptied_and_removed(
    layout: Layout, hogs: list[int]
) -> None:
    dead = 2**22 + 1  # above pid_max's default: no such process
    stale = layout.cpu_root / f"{PREFIX}{dead}"
    stale.mkdir()
    (stale / "cgroup.procs").write_text(str(hogs[0]))
    assert cpu_cgroup_of(hogs[0]) == f"/{stale.name}"
    with Isolation(layout):
        assert not stale.exists()
    assert cpu_cgroup_of(hogs[0]) == "/"


def test_a_run_says_how_many_processes_it_isolated(layout: Layout, hogs: list[int]) -> None:
    from unthrottle_lab.runner import LabOptions, run_scenario
    from unthrottle_lab.scenario import parse_scenario

    workload = {"kind": "serial", "task_cpu_ms": 5, "tasks": 4}
    scenario = parse_scenario({"name": "quick", "workload": workload, "runs": [{"cpus": 0.5}]})
    (isolated,) = run_scenario(scenario, layout, LabOptions(isolate=True))
    (plain,) = run_scenario(scenario, layout, LabOptions())
    assert isolated.extra["isolated"] >= 2
    assert plain.extra["isolated"] is None
    assert {cpu_cgroup_of(pid) for pid in hogs} == {"/"}
