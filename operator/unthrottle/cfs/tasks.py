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
- **More workers than cores** share the cores evenly (processor sharing).
- **Other load** (``Machine.other_threads``): busy threads of other processes,
  always runnable, pinned to the cores in turn (as the lab pins them); the
  workers run on the least busy cores, and a core shared by k running workers
  and h such threads gives each worker 1 / (k + h) of it. The workers' **wait**
  (``CpuStatDelta.wait_us``) is the time a worker wanted a CPU and had none:
  throttled, or its share short of a core, as the kernel's schedstat run delay
  counts it (``cgroups.waits``).

Not modelled: the per-CPU 5 ms runtime slices (they split the quota between
CPUs, they do not change it), SMT. The run starts
after an idle spell, with a full bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from unthrottle.cfs.figures import CpuStatDelta, Latency, RunFigures
from unthrottle.cfs.pod import pod_figures
from unthrottle.cfs.settings import Bandwidth
from unthrottle.cfs.workload import Kind, Workload

_EPS = 1e-6  # µs; events closer than this are simultaneous
_SNAP = 1e-3  # µs; an event this close before a period boundary happens at the boundary
DEFAULT_HZ = 250
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
        if min(self.period_phase_us, self.tick_phase_us, self.pod_phase_us) < 0:
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

    @property
    def busy(self) -> bool:
        return self.remaining > 0


@dataclass(slots=True)
class _Cpu:
    local: float = 0.0  # runtime drawn from the quota and not yet spent (< 0: a debt)
    throttled: bool = False
    pod_local: float = 0.0  # the same, of the pod's quota (its cfs_rq on this CPU)
    pod_throttled: bool = False

    @property
    def stopped(self) -> bool:
        """Throttled by the container's quota or the pod's."""
        return self.throttled or self.pod_throttled


@dataclass(slots=True)
class _Pod:
    """The pod cgroup's bucket and grid (a pod quota): as the container's, its own."""

    quota: float
    burst: float
    period: float
    next_boundary: float
    pool: float = 0.0
    timer_active: bool = False
    used_since_boundary: float = 0.0
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_us: float = 0.0


@dataclass(slots=True)
class _Clock:
    """Period boundaries and ticks relative to the workload's start."""

    period: float
    tick: float
    next_boundary: float
    next_tick: float


@dataclass(slots=True)
class _Stats:
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_us: float = 0.0
    nr_bursts: int = 0
    burst_us: float = 0.0
    usage_us: float = 0.0
    wait_us: float = 0.0
    latencies_us: list[float] = field(default_factory=list)


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


def simulate_tasks(
    workload: Workload,
    bandwidth: Bandwidth,
    machine: Machine,
    *,
    limit: dict[str, float] | None = None,
    pod: Bandwidth | None = None,
) -> RunFigures:
    """Predict one run: latency percentiles, wall time and ``cpu.stat`` figures.

    ``pod``: the pod cgroup's bandwidth above the container's (a pod quota), on a grid of
    its own that ``machine.pod_phase_us`` places; a CPU runs the workers only while it
    holds runtime of both quotas, each drawn and refilled as the container's is. The pod's
    counters come in ``extra["pod"]`` (:func:`unthrottle.cfs.pod.pod_figures`).

    Each worker stands for its CPU's run queue. It runs on runtime its CPU drew
    from the pool in slices; when that is spent and the pool cannot give more,
    it is throttled until a refill pays its debt. With more workers than cores,
    slices shrink in proportion, so the CPUs together still hold what they would.
    """
    quota = bandwidth.quota_us
    limited = quota is not None
    period = float(bandwidth.period_us)
    burst = float(bandwidth.burst_us)
    phase = machine.period_phase_us % bandwidth.period_us
    tick_phase = machine.tick_phase_us % machine.tick_us
    clock = _Clock(
        period=period,
        tick=machine.tick_us,
        next_boundary=period - phase if phase else period,
        next_tick=machine.tick_us - tick_phase if tick_phase else machine.tick_us,
    )
    slice_us = float(machine.slice_us)
    keep_us = float(machine.retained_us)
    at_ticks = machine.accounting is Accounting.TICK
    pool = float(quota) + burst if quota is not None else math.inf
    snap = pool  # runtime at the last refill, for burst accounting
    timer_active = False
    used_since_boundary = 0.0

    box = None
    if pod is not None and pod.quota_us is not None:
        pod_period = float(pod.period_us)
        pod_phase = machine.pod_phase_us % pod.period_us
        box = _Pod(float(pod.quota_us), float(pod.burst_us), pod_period,
                   pod_period - pod_phase if pod_phase else pod_period,
                   float(pod.quota_us + pod.burst_us))  # fmt: skip
    bounded = limited or box is not None

    cpus = [_Cpu() for _ in range(min(machine.cores, workload.workers))]
    # Other busy threads, pinned to the CPUs in turn; the workers run on the least busy.
    per_core = [machine.other_threads // machine.cores + (i < machine.other_threads % machine.cores)
                for i in range(machine.cores)]  # fmt: skip
    others = sorted(per_core)[: len(cpus)]
    workers = [_Worker(cpu=i % len(cpus)) for i in range(workload.workers)]
    stats = _Stats()
    dispatch = _Dispatcher(workload, workers, machine.wakeup_us)
    dispatch.start()
    t = 0.0
    end = 0.0

    def draw(cpu: _Cpu) -> bool:
        """Top up a CPU's runtime from the pool (``assign_cfs_rq_runtime``); False: throttle."""
        nonlocal pool
        if cpu.local > _EPS:
            return True
        take = min(slice_us - cpu.local, max(pool, 0.0))
        cpu.local += take
        pool -= take
        return cpu.local > _EPS

    def draw_pod(cpu: _Cpu) -> bool:
        """The same from the pod's pool, for the pod's run queue on that CPU."""
        assert box is not None
        if cpu.pod_local > _EPS:
            return True
        take = min(slice_us - cpu.pod_local, max(box.pool, 0.0))
        cpu.pod_local += take
        box.pool -= take
        return cpu.pod_local > _EPS

    def spend_check(cpu: _Cpu) -> None:
        """Throttle a CPU whose runtime is spent: the container's first, then the pod's (a
        CPU the container's quota stopped runs nothing the pod is charged for)."""
        if limited and not cpu.throttled and not draw(cpu):
            cpu.throttled = True
        if box is not None and not cpu.stopped and not draw_pod(cpu):
            cpu.pod_throttled = True

    def wanting(worker: _Worker, now: float) -> bool:
        return worker.busy and worker.ready_at <= now + _EPS

    def runnable(worker: _Worker, now: float) -> bool:
        return wanting(worker, now) and worker.placed and not cpus[worker.cpu].stopped

    def queued(index: int, now: float) -> int:
        return sum(1 for w in workers if w.cpu == index and w.placed and wanting(w, now))

    def wake_check(now: float) -> None:
        # A waking worker goes to the least busy CPU (its last one on a tie), as wake-up
        # balancing does; if that CPU's runtime is spent and the pool is empty, it is stopped.
        nonlocal timer_active
        for worker in workers:
            if worker.placed or not wanting(worker, now):
                continue
            loads = [queued(i, now) for i in range(len(cpus))]
            best = min(loads)
            worker.cpu = worker.cpu if loads[worker.cpu] == best else loads.index(best)
            worker.placed = True
            if limited:
                timer_active = True
            if box is not None:
                box.timer_active = True
            if bounded:
                spend_check(cpus[worker.cpu])

    wake_check(t)
    while not dispatch.all_done:
        running = [w for w in workers if runnable(w, t)]
        n = len(running)
        sharing = [0] * len(cpus)  # each CPU is shared evenly by its running workers
        for worker in running:
            sharing[worker.cpu] += 1
        # A CPU shared by k running workers and h busy threads of other processes gives
        # each worker 1 / (k + h) of it.
        speed = {id(w): 1.0 / (sharing[w.cpu] + others[w.cpu]) for w in running}
        cpu_rate = [0.0] * len(cpus)
        for worker in running:
            cpu_rate[worker.cpu] += speed[id(worker)]

        candidates = [dispatch.next_event()]
        candidates += [w.ready_at for w in workers if w.busy and w.ready_at > t + _EPS]
        if n:
            candidates.append(t + min(w.remaining / speed[id(w)] for w in running))
        if limited and (timer_active or any(c.throttled for c in cpus)):
            candidates.append(clock.next_boundary)
        if box is not None and (box.timer_active or any(c.pod_throttled for c in cpus)):
            candidates.append(box.next_boundary)
        if bounded and n:
            if at_ticks:
                candidates.append(clock.next_tick)
            else:
                candidates += [
                    t + local / r for c, r in zip(cpus, cpu_rate, strict=True)
                    for local in ((c.local,) if limited else ()) + (
                        (c.pod_local,) if box is not None else ())
                    if r > 0 and local > _EPS
                ]  # fmt: skip
        nxt = min(candidates)
        if limited and 0 < clock.next_boundary - nxt < _SNAP:
            nxt = clock.next_boundary  # the same instant, up to float error: refill first
        if box is not None and 0 < box.next_boundary - nxt < _SNAP:
            nxt = box.next_boundary
        if nxt == math.inf:  # pragma: no cover - a stuck simulation is a bug
            raise RuntimeError("simulation stalled with work left")
        dt = max(0.0, nxt - t)

        # Advance. A worker that wants a CPU waits for the part of dt it does not run.
        for worker in workers:
            if worker.placed and wanting(worker, t):
                stats.wait_us += (1.0 - speed.get(id(worker), 0.0)) * dt
        for worker in running:
            worker.remaining -= dt * speed[id(worker)]
        for cpu, r in zip(cpus, cpu_rate, strict=True):
            cpu.local -= r * dt if limited else 0.0
            cpu.pod_local -= r * dt if box is not None else 0.0
        used = sum(cpu_rate) * dt
        stats.usage_us += used
        used_since_boundary += used
        stalled = {w.cpu for w in workers if wanting(w, t) and cpus[w.cpu].throttled}
        stats.throttled_us += len(stalled) * dt
        if box is not None:
            box.used_since_boundary += used
            stalled = {w.cpu for w in workers if wanting(w, t) and cpus[w.cpu].pod_throttled}
            box.throttled_us += len(stalled) * dt
        t = nxt

        # Tasks that finished. A CPU whose run queue empties (no worker on it goes straight on
        # without sleeping) gives back its runtime beyond `retained_us`.
        finished = [w for w in running if w.remaining <= _EPS]
        for worker in finished:
            dispatch.complete(worker, t, stats)
            end = t
        for index in {w.cpu for w in finished}:
            goes_on = any(w.cpu == index and wanting(w, t) and not w.woke for w in workers) or any(
                w.cpu == index and runnable(w, t) and w.ready_at < t - _EPS for w in workers
            )
            if limited and not goes_on and cpus[index].local > keep_us:
                pool += cpus[index].local - keep_us
                cpus[index].local = keep_us
            if box is not None and not goes_on and cpus[index].pod_local > keep_us:
                box.pool += cpus[index].pod_local - keep_us
                cpus[index].pod_local = keep_us
        # Period boundary: count, refill, pay debts and unthrottle, maybe stop the timer. A
        # refill that falls on a tick comes first, so a quota covering every CPU never throttles.
        while limited and clock.next_boundary <= t + _EPS:
            if timer_active:
                assert quota is not None
                throttled_now = any(c.throttled for c in cpus)
                stats.nr_periods += 1
                stats.nr_throttled += int(throttled_now)
                spent = snap - pool  # global runtime handed out in the period
                if spent > quota + _EPS and burst > 0:
                    stats.nr_bursts += 1
                    stats.burst_us += spent - quota
                pool = min(pool + quota, quota + burst)
                snap = pool
                for cpu in cpus:
                    debt = max(0.0, -cpu.local)
                    if cpu.throttled and pool > debt:
                        pool -= debt
                        cpu.local = 0.0
                        cpu.throttled = False
                if used_since_boundary <= _EPS and not throttled_now:
                    timer_active = False
            used_since_boundary = 0.0
            clock.next_boundary += clock.period
        while box is not None and box.next_boundary <= t + _EPS:
            _refill_pod(box, cpus)
        # Spent runtime stops a CPU's workers: at once, or at the next tick.
        at_tick = clock.next_tick <= t + _EPS
        while clock.next_tick <= t + _EPS:
            clock.next_tick += clock.tick
        if bounded and (at_tick or not at_ticks):
            for index, cpu in enumerate(cpus):
                if any(w.cpu == index and runnable(w, t) for w in workers):
                    spend_check(cpu)
        # Arrivals and wake-ups.
        dispatch.arrive(t)
        wake_check(t)

    figures_stat = CpuStatDelta(
        nr_periods=stats.nr_periods,
        nr_throttled=stats.nr_throttled,
        throttled_us=round(stats.throttled_us),
        nr_bursts=stats.nr_bursts,
        burst_us=round(stats.burst_us),
        usage_us=round(stats.usage_us),
        wait_us=round(stats.wait_us),
    )
    return RunFigures(
        limit=limit if limit is not None else {},
        latency=Latency.of([v / 1000 for v in stats.latencies_us]),
        wall_ms=end / 1000,
        stat=figures_stat,
        extra={
            "period_phase_ms": phase / 1000,
            "hz": machine.hz,
            **(
                {}
                if box is None
                else {
                    "pod": pod_figures(box.nr_periods, box.nr_throttled, round(box.throttled_us)),
                    "pod_period_phase_ms": machine.pod_phase_us % box.period / 1000,
                }
            ),
        },
    )


def _refill_pod(box: _Pod, cpus: list[_Cpu]) -> None:
    """The pod's period boundary: count, refill, pay debts and unthrottle, maybe stop the
    timer (as the container's, on the pod's own grid)."""
    if box.timer_active:
        throttled_now = any(c.pod_throttled for c in cpus)
        box.nr_periods += 1
        box.nr_throttled += int(throttled_now)
        box.pool = min(box.pool + box.quota, box.quota + box.burst)
        for cpu in cpus:
            debt = max(0.0, -cpu.pod_local)
            if cpu.pod_throttled and box.pool > debt:
                box.pool -= debt
                cpu.pod_local = 0.0
                cpu.pod_throttled = False
        if box.used_since_boundary <= _EPS and not throttled_now:
            box.timer_active = False
    box.used_since_boundary = 0.0
    box.next_boundary += box.period
