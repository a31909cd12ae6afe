"""Run a scenario's runs on the real kernel, each in a fresh cgroup, and measure them.

One run, step by step:

1. start the workers (outside any limit) and wait until each says it is ready,
   so process start-up is never measured or throttled;
2. create a fresh cgroup, set its bandwidth, move the workers in;
3. *calibrate* (limited runs): the workers burn CPU until the quota runs out
   and report when they were let run again: that instant is a period boundary.
   The kernel's period grid has a phase of its own per cgroup, stable once the
   cgroup exists (docs/model.md), so this fixes where the run starts against it;
4. stay idle for four periods: the bucket refills (quota + burst) and the
   period timer stops, as after any idle spell;
5. start the workload at ``phase`` after a period boundary (default: on it),
   read ``cpu.stat`` just before and just after;
6. always, also on errors and Ctrl-C: kill the workers by PID, remove the cgroup.

Only the workers run inside the cgroup; this process times and dispatches
them from outside it.

A run with ``pod_quota`` goes into a container cgroup (``…-pod/container``) inside a pod
cgroup whose quota is the run's, on the same period, with no burst, as a kubelet makes a
one-container pod. Each has a period grid of its own, so both are calibrated (step 3,
:func:`_calibrate_pod`), and the pod's counters are measured beside the container's
(``extra["pod"]``, ``extra["pod_period_phase_ms"]``). Both cgroups are removed after.

A run with a ``sidecar`` is a two-container pod: the run's workers go into ``…-pod/container``
and the sidecar's into ``…-pod/sidecar``, each under its own quota and burst, inside a pod
cgroup whose quota is the sum of theirs and whose burst is the sum of their bursts (clamped
to its quota), as a kubelet and the agent make it. The pod's grid is calibrated with every
worker burning, then each container's alone with the pod's quota lifted; both workloads
start together at the run's start, the sidecar's driven from a thread of its own, and each
container's counters cover its own span (``extra["sidecar"]``: the sidecar's figures in the
shape of a run's; ``extra["pod"]`` over the span of both). All three cgroups are removed
after, also on errors.

A run can also go into a cgroup that exists and outlives it (``existing_cgroup``): a
container's, which its kubelet made with the pod and removes with it, and whose quota
an in-place resize changes. Steps 2 and 6 then leave the cgroup alone (not created, its
bandwidth not written, not removed): the run's settings are read back from it, and the
counters are those of the run's span, as in a fresh one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from unthrottle.cfs.pod import pod_figures
from unthrottle.cgroups import Cgroup, CpuStat, Layout
from unthrottle.cgroups.waits import WaitReader
from unthrottle.units import Bandwidth
from unthrottle_lab.drivers import DRIVERS, Timed
from unthrottle_lab.figures import CpuStatDelta, Latency, RunFigures
from unthrottle_lab.isolation import Isolation
from unthrottle_lab.kernel import kernel_hz
from unthrottle_lab.processes import LabError, OtherThreads, Workers, pin_apart, pin_beside
from unthrottle_lab.sampling import PeriodSampler, PeriodSamples, grant_of
from unthrottle_lab.scenario import RunSpec, Scenario
from unthrottle_lab.workload import Workload

_names = itertools.count()
IDLE_PERIODS = 4
"""Idle periods between calibration and the start: three refills, and the timer stops."""
LEAD_NS = 30_000_000
"""Time given to send every worker its first command before the common start."""
CALIBRATION_ATTEMPTS = 3
"""A stall that was a preemption, not a throttle, is retried this many times in all."""
POD_CONTAINER = "container"
"""The name of a pod-quota run's container cgroup inside its pod cgroup."""
POD_SIDECAR = "sidecar"
"""The name of a run's sidecar cgroup inside its pod cgroup (``RunSpec.sidecar``)."""


@dataclass(frozen=True, slots=True)
class LabOptions:
    """How the lab runs each scenario run."""

    phase_us: int = 0
    """Where each run starts after a period boundary, µs (``simulate --phase-ms`` matches it)."""
    cgroup_parent: str = ""
    """Where the run cgroups are created, below each hierarchy's mount point."""
    cgroup_name: str = ""
    """The run cgroup's exact path below each mount (e.g. a container's in a kubelet-like
    tree, for the agent to find); default: a fresh ``unthrottle-lab-…`` in cgroup_parent."""
    existing_cgroup: bool = False
    """``cgroup_name`` exists and is not the lab's (a container's, kept by its kubelet for
    the pod's life): used as it is, never created, written or removed. The run's settings
    are read back from it; the workers are the only processes moved in, and leave it when
    they end. A run whose cgroup changed settings meanwhile gives no figures (LabError)."""
    isolate: bool = False
    """Keep the machine's other processes at idle priority while each run measures
    (``unthrottle_lab.isolation``), so that other load does not move the figures."""
    pin: bool = False
    """Put each worker on a CPU of its own (``processes.pin_apart``) when there are two or
    more and no more than CPUs, as the model places them: left to the scheduler, two workers woken
    together now and then shared one CPU for a whole task while the other ran only
    idle-priority work, and a batch round took twice as long (docs/benchmarks.md §3)."""
    pin_sidecar: bool = False
    """With ``pin`` (and the run's workers pinned): a sidecar's workers too, each on the
    CPU the model places it on, beside the run's workers in turn
    (``processes.pin_beside``); otherwise the scheduler places them, as a pod's."""


def run_scenario(
    scenario: Scenario,
    layout: Layout,
    options: LabOptions = LabOptions(),
    *,
    on_run: Callable[[int, RunFigures], None] | None = None,
) -> list[RunFigures]:
    """Run every run of a scenario in order, each in its own cgroup."""
    workload = scenario.workload.to_workload()
    results = []
    for index, run in enumerate(scenario.runs):
        figures = run_run(workload, run, layout, options)
        results.append(figures)
        if on_run is not None:
            on_run(index, figures)
    return results


def run_run(
    workload: Workload, run: RunSpec | None, layout: Layout, options: LabOptions
) -> RunFigures:
    """Measure one run in a fresh cgroup; the cgroup and the workers are gone afterwards.

    With ``options.existing_cgroup``, in that cgroup as it is: ``run`` None takes its
    settings as they are; a ``run`` given is what the caller expects to find there, and a
    cgroup holding other settings is refused (LabError naming both) before anything starts.
    """
    return _measure(workload, run, layout, options, sample=False)[0]


def settings_of(cgroup: Cgroup) -> RunSpec:
    """The run settings a cgroup holds now: its quota, period and burst, read back."""
    bandwidth = cgroup.read_bandwidth()
    period_ms = bandwidth.period_us / 1000
    try:
        if bandwidth.quota_us is None:
            return RunSpec(period_ms=period_ms)
        return RunSpec(cpus=bandwidth.quota_us / bandwidth.period_us, period_ms=period_ms,
                       burst_ms=bandwidth.burst_us / 1000)  # fmt: skip
    except ValueError as error:  # pydantic's: settings no scenario could ask for
        raise LabError(f"{cgroup.path}: {_text(bandwidth)} is no run's settings: {error}") from None


def _text(bandwidth: Bandwidth) -> str:
    if bandwidth.quota_us is None:
        return f"no quota (period {bandwidth.period_us} µs)"
    return (f"quota {bandwidth.quota_us} µs per {bandwidth.period_us} µs, "
            f"burst {bandwidth.burst_us} µs")  # fmt: skip


def _run_cgroup(run: RunSpec | None, layout: Layout, options: LabOptions) -> tuple[Cgroup, RunSpec]:
    """The run's cgroup (not created yet, unless it is an existing one) and its settings."""
    if not options.existing_cgroup:
        if run is None:
            raise ValueError("a run in a fresh cgroup needs its settings (a RunSpec)")
        name = options.cgroup_name or (
            f"{options.cgroup_parent}/unthrottle-lab-{os.getpid()}-{next(_names)}".strip("/")
        )
        if run.in_pod:  # the container's cgroup inside its pod's, as a kubelet nests them
            name = f"{name}-pod/{POD_CONTAINER}"
        return Cgroup(layout, name), run
    if run is not None and run.in_pod:
        raise ValueError("pod_quota, sidecar: the lab makes the pod cgroup; not with "
                         "existing_cgroup")  # fmt: skip
    if not options.cgroup_name:
        raise ValueError("existing_cgroup: cgroup_name must name the cgroup")
    cgroup = Cgroup(layout, options.cgroup_name)
    if not cgroup.exists():
        raise LabError(f"{cgroup.path}: no such cgroup (existing_cgroup: the lab makes none)")
    found = settings_of(cgroup)
    if run is not None and run.bandwidth() != found.bandwidth():
        raise LabError(f"{cgroup.path} holds {found.label()}, not the {run.label()} expected")
    return cgroup, found


Watch = Callable[[Cgroup, int, int], Callable[[], None]]
"""Called with (cgroup, start ns, period ns) just before a run starts; returns its stop."""


def run_sampled(
    workload: Workload,
    run: RunSpec | None,
    layout: Layout,
    options: LabOptions,
    *,
    watch: Watch | None = None,
) -> tuple[RunFigures, PeriodSamples]:
    """Measure one run and sample its cgroup each period, aligned to the kernel's grid.

    ``watch`` lets other samplers (the agent's, at other phases) observe the same run.
    """
    figures, samples = _measure(workload, run, layout, options, sample=True, watch=watch)
    return figures, samples[0]


def run_pod_sampled(
    workload: Workload, run: RunSpec, layout: Layout, options: LabOptions
) -> tuple[RunFigures, PeriodSamples, PeriodSamples]:
    """Measure a run with a sidecar and sample both containers each period, each on its own
    grid: the run's figures, the container's samples and the sidecar's. Each container's
    samples hold its share of the pod's throttled time (:mod:`unthrottle_lab.sampling`)."""
    if run.sidecar is None:
        raise ValueError("sidecar: run_pod_sampled measures a run with a sidecar")
    figures, samples = _measure(workload, run, layout, options, sample=True)
    return figures, samples[0], samples[1]


@dataclass(slots=True)
class _Sidecar:
    """A run's second container while it runs: its workload, settings, cgroup and workers."""

    workload: Workload
    bandwidth: Bandwidth
    cgroup: Cgroup
    workers: Workers
    grid_ns: int | None = None
    wakeups: list[int] = dataclasses.field(default_factory=list)


def _measure(
    workload: Workload,
    run: RunSpec | None,
    layout: Layout,
    options: LabOptions,
    *,
    sample: bool,
    watch: Watch | None = None,
) -> tuple[RunFigures, list[PeriodSamples]]:
    cgroup, run = _run_cgroup(run, layout, options)
    bandwidth = run.bandwidth()
    period_ns = bandwidth.period_us * 1000
    pod_bandwidth = run.pod_bandwidth()
    pod = Cgroup(layout, cgroup.path.rsplit("/", 1)[0]) if pod_bandwidth else None
    ours = not options.existing_cgroup
    pod_grid_ns = None
    side: _Sidecar | None = None
    samplers: list[PeriodSampler] = []
    isolation = Isolation(layout) if options.isolate else contextlib.nullcontext()
    with isolation, Workers(workload.workers) as workers, contextlib.ExitStack() as stack:
        if pod is not None and pod_bandwidth is not None:
            pod.create()
            stack.callback(pod.remove)  # after the container's, below
            pod.write_bandwidth(pod_bandwidth)
            side = _sidecar(run, pod, stack)
        if ours:
            cgroup.create()
        try:
            pinned = pin_apart(workers.pids) if options.pin else False
            side_pinned = False
            if side is not None and pinned and options.pin_sidecar:
                side_pinned = pin_beside(side.workers.pids, workers.pids)
            for pid in workers.pids:
                cgroup.add_process(pid)
            if pod is not None and pod_bandwidth is not None:
                pod_grid_ns, grid_ns = _calibrate_pod(workers, bandwidth, cgroup,
                                                      pod_bandwidth, pod, side)  # fmt: skip
            else:
                if ours:
                    cgroup.write_bandwidth(bandwidth)
                grid_ns = _calibrate([workers], bandwidth, cgroup) if bandwidth.limited else None
            waits = stack.enter_context(contextlib.closing(WaitReader(layout, cgroup.path)))
            waits.wait_us()  # every worker's thread, counted from here
            side_waits = None
            if side is not None:
                side_waits = stack.enter_context(
                    contextlib.closing(WaitReader(layout, side.cgroup.path))
                )
                side_waits.wait_us()
            # The run's other load (contention), started now: its start-up is done and its
            # threads are busy before the workload starts.
            stack.enter_context(OtherThreads(run.other_threads, layout))
            t0 = _start_time(bandwidth, grid_ns, options.phase_us)
            sleep_until(t0 - LEAD_NS // 3)
            if sample:
                siblings = [side.cgroup] if side is not None else []
                samplers.append(PeriodSampler(cgroup, t0, period_ns, boundary_ns=grid_ns,
                                              pod=pod, grant_us=grant_of(bandwidth),
                                              siblings=siblings))  # fmt: skip
                if side is not None:
                    samplers.append(PeriodSampler(side.cgroup, t0, period_ns,
                                                  boundary_ns=side.grid_ns, pod=pod,
                                                  grant_us=grant_of(side.bandwidth),
                                                  siblings=[cgroup]))  # fmt: skip
            for sampler in samplers:
                sampler.start()
            unwatch = watch(cgroup, t0, bandwidth.period_us * 1000) if watch else None
            before = dataclasses.replace(cgroup.read_stat(), wait_us=waits.wait_us())
            side_before = _stat_with_wait(side, side_waits)
            pod_before = pod.read_stat() if pod is not None else None
            wakeups: list[int] = []
            pool = ThreadPoolExecutor(1) if side is not None else None
            try:
                side_future = None
                if side is not None and pool is not None:
                    side_future = pool.submit(DRIVERS[side.workload.kind], side.workers,
                                              side.workload, t0, side.wakeups)  # fmt: skip
                tasks, end = DRIVERS[workload.kind](workers, workload, t0, wakeups)
                side_tasks, side_end = side_future.result() if side_future else ([], end)
            finally:
                if pool is not None:
                    pool.shutdown(wait=False)  # a driver left waiting ends with its workers
                for sampler in samplers:
                    sampler.stop()
                if unwatch is not None:
                    unwatch()
            after = dataclasses.replace(cgroup.read_stat(), wait_us=waits.wait_us())
            side_after = _stat_with_wait(side, side_waits)
            pod_after = pod.read_stat() if pod is not None else None
            read_at = time.monotonic_ns()
            if not ours and (now := cgroup.read_bandwidth()) != bandwidth:
                raise LabError(f"{cgroup.path}: its settings changed during the run "
                               f"({_text(bandwidth)}, then {_text(now)}): the figures are of "
                               "neither")  # fmt: skip
        finally:
            workers.close()
            if ours:
                cgroup.remove()
            stack.close()  # the other load ends; files close; the sidecar and the pod go
    extra: dict[str, Any] = {
        "isolated": isolation.moved if isinstance(isolation, Isolation) else None,
        # Were the workers each on a CPU of their own (LabOptions.pin)?
        "pinned": pinned,
    }
    if side is not None and side_before is not None and side_after is not None:
        side_delta = _within_span(side_after - side_before, side.grid_ns, period_ns, side_end,
                                  read_at)  # fmt: skip
        side_figures = _figures(run.sidecar_as_given(), side_tasks, side_delta, t0, side_end,
                                side.grid_ns, period_ns, side.wakeups, {})  # fmt: skip
        extra["sidecar"] = side_figures.to_json() | {"pinned": side_pinned}
    if pod_before is not None and pod_after is not None:
        pod_end = max(end, side_end) if side is not None else end
        pod_delta = _within_span(pod_after - pod_before, pod_grid_ns, period_ns, pod_end, read_at)
        extra["pod"] = pod_figures(
            pod_delta.nr_periods, pod_delta.nr_throttled, pod_delta.throttled_us
        )
        if side is not None:  # the pod's usage: its containers' together (counters' sum)
            extra["pod"]["usage_ms"] = round(pod_delta.usage_us / 1000, 3)
        extra["pod_period_phase_ms"] = (
            None if pod_grid_ns is None else ((t0 - pod_grid_ns) % period_ns) / 1e6
        )
    delta = _within_span(after - before, grid_ns, period_ns, end, read_at)
    figures = _figures(run.as_given(), tasks, delta, t0, end, grid_ns, period_ns, wakeups, extra)
    return figures, [sampler.samples() for sampler in samplers]


def _sidecar(run: RunSpec, pod: Cgroup, stack: contextlib.ExitStack) -> _Sidecar | None:
    """The run's sidecar, its cgroup made in the pod's and its workers started (the stack
    kills them, then removes the cgroup); None when the run has none."""
    side_bandwidth = run.sidecar_bandwidth()
    if run.sidecar is None or side_bandwidth is None:
        return None
    side_cgroup = Cgroup(pod.layout, f"{pod.path}/{POD_SIDECAR}")
    side_cgroup.create()
    stack.callback(side_cgroup.remove)  # after its workers are gone
    side_workload = run.sidecar.workload.to_workload()
    side_workers = stack.enter_context(Workers(side_workload.workers))
    for pid in side_workers.pids:
        side_cgroup.add_process(pid)
    return _Sidecar(side_workload, side_bandwidth, side_cgroup, side_workers)


def _stat_with_wait(side: _Sidecar | None, waits: WaitReader | None) -> CpuStat | None:
    if side is None or waits is None:
        return None
    return dataclasses.replace(side.cgroup.read_stat(), wait_us=waits.wait_us())


def _figures(
    limit: dict[str, Any],
    tasks: list[Timed],
    delta: CpuStat,
    t0: int,
    end: int,
    grid_ns: int | None,
    period_ns: int,
    wakeups: list[int],
    extra: dict[str, Any],
) -> RunFigures:
    """One container's figures over its span (``extra`` goes after its own context)."""
    hz = kernel_hz()
    tick_ns = 1_000_000_000 // hz if hz else None
    less_lost = Latency.of([(t.latency_ns - t.lost_ns) / 1e6 for t in tasks])
    return RunFigures(
        limit=limit,
        latency=Latency.of([t.latency_ns / 1e6 for t in tasks]),
        wall_ms=(end - t0) / 1e6,
        stat=CpuStatDelta(
            nr_periods=delta.nr_periods,
            nr_throttled=delta.nr_throttled,
            throttled_us=delta.throttled_us,
            nr_bursts=delta.nr_bursts,
            burst_us=delta.burst_us,
            usage_us=delta.usage_us,
            wait_us=delta.wait_us,
        ),
        extra={
            "period_phase_ms": None if grid_ns is None else ((t0 - grid_ns) % period_ns) / 1e6,
            "tick_phase_ms": None if tick_ns is None else (t0 % tick_ns) / 1e6,
            "hz": hz,
            # How long after its task was due (or sent) a sleeping worker began: the
            # wake-up and dispatch latency the model can take as Machine.wakeup_us.
            "wakeup_ms": round(statistics.median(wakeups) / 1e6, 4) if wakeups else 0.0,
            # How many other processes were kept at idle priority (None: not isolated), and
            # whether the workers each had a CPU of their own (LabOptions.pin): in extra.
            # What the tasks lost to the host (steal: neither running nor waiting for a
            # CPU, worker.py), summed, and the latencies without it, which are what the
            # kernel's CFS made of the run (lab.agreement compares the model with these).
            "lost_ms": round(sum(t.lost_ns for t in tasks) / 1e6, 3),
            "latency_less_lost_ms": less_lost.to_json(),
            **extra,
        },
    )


def _within_span(
    delta: CpuStat, grid_ns: int | None, period_ns: int, end: int, read_at: int
) -> CpuStat:
    """Counters for the span from the start to the end of the last task.

    The controller reads cpu.stat tens of µs after the last task ends; a period
    boundary in that gap counts one more period (the partial one holding the
    end, which is not throttled: the work is done). It is outside the span, so
    it is taken out. The grid is known from the calibration.

    The same timer counts that period's throttle, if there was one: the last
    worker can run out of quota on its way back to user space after it replied
    (kernels from 6.18 throttle a task there), or one CPU's worker while another
    CPU's finishes the last task. A throttle is taken out with the period when
    the counters prove it, i.e. when more throttles than periods would be left,
    which the kernel never shows (it counts a throttle only at a period it
    counts). Otherwise the one throttle stays uncertain; the throttled time past
    the end (at most the gap, per CPU) stays in ``throttled_us`` either way.
    """
    if grid_ns is None or delta.nr_periods == 0:
        return delta
    first_after_end = grid_ns + (-(-(end - grid_ns) // period_ns)) * period_ns
    if end < first_after_end <= read_at:
        periods = delta.nr_periods - 1
        return dataclasses.replace(
            delta, nr_periods=periods, nr_throttled=min(delta.nr_throttled, periods)
        )
    return delta


def sleep_until(at_ns: int) -> None:
    """Sleep until CLOCK_MONOTONIC reaches ``at_ns``."""
    left = at_ns - time.monotonic_ns()
    if left > 0:
        time.sleep(left / 1e9)


def _calibrate(groups: Sequence[Workers], bandwidth: Bandwidth, cgroup: Cgroup) -> int | None:
    """A period boundary of this cgroup (CLOCK_MONOTONIC ns), or None if the quota never ran out.

    Every worker of every group (a pod's containers') burns until it is stopped; the
    quota, shared, runs out within about ``(quota + burst) / workers`` of CPU. The earliest
    resume is a boundary. A stall only counts if the kernel throttled the cgroup meanwhile:
    being preempted by another process also stops a worker for a moment. Such an attempt
    is tried again (each one spends quota, so a throttle soon comes).
    """
    assert bandwidth.quota_us is not None
    period_ns = bandwidth.period_us * 1000
    limit_ns = 3 * period_ns + (bandwidth.quota_us + bandwidth.burst_us) * 1000
    everyone = [(workers, index) for workers in groups for index in range(len(workers.pids))]
    for _ in range(CALIBRATION_ATTEMPTS):
        throttled_before = cgroup.read_stat().nr_throttled
        for workers, index in everyone:
            workers.send(index, f"calibrate {limit_ns}")
        resumes = []
        for workers, index in everyone:
            words = workers.read(index)
            if words[:1] != ["stall"]:
                raise LabError(f"worker {index}: unexpected reply {words}")
            if int(words[2]):
                resumes.append(int(words[2]))
        if not resumes:
            return None  # the quota never ran out: it covers what the workers can use
        if cgroup.read_stat().nr_throttled > throttled_before:
            return min(resumes)
    return None


def _calibrate_pod(
    workers: Workers,
    bandwidth: Bandwidth,
    cgroup: Cgroup,
    pod_bandwidth: Bandwidth,
    pod: Cgroup,
    side: _Sidecar | None = None,
) -> tuple[int | None, int | None]:
    """The pod's period grid and the container's, each calibrated alone; the container's
    quota is written here (and the sidecar's, whose grid goes in ``side.grid_ns``).

    Under a pod quota equal to its own, the container and the pod run out together and
    the workers resume when both have refilled, at the later of two boundaries: neither
    grid. So the pod's grid is calibrated while the containers have no quota yet (every
    worker of both burning), and each container's alone while the pod's quota is lifted
    for a moment (written back at once). A cgroup's grid outlives a quota written and
    lifted: its period timer is re-armed on its old grid (docs/model.md, "Kernel facts" 1
    and 6)."""
    pod_grid = _calibrate([workers, *([side.workers] if side else [])], pod_bandwidth, pod)
    pod.write_quota(None)
    try:
        cgroup.write_bandwidth(bandwidth)
        grid = _calibrate([workers], bandwidth, cgroup)
        if side is not None:
            side.cgroup.write_bandwidth(side.bandwidth)
            side.grid_ns = _calibrate([side.workers], side.bandwidth, side.cgroup)
    finally:
        pod.write_quota(pod_bandwidth.quota_us)
    return pod_grid, grid


def _start_time(bandwidth: Bandwidth, grid_ns: int | None, phase_us: int) -> int:
    now = time.monotonic_ns()
    period_ns = bandwidth.period_us * 1000
    if grid_ns is None:
        return now + max(LEAD_NS, IDLE_PERIODS * period_ns)
    earliest = now + IDLE_PERIODS * period_ns + LEAD_NS
    boundaries = -(-(earliest - grid_ns) // period_ns)
    return grid_ns + boundaries * period_ns + (phase_us * 1000) % period_ns
