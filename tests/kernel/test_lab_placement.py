"""Where a lab run's threads run: workers pinned apart (``--pin``), and the other threads a
run asks for, each pinned and in a cgroup of its own (real processes and cgroups)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.machine import cpu_cgroup_of
from unthrottle.cgroups import Layout
from unthrottle_lab.processes import NEIGHBOUR_PREFIX, OtherThreads, kill_and_reap, pin_apart

CPUS = sorted(os.sched_getaffinity(0))


def sleepers(count: int) -> Iterator[list[int]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(count)]  # fmt: skip
    try:
        yield [p.pid for p in procs]
    finally:
        kill_and_reap(procs)


@pytest.fixture
def as_many_as_cpus() -> Iterator[list[int]]:
    yield from sleepers(len(CPUS))


@pytest.fixture
def more_than_cpus() -> Iterator[list[int]]:
    yield from sleepers(len(CPUS) + 1)


def test_workers_no_more_than_cpus_each_get_a_cpu_of_their_own(
    as_many_as_cpus: list[int],
) -> None:
    assert pin_apart(as_many_as_cpus)
    placed = [os.sched_getaffinity(pid) for pid in as_many_as_cpus]
    assert all(len(cpus) == 1 for cpus in placed)
    assert sorted(next(iter(c)) for c in placed) == CPUS  # one each, none shared
    assert placed[0] == {CPUS[-1]}  # the last CPU first: the other threads start at the first


def test_more_workers_than_cpus_are_left_to_the_scheduler(more_than_cpus: list[int]) -> None:
    assert not pin_apart(more_than_cpus)
    assert all(os.sched_getaffinity(pid) == set(CPUS) for pid in more_than_cpus)


def test_a_single_worker_is_left_to_the_scheduler(more_than_cpus: list[int]) -> None:
    assert not pin_apart(more_than_cpus[:1])
    assert os.sched_getaffinity(more_than_cpus[0]) == set(CPUS)


@pytest.mark.kernel
def test_other_threads_each_spin_pinned_in_a_cgroup_of_their_own_and_leave_nothing(
    layout: Layout,
) -> None:
    stale = layout.cpu_root / f"{NEIGHBOUR_PREFIX}999999999-0"  # a killed lab's: PID gone
    for root in layout.roots:
        (root / stale.name).mkdir()
    with OtherThreads(2, layout) as others:
        assert not stale.exists()  # removed by the next run that starts other threads
        pids = others.pids
        groups = [cpu_cgroup_of(pid) for pid in pids]
        assert len(set(groups)) == 2
        assert all(Path(g).name.startswith(NEIGHBOUR_PREFIX) for g in groups)
        assert [os.sched_getaffinity(pid) for pid in pids] == [{CPUS[0]}, {CPUS[1 % len(CPUS)]}]
        for pid in pids:
            assert Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "R"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    for root in layout.roots:
        assert not list(root.glob(f"{NEIGHBOUR_PREFIX}*"))
