"""The lab in a cgroup that is not its own (``LabOptions(existing_cgroup=True)``): a
container's, which its kubelet made with the pod, resizes in place and removes with the pod.
The run uses it as it is, reads its settings back from the kernel, and leaves it as it found
it (root only)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

import pytest

from helpers import worker_pids
from unthrottle.cgroups import Cgroup, Layout
from unthrottle.units import Bandwidth
from unthrottle_lab.processes import LabError
from unthrottle_lab.runner import LabOptions, run_run, run_sampled
from unthrottle_lab.scenario import RunSpec, parse_scenario

pytestmark = pytest.mark.kernel

WORKLOAD = parse_scenario({
    "name": "quick",
    "workload": {"kind": "serial", "task_cpu_ms": 8, "workers": 1, "tasks": 12},
    "runs": [{}],
}).workload.to_workload()  # fmt: skip
"""8 ms tasks one after the other: under 4 ms per 20 ms period, every task waits a period."""
KEPT = Bandwidth(4_000, 20_000, 2_000)


@pytest.fixture
def container(layout: Layout) -> Iterator[Cgroup]:
    """A cgroup made and configured before the run, as a kubelet makes a container's."""
    cg = Cgroup(layout, f"unthrottle-test-{os.getpid()}-container")
    cg.create()
    cg.write_bandwidth(KEPT)
    yield cg
    cg.remove()


def _in(cg: Cgroup) -> LabOptions:
    return LabOptions(cgroup_name=cg.path, existing_cgroup=True)


def test_a_run_takes_the_cgroups_settings_and_leaves_it_as_it_was(container: Cgroup) -> None:
    workers = worker_pids()
    figures = run_run(WORKLOAD, None, container.layout, _in(container))
    # the settings in the figures are the kernel's
    assert figures.limit == {"cpus": 0.2, "period_ms": 20, "burst_ms": 2}
    assert figures.stat.nr_throttled >= 6 and figures.latency.p50 > 20
    # the cgroup is still there, as it was, with nobody left in it
    assert container.exists()
    assert container.read_bandwidth() == KEPT
    assert container.pids() == []
    assert worker_pids() <= workers


def test_each_run_counts_its_own_span_while_the_cgroups_counters_go_on(
    container: Cgroup,
) -> None:
    start = container.read_stat()
    first = run_run(WORKLOAD, None, container.layout, _in(container))
    second = run_run(WORKLOAD, None, container.layout, _in(container))
    total = container.read_stat() - start
    assert total.nr_periods >= first.stat.nr_periods + second.stat.nr_periods
    # the second run's figures are its own, not the sum of both
    assert second.stat.nr_periods < first.stat.nr_periods * 1.5
    assert second.stat.nr_throttled < first.stat.nr_throttled * 1.5


@pytest.mark.parametrize(
    ("expected", "runs"),
    [(RunSpec(cpus=0.2, period_ms=20, burst_ms=2), True),
     (RunSpec(cpus=0.5, period_ms=20, burst_ms=2), False),
     (RunSpec(cpus=0.2, period_ms=20), False)],
    ids=["as-expected-runs", "other-limit-refused", "no-burst-refused"],
)  # fmt: skip
def test_settings_other_than_the_callers_are_refused_before_anything_runs(
    container: Cgroup, expected: RunSpec, runs: bool
) -> None:
    used = container.read_stat().usage_us
    if runs:
        figures = run_run(WORKLOAD, expected, container.layout, _in(container))
        assert figures.stat.nr_throttled > 0
        return
    with pytest.raises(
        LabError,
        match=re.escape(
            f"holds 0.2 CPU, 20 ms period, 2 ms burst, not the {expected.label()} expected"
        ),
    ):
        run_run(WORKLOAD, expected, container.layout, _in(container))
    assert container.read_stat().usage_us == used  # no worker ever ran in it
    assert container.read_bandwidth() == KEPT


def test_a_cgroup_that_is_not_there_is_not_made(layout: Layout) -> None:
    missing = Cgroup(layout, f"unthrottle-test-{os.getpid()}-gone")
    with pytest.raises(LabError, match="no such cgroup"):
        run_run(WORKLOAD, None, layout, _in(missing))
    assert not missing.exists()


def test_a_cgroup_resized_during_the_run_gives_no_figures(container: Cgroup) -> None:
    def resize(cg: Cgroup, start_ns: int, period_ns: int) -> Callable[[], None]:
        cg.write_quota(8_000)  # the kubelet of an in-place resize, as the run starts
        return lambda: None

    workers = worker_pids()
    with pytest.raises(LabError, match=r"settings changed during the run \(quota 4000 µs.*"
                       r"then quota 8000 µs"):  # fmt: skip
        run_sampled(WORKLOAD, None, container.layout, _in(container), watch=resize)
    assert container.exists() and container.read_bandwidth().quota_us == 8_000
    assert container.pids() == [] and worker_pids() <= workers
