"""Simulate a task workload under CFS bandwidth control on a machine with N cores.

What is modelled, because it moves the figures (each checked on the real
kernel, see docs/model.md):

- **One quota for every thread.** All workers draw on one runtime pool; two
  busy threads drain it twice as fast as one.
- **Refill at period boundaries**, ``runtime = min(left + quota, quota + burst)``
  (the kernel's token bucket); debt from an overrun is paid first.
- **When the kernel notices.** A thread that makes syscalls (real services;
  the lab's workers, which read their own CPU clock) is stopped as soon as the
  runtime is spent. A thread that only computes is stopped at the next
  scheduler tick, overrunning by up to ``1/HZ`` and repaying it next period
  (``Accounting.TICK``). A thread that *wakes* when the runtime is spent is
  stopped at once.
- **Runtime kept by a sleeping CPU.** When a worker sleeps, its CPU's run
  queue keeps up to 1 ms (``min_cfs_rq_runtime``); that survives the refill, so
  the next period offers the quota plus it (modelled while workers ≤ cores).
- **Throttling is per CPU.** ``throttled`` time adds up over CPUs with work
  waiting, as the kernel's ``throttled_time`` does.
- **The period timer runs only while the cgroup is active**: a boundary counts
  in ``nr_periods`` while the cgroup used CPU since the previous one (plus the
  first idle period, at whose end the timer stops), and in ``nr_throttled``
  when a worker was throttled at it.
- **Phase and wake-up.** Where the workload starts against the period
  boundaries and the ticks, and how late a sleeping worker runs after its task
  is due (``Machine``).
- **More workers than cores** share the cores evenly (processor sharing); two containers'
  threads on one CPU share it by their groups' weights first (``_Run._speeds``).
- **Other load** (``Machine.other_threads``): busy threads of other processes,
  always runnable, pinned to the cores in turn (as the lab pins them); the
  workers run on the least busy cores, and a core shared by k running workers
  and h such threads gives each worker 1 / (k + h) of it. The workers' **wait**
  (``CpuStatDelta.wait_us``) is the time a worker wanted a CPU and had none:
  throttled, or its share short of a core, as the kernel's schedstat run delay
  counts it (``cgroups.waits``).

- **A pod** (``pod``, ``sidecar``): a pod cgroup's bucket above the container's, and a
  second container's (a sidecar's) beside it, each on a grid of its own
  (:mod:`unthrottle_lab.sim.bucket`); a CPU runs a container's thread only with runtime of its
  container's bucket and the pod's. The run's workers are placed as alone (the lab pins
  them apart); a sidecar's thread wakes on the CPU with the fewest threads the kernel can
  run there (a throttled one is off the run queue).

Not modelled: SMT; how the kernel's group weights lag (they follow load averages). The run
starts after an idle spell, with full buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from unthrottle.cfs.pod import pod_figures
from unthrottle.units import Bandwidth
from unthrottle_lab.figures import CpuStatDelta, Latency, RunFigures
from unthrottle_lab.sim.bucket import EPS as _EPS
from unthrottle_lab.sim.bucket import Bucket
from unthrottle_lab.workload import Kind, Workload

_SNAP = 1e-3  # µs; an event this close before a period boundary happens at the boundary
DEFAULT_HZ = 250
LOAD_MEMORY_US = 32_000
"""How long a thread that stopped running still weighs on its CPU in its group's weight,
µs: the half-life of the kernel's load averages (PELT), which the group weights follow."""
"""CONFIG_HZ of most distribution kernels (Debian, Ubuntu); RHEL uses 1000."""


class Accounting(StrEnum):
    """When the kernel notices that the runtime is spent."""

    IMMEDIATE = "immediate"
    """At once: the thread makes syscalls or other scheduler events (real services do;
    reading its own CPU clock runs ``update_curr``). The lab's workers are such threads."""
    TICK = "tick"
    """At the next scheduler tick: a thread that only computes overruns by up to 1/HZ."""


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine a workload runs on, and where it starts against the kernel's clocks."""

    cores: int
    """CPUs the workers can run on."""
    hz: int = DEFAULT_HZ
    """The kernel's tick rate; the quota is enforced at ticks."""
    period_phase_us: int = 0
    """Time from the last period boundary to the workload's start, in [0, period)."""
    pod_phase_us: int = 0
    """Time from the last boundary of the pod cgroup's own grid to the start (a pod quota)."""
    sidecar_phase_us: int = 0
    """Time from the last boundary of the sidecar's own grid to the start (a second container)."""
    tick_phase_us: int = 0
    """Time from the last tick to the workload's start, in [0, 1/HZ)."""
    wakeup_us: int = 0
    """Delay from a sleeping worker's due time to its running (timer slack, wake-up)."""
    other_threads: int = 0
    """Busy threads of other processes, pinned to the cores in turn (contention)."""
    accounting: Accounting = Accounting.IMMEDIATE
    """When a spent runtime stops the threads (see :class:`Accounting`)."""
    slice_us: int = 5000
    """Runtime a CPU draws from the quota at a time (``sched_cfs_bandwidth_slice_us``). A CPU's
    runtime is its own until spent: it survives the period refill."""
    retained_us: int = 1000
    """Runtime a CPU keeps when its thread sleeps (``min_cfs_rq_runtime``); the rest goes back."""

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError("cores: at least one core is needed")
        if not 1 <= self.hz <= 10_000:
            raise ValueError(f"hz: {self.hz} is not a kernel tick rate")
        if min(self.period_phase_us, self.tick_phase_us, self.pod_phase_us,
               self.sidecar_phase_us) < 0:  # fmt: skip
            raise ValueError("phase: cannot be negative")
        if self.other_threads < 0:
            raise ValueError("other_threads: cannot be negative")

    @property
    def tick_us(self) -> float:
        """Time between ticks, µs."""
        return 1e6 / self.hz


@dataclass(slots=True)
class _Worker:
    remaining: float = 0.0  # CPU µs left in the current task; 0 = no task
    ready_at: float = math.inf  # when the current task may run
    started: float = 0.0  # when the current task counts from (latency start)
    done: int = 0  # tasks finished (serial)
    cpu: int = 0  # the run queue it sits on
    placed: bool = False  # on a run queue for its current task
    woke: bool = True  # the task follows a sleep (a scheduling event), not a running loop
    group: int = 0  # its container: 0 the run's, 1 the sidecar
    last_ran: float = -math.inf  # when it last ran: its load, which lags, weighs its group

    @property
    def busy(self) -> bool:
        return self.remaining > 0


@dataclass(slots=True)
class _Stats:
    usage_us: float = 0.0
    wait_us: float = 0.0
    latencies_us: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Container:
    """One container of the pod while it runs: its workers, their dispatcher, its bucket
    (None without a quota) and what it measured."""

    workers: list[_Worker]
    dispatch: _Dispatcher
    bucket: Bucket | None
    alone: bool
    """Its workers are placed as if alone on the machine (module docstring: the run's
    container; the lab pins its workers apart). Otherwise they wake on the CPU with the
    fewest threads the kernel can run there, of either container."""
    pinned: bool = False
    """Its workers stay on the CPUs they start on (``Sidecar.pinned``)."""
    stats: _Stats = field(default_factory=_Stats)
    end: float = 0.0
    """When its last task ended, µs."""


class _Dispatcher:
    """Hands tasks to workers the way each workload kind does."""

    def __init__(self, workload: Workload, workers: list[_Worker], wakeup_us: float = 0) -> None:
        self.w = workload
        self.wakeup_us = wakeup_us
        self.workers = workers
        self.arrivals = workload.arrivals_us() if workload.kind is Kind.OPEN else []
        self.next_arrival = 0  # index into arrivals
        self.queue: list[float] = []  # arrival times waiting for a worker
        self.round = 0
        self.round_start = 0.0
        self.round_left = 0
        self.latencies = 0  # latencies recorded: tasks (serial, open) or rounds (batch)

    def start(self) -> None:
        if self.w.kind is Kind.SERIAL:
            for worker in self.workers:
                self._give(worker, 0.0)
        elif self.w.kind is Kind.BATCH:
            self._start_round(0.0)

    def _give(self, worker: _Worker, start: float, *, woke: bool = True) -> None:
        worker.remaining = float(self.w.task_cpu_us)
        # A worker that sleeps runs a little after its task is due; latency counts from due.
        worker.ready_at = start + (self.wakeup_us if woke else 0)
        worker.started = start
        worker.woke = woke
        worker.placed = not woke  # a worker that goes straight on stays where it is

    def _start_round(self, t: float) -> None:
        self.round_start = t
        self.round_left = len(self.workers)
        for worker in self.workers:
            self._give(worker, t)

    def next_event(self) -> float:
        if self.next_arrival < len(self.arrivals):
            return self.arrivals[self.next_arrival]
        return math.inf

    def arrive(self, t: float) -> list[_Worker]:
        """Requests arriving at ``t`` go to idle workers or queue; returns workers woken."""
        woken = []
        while (
            self.next_arrival < len(self.arrivals) and self.arrivals[self.next_arrival] <= t + _EPS
        ):
            self.queue.append(self.arrivals[self.next_arrival])
            self.next_arrival += 1
        for worker in self.workers:
            if not self.queue:
                break
            if not worker.busy:
                arrival = self.queue.pop(0)
                self._give(worker, t)
                worker.started = arrival
                woken.append(worker)
        return woken

    def complete(self, worker: _Worker, t: float, stats: _Stats) -> None:
        """``worker`` finished its task at ``t``: record it and hand out the next one."""
        worker.remaining = 0.0
        worker.ready_at = math.inf
        recorded = len(stats.latencies_us)
        kind = self.w.kind
        if kind is Kind.SERIAL:
            stats.latencies_us.append(t - worker.started)
            worker.done += 1
            if worker.done < self.w.tasks:
                # With no think time the worker goes straight on: no wake-up, no enqueue check.
                self._give(worker, t + self.w.think_us, woke=self.w.think_us > 0)
        elif kind is Kind.BATCH:
            self.round_left -= 1
            if self.round_left == 0:
                stats.latencies_us.append(t - self.round_start)
                self.round += 1
                if self.round < self.w.tasks:
                    self._start_round(t + self.w.think_us)
        else:
            stats.latencies_us.append(t - worker.started)
            if self.queue:
                arrival = self.queue.pop(0)
                self._give(worker, t)
                worker.started = arrival
        self.latencies += len(stats.latencies_us) - recorded

    @property
    def all_done(self) -> bool:
        return self.latencies >= self.w.total_tasks


@dataclass(frozen=True, slots=True)
class Sidecar:
    """A second container in the pod, beside the run's: its own workload and bandwidth (its
    own bucket, on a grid that ``Machine.sidecar_phase_us`` places)."""

    workload: Workload
    bandwidth: Bandwidth
    limit: dict[str, float] = field(default_factory=dict)
    """Its settings as given, for its figures' ``limit`` (as ``lab run`` prints them)."""
    wakeup_us: int | None = None
    """Delay from its sleeping worker's due time to its running (the lab measures each
    container's); None: the machine's (``Machine.wakeup_us``)."""
    pinned: bool = False
    """Its workers stay on the CPUs they start on (thread ``i`` of the pod on CPU
    ``i % cpus``, beside the run's workers in turn), as ``lab run --pin`` pins them with
    ``LabOptions.pin_sidecar``; otherwise each wakes on the least busy CPU."""


def simulate_tasks(
    workload: Workload,
    bandwidth: Bandwidth,
    machine: Machine,
    *,
    limit: dict[str, float] | None = None,
    pod: Bandwidth | None = None,
    sidecar: Sidecar | None = None,
) -> RunFigures:
    """Predict one run: latency percentiles, wall time and ``cpu.stat`` figures.

    ``pod``: the pod cgroup's bandwidth above the container's (a pod quota), on a grid of
    its own that ``machine.pod_phase_us`` places; a CPU runs the workers only while it
    holds runtime of both quotas, each drawn and refilled as the container's is. The pod's
    counters come in ``extra["pod"]`` (:func:`unthrottle.cfs.pod.pod_figures`).

    ``sidecar``: a second container in the pod, with a bucket of its own; a CPU runs its
    workers only with runtime of its bucket and the pod's. Its figures come in
    ``extra["sidecar"]`` (the JSON shape of a run's), and the pod's usage, both
    containers', in ``extra["pod"]["usage_ms"]``. Each container's counters are read when
    both have ended, as the lab reads them (:meth:`Bucket.periods_in_span`).

    Each worker stands for its CPU's run queue. It runs on runtime its CPU drew
    from the pool in slices; when that is spent and the pool cannot give more,
    it is throttled until a refill pays its debt. With more workers than cores,
    slices shrink in proportion, so the CPUs together still hold what they would.
    """
    run = _Run(workload, bandwidth, machine, pod, sidecar)
    run.wake_check(0.0)
    while not all(c.dispatch.all_done for c in run.containers):
        run.step()
    main = run.containers[0]
    phase = machine.period_phase_us % bandwidth.period_us
    extra: dict[str, Any] = {"period_phase_ms": phase / 1000, "hz": machine.hz}
    if sidecar is not None:
        side_phase = machine.sidecar_phase_us % sidecar.bandwidth.period_us
        extra["sidecar"] = _figures(run.containers[1], sidecar.limit, {
            "period_phase_ms": side_phase / 1000, "hz": machine.hz}).to_json()  # fmt: skip
    box = run.pod
    if box is not None:
        extra["pod"] = pod_figures(box.nr_periods, box.nr_throttled, round(box.throttled_us))
        if sidecar is not None:  # the pod's usage: both containers' (a one-container pod's
            extra["pod"]["usage_ms"] = round(run.pod_usage_us / 1000, 3)  # is its own)
        extra["pod_period_phase_ms"] = machine.pod_phase_us % box.period / 1000
    return _figures(main, limit if limit is not None else {}, extra)


def _figures(container: _Container, limit: dict[str, float], extra: dict[str, Any]) -> RunFigures:
    """One container's figures over its span."""
    stats, box = container.stats, container.bucket
    periods, throttled = box.periods_in_span() if box is not None else (0, 0)
    return RunFigures(
        limit=limit,
        latency=Latency.of([v / 1000 for v in stats.latencies_us]),
        wall_ms=container.end / 1000,
        stat=CpuStatDelta(
            nr_periods=periods,
            nr_throttled=throttled,
            throttled_us=round(box.throttled_us) if box is not None else 0,
            nr_bursts=box.nr_bursts if box is not None else 0,
            burst_us=round(box.burst_us) if box is not None else 0,
            usage_us=round(stats.usage_us),
            wait_us=round(stats.wait_us),
        ),
        extra=extra,
    )


_Drain = tuple[Bucket, list[float]]
"""A bucket and the CPU time per µs each CPU draws from it."""


class _Run:
    """The state of one simulated run and its steps: placing waking workers, advancing to
    the next event, ending tasks, refilling buckets, checking spent runtime."""

    def __init__(self, workload: Workload, bandwidth: Bandwidth, machine: Machine,
                 pod: Bandwidth | None, sidecar: Sidecar | None) -> None:  # fmt: skip
        threads = workload.workers + (sidecar.workload.workers if sidecar is not None else 0)
        cpus = min(machine.cores, threads)
        self.cpus = cpus
        # Other busy threads, pinned to the CPUs in turn; the workers run on the least busy.
        per_core = [machine.other_threads // machine.cores
                    + (i < machine.other_threads % machine.cores)
                    for i in range(machine.cores)]  # fmt: skip
        self.others = sorted(per_core)[:cpus]
        workers = [_Worker(cpu=i % cpus) for i in range(workload.workers)]
        self.containers = [_Container(workers, _Dispatcher(workload, workers, machine.wakeup_us),
                                      Bucket.of(bandwidth, machine.period_phase_us, cpus),
                                      alone=True)]  # fmt: skip
        if sidecar is not None:
            first = workload.workers
            side = [_Worker(cpu=(first + i) % cpus, group=1)
                    for i in range(sidecar.workload.workers)]  # fmt: skip
            wakeup = machine.wakeup_us if sidecar.wakeup_us is None else sidecar.wakeup_us
            bucket = Bucket.of(sidecar.bandwidth, machine.sidecar_phase_us, cpus)
            self.containers.append(
                _Container(
                    side,
                    _Dispatcher(sidecar.workload, side, wakeup),
                    bucket,
                    alone=False,
                    pinned=sidecar.pinned,
                )
            )
        self.workers = [w for c in self.containers for w in c.workers]
        self.pod = Bucket.of(pod, machine.pod_phase_us, cpus) if pod is not None else None
        self.pod_usage_us = 0.0
        self.buckets = [c.bucket for c in self.containers if c.bucket is not None]
        self.buckets += [self.pod] if self.pod is not None else []
        tick_phase = machine.tick_phase_us % machine.tick_us
        self.tick = machine.tick_us
        self.next_tick = machine.tick_us - tick_phase if tick_phase else machine.tick_us
        self.slice_us = float(machine.slice_us)
        self.keep_us = float(machine.retained_us)
        self.at_ticks = machine.accounting is Accounting.TICK
        self.t = 0.0
        for container in self.containers:
            container.dispatch.start()

    def bucket_of(self, worker: _Worker) -> Bucket | None:
        return self.containers[worker.group].bucket

    def stopped(self, worker: _Worker) -> bool:
        """Its CPU's runtime is spent: its container's quota there, or the pod's."""
        own, box = self.bucket_of(worker), self.pod
        return (own is not None and own.throttled[worker.cpu]) or (
            box is not None and box.throttled[worker.cpu]
        )

    def runnable(self, worker: _Worker, now: float) -> bool:
        return _wanting(worker, now) and worker.placed and not self.stopped(worker)

    def spend_check(self, cpu: int, members: list[_Container]) -> None:
        """Throttle a CPU whose runtime is spent, for the containers with threads there: each
        one's own quota first, then the pod's (a CPU a container's quota stopped runs nothing
        of it the pod is charged for)."""
        for container in members:
            if container.bucket is not None:
                container.bucket.check(cpu, self.slice_us)
        box = self.pod
        if box is not None and any(c.bucket is None or not c.bucket.throttled[cpu]
                                   for c in members):  # fmt: skip
            box.check(cpu, self.slice_us)

    def load(self, cpu: int, now: float, container: _Container) -> int:
        """How busy a CPU is to a waking worker of ``container`` (``_Container.alone``)."""
        if container.alone:
            return sum(1 for w in container.workers
                       if w.cpu == cpu and w.placed and _wanting(w, now))  # fmt: skip
        return sum(1 for w in self.workers if w.cpu == cpu and self.runnable(w, now))

    def wake_check(self, now: float) -> None:
        """A waking worker goes to the least busy CPU (its last one on a tie), as wake-up
        balancing does; if that CPU's runtime is spent and the pool is empty, it is stopped."""
        for worker in self.workers:
            if worker.placed or not _wanting(worker, now):
                continue
            container = self.containers[worker.group]
            if not container.pinned:
                loads = [self.load(i, now, container) for i in range(self.cpus)]
                best = min(loads)
                worker.cpu = worker.cpu if loads[worker.cpu] == best else loads.index(best)
            worker.placed = True
            if container.bucket is not None:
                container.bucket.timer_active = True
            if self.pod is not None:
                self.pod.timer_active = True
            if self.buckets:
                self.spend_check(worker.cpu, [container])

    def step(self) -> None:
        """Advance to the next event and handle what happens at it."""
        t = self.t
        running = [w for w in self.workers if self.runnable(w, t)]
        speed = self._speeds(running)
        cpu_rate = [0.0] * self.cpus  # CPU time per µs, per CPU: every container's
        rates = [[0.0] * self.cpus for _ in self.containers]  # the same, per container
        for worker in running:
            cpu_rate[worker.cpu] += speed[id(worker)]
            rates[worker.group][worker.cpu] += speed[id(worker)]
        drains = [(c.bucket, r) for c, r in zip(self.containers, rates, strict=True)
                  if c.bucket is not None]  # fmt: skip
        drains += [(self.pod, cpu_rate)] if self.pod is not None else []
        nxt = self._next_event(running, speed, drains)
        dt = max(0.0, nxt - t)
        self._advance(dt, running, speed, rates, drains)
        self.t = t = nxt
        self._end_tasks([w for w in running if w.remaining <= _EPS])
        # Period boundaries: count, refill, pay debts and unthrottle, maybe stop the timer. A
        # refill that falls on a tick comes first, so a quota covering every CPU never throttles.
        for box in self.buckets:
            while box.next_boundary <= t + _EPS:
                box.refill()
        for container in self.containers:
            if container.bucket is not None and container.dispatch.all_done:
                container.bucket.ended()
        # Spent runtime stops a CPU's workers: at once, or at the next tick.
        at_tick = self.next_tick <= t + _EPS
        while self.next_tick <= t + _EPS:
            self.next_tick += self.tick
        if self.buckets and (at_tick or not self.at_ticks):
            for index in range(self.cpus):
                members = [c for c in self.containers if any(
                    w.cpu == index and self.runnable(w, t) for w in c.workers)]  # fmt: skip
                if members:
                    self.spend_check(index, members)
        # Arrivals and wake-ups.
        for container in self.containers:
            container.dispatch.arrive(t)
        self.wake_check(t)

    def _speeds(self, running: list[_Worker]) -> dict[int, float]:
        """The share of its CPU each running worker gets, by ``id``.

        A CPU shared by k running workers and h busy threads of other processes gives the
        workers k / (k + h) of it: each 1 / (k + h) where they are of one container. Where
        they are of both, the kernel weighs the containers' groups first
        (``calc_group_shares``): a group's weight is spread over the CPUs its load is on, in
        proportion to its threads there, so a container with one thread on each of two CPUs
        weighs half as much on each as a sidecar with its one thread on one; within a group
        its threads share evenly. The load is an average that lags (``LOAD_MEMORY_US``): a
        thread that ran within it still weighs on its CPU, so the batch's worker that waits
        a few ms for its round's other task leaves the sidecar 2/3 of the CPU they share,
        not 1/2 (measured with the sidecar pinned: its p95 23.2-24.0 ms, 15 ms of work).
        """
        on_cpu = [[0] * len(self.containers) for _ in range(self.cpus)]
        for worker in running:
            on_cpu[worker.cpu][worker.group] += 1
        loaded = [[0] * len(self.containers) for _ in range(self.cpus)]
        ran = {id(w) for w in running}
        for worker in self.workers:
            if id(worker) in ran or self.t - worker.last_ran < LOAD_MEMORY_US:
                loaded[worker.cpu][worker.group] += 1
        anywhere = [sum(cpu[g] for cpu in loaded) for g in range(len(self.containers))]
        speed = {}
        for worker in running:
            here = on_cpu[worker.cpu]
            sharing = sum(here)
            even = 1.0 / (sharing + self.others[worker.cpu])
            if here[worker.group] == sharing:  # one container's threads alone on the CPU
                speed[id(worker)] = even
                continue
            weights = [
                load / total if k else 0.0
                for k, load, total in zip(here, loaded[worker.cpu], anywhere, strict=True)
            ]
            group = weights[worker.group] / sum(weights)
            speed[id(worker)] = even * sharing * group / here[worker.group]
        return speed

    def _next_event(self, running: list[_Worker], speed: dict[int, float],
                    drains: list[_Drain]) -> float:  # fmt: skip
        t = self.t
        candidates = [c.dispatch.next_event() for c in self.containers]
        candidates += [w.ready_at for w in self.workers if w.busy and w.ready_at > t + _EPS]
        if running:
            candidates.append(t + min(w.remaining / speed[id(w)] for w in running))
        candidates += [box.next_boundary for box in self.buckets if box.due]
        if self.buckets and running:
            if self.at_ticks:
                candidates.append(self.next_tick)
            else:  # a CPU's runtime of a bucket runs out
                candidates += [t + local / r for box, rate in drains
                               for local, r in zip(box.local, rate, strict=True)
                               if r > 0 and local > _EPS]  # fmt: skip
        nxt = min(candidates)
        for box in self.buckets:
            if 0 < box.next_boundary - nxt < _SNAP:
                nxt = box.next_boundary  # the same instant, up to float error: refill first
        if nxt == math.inf:  # pragma: no cover - a stuck simulation is a bug
            raise RuntimeError("simulation stalled with work left")
        return nxt

    def _advance(self, dt: float, running: list[_Worker], speed: dict[int, float],
                 rates: list[list[float]], drains: list[_Drain]) -> None:  # fmt: skip
        """``dt`` passes: work done, runtime spent, usage, waits and throttled time counted.
        A worker that wants a CPU waits for the part of dt it does not run."""
        t = self.t
        for worker in self.workers:
            if worker.placed and _wanting(worker, t):
                stats = self.containers[worker.group].stats
                stats.wait_us += (1.0 - speed.get(id(worker), 0.0)) * dt
        for worker in running:
            worker.remaining -= dt * speed[id(worker)]
            worker.last_ran = t + dt
        for box, rate in drains:
            for cpu, r in enumerate(rate):
                box.local[cpu] -= r * dt
        for container, rate in zip(self.containers, rates, strict=True):
            used = sum(rate) * dt
            container.stats.usage_us += used
            if container.bucket is not None:
                container.bucket.used_since_boundary += used
                container.bucket.throttled_us += dt * _stalled(container.workers,
                                                               container.bucket, t)  # fmt: skip
        if self.pod is not None:
            used = sum(drains[-1][1]) * dt
            self.pod_usage_us += used
            self.pod.used_since_boundary += used
            self.pod.throttled_us += dt * _stalled(self.workers, self.pod, t)

    def _end_tasks(self, finished: list[_Worker]) -> None:
        """Tasks that finished. A CPU whose run queue of a cgroup empties (no worker of it
        there goes straight on without sleeping) gives back its runtime beyond
        ``retained_us``: a container's for its own workers, the pod's for either's."""
        t = self.t
        for worker in finished:
            container = self.containers[worker.group]
            container.dispatch.complete(worker, t, container.stats)
            container.end = t
        for group, container in enumerate(self.containers):
            if container.bucket is not None:
                for cpu in {w.cpu for w in finished if w.group == group}:
                    if not self._goes_on(cpu, container.workers):
                        container.bucket.give_back(cpu, self.keep_us)
        if self.pod is not None:
            for cpu in {w.cpu for w in finished}:
                if not self._goes_on(cpu, self.workers):
                    self.pod.give_back(cpu, self.keep_us)

    def _goes_on(self, cpu: int, workers: list[_Worker]) -> bool:
        t = self.t
        return any(w.cpu == cpu and _wanting(w, t) and not w.woke for w in workers) or any(
            w.cpu == cpu and self.runnable(w, t) and w.ready_at < t - _EPS for w in workers
        )


def _wanting(worker: _Worker, now: float) -> bool:
    return worker.busy and worker.ready_at <= now + _EPS


def _stalled(workers: list[_Worker], box: Bucket, now: float) -> int:
    """CPUs whose run queue of ``box``'s cgroup is throttled with work waiting on it."""
    return len({w.cpu for w in workers if _wanting(w, now) and box.throttled[w.cpu]})
