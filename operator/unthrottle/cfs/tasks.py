"""Simulate a task workload under CFS bandwidth control on a machine with N cores.

What is modelled, because it moves the figures (each checked on the real
kernel, see docs/model.md):

- **One quota for every thread.** All workers draw on one runtime pool; two
  busy threads drain it twice as fast as one.
- **Refill at period boundaries**, ``runtime = min(left + quota, quota + burst)``
  (the kernel's token bucket); debt from an overrun is paid first.
- **Enforcement at scheduler ticks.** A running thread is only stopped at a
  tick (every ``1/HZ`` s; HZ = 250 gives 4 ms) once the runtime is spent, so it
  overruns the quota by up to one tick, and that overrun is owed by the next
  period. A thread that *wakes* when the runtime is spent is stopped at once.
- **Throttling is per CPU.** Each running worker sits on its own CPU's run
  queue; one is stopped at its tick while another still runs. ``throttled``
  time adds up over CPUs, as the kernel's ``throttled_time`` does.
- **The period timer runs only while the cgroup is active**: a boundary counts
  in ``nr_periods`` while the cgroup used CPU since the previous one (plus the
  first idle period, at whose end the timer stops), and in ``nr_throttled``
  when a worker was throttled at it.
- **Phase.** Where the workload starts relative to the period boundaries and
  to the ticks (``Machine.period_phase_us``, ``Machine.tick_phase_us``).
- **More workers than cores** share the cores evenly (processor sharing).

Not modelled: the per-CPU 5 ms runtime slices and their slack return, wake-up
and context-switch latency, other load on the machine, SMT. The run starts
after an idle spell, with a full bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from unthrottle.cfs.figures import CpuStatDelta, Latency, RunFigures
from unthrottle.cfs.settings import Bandwidth
from unthrottle.cfs.workload import Kind, Workload

_EPS = 1e-6  # µs; events closer than this are simultaneous
DEFAULT_HZ = 250
"""CONFIG_HZ of most distribution kernels (Debian, Ubuntu); RHEL uses 1000."""


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine a workload runs on, and where it starts against the kernel's clocks."""

    cores: int
    """CPUs the workers can run on."""
    hz: int = DEFAULT_HZ
    """The kernel's tick rate; the quota is enforced at ticks."""
    period_phase_us: int = 0
    """Time from the last period boundary to the workload's start, in [0, period)."""
    tick_phase_us: int = 0
    """Time from the last tick to the workload's start, in [0, 1/HZ)."""

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError("cores: at least one core is needed")
        if not 1 <= self.hz <= 10_000:
            raise ValueError(f"hz: {self.hz} is not a kernel tick rate")
        if self.period_phase_us < 0 or self.tick_phase_us < 0:
            raise ValueError("phase: cannot be negative")

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
    throttled: bool = False
    woke: bool = True  # the task follows a sleep (a scheduling event), not a running loop

    @property
    def busy(self) -> bool:
        return self.remaining > 0


@dataclass(slots=True)
class _Clock:
    """Period boundaries and ticks relative to the workload's start."""

    period: float
    tick: float
    next_boundary: float
    next_tick: float

    def first_tick_at_or_after(self, t: float) -> float:
        if t <= self.next_tick + _EPS:
            return self.next_tick
        steps = math.ceil((t - self.next_tick - _EPS) / self.tick)
        return self.next_tick + steps * self.tick


@dataclass(slots=True)
class _Stats:
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_us: float = 0.0
    nr_bursts: int = 0
    burst_us: float = 0.0
    usage_us: float = 0.0
    latencies_us: list[float] = field(default_factory=list)


class _Dispatcher:
    """Hands tasks to workers the way each workload kind does."""

    def __init__(self, workload: Workload, workers: list[_Worker]) -> None:
        self.w = workload
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
        worker.ready_at = start
        worker.started = start
        worker.woke = woke

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
                    self._start_round(t)
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
) -> RunFigures:
    """Predict one run: latency percentiles, wall time and ``cpu.stat`` figures."""
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
    pool = float(quota) + burst if quota is not None else math.inf
    snap = pool  # runtime at the last refill, for burst accounting
    timer_active = False
    used_since_boundary = 0.0

    workers = [_Worker() for _ in range(workload.workers)]
    stats = _Stats()
    dispatch = _Dispatcher(workload, workers)
    dispatch.start()
    t = 0.0
    end = 0.0

    def wake_check(now: float) -> None:
        # A worker whose task becomes runnable while the runtime is spent is throttled at once.
        nonlocal timer_active
        for worker in workers:
            runnable = worker.busy and worker.ready_at <= now + _EPS and not worker.throttled
            if runnable and limited:
                timer_active = True
                if pool <= 0 and worker.woke and worker.ready_at >= now - _EPS:
                    worker.throttled = True

    wake_check(t)
    while not dispatch.all_done:
        running = [w for w in workers if w.busy and w.ready_at <= t + _EPS and not w.throttled]
        waiting_throttled = [w for w in workers if w.busy and w.throttled]
        n = len(running)
        rate = min(1.0, machine.cores / n) if n else 0.0
        drain = rate * n

        candidates = [dispatch.next_event()]
        candidates += [w.ready_at for w in workers if w.busy and w.ready_at > t + _EPS]
        if n:
            candidates.append(t + min(w.remaining for w in running) / rate)
        if limited and (timer_active or waiting_throttled):
            candidates.append(clock.next_boundary)
        if limited and n:
            exhausted = t + max(pool, 0.0) / drain
            candidates.append(clock.first_tick_at_or_after(exhausted))
        nxt = min(candidates)
        if nxt == math.inf:  # pragma: no cover - a stuck simulation is a bug
            raise RuntimeError("simulation stalled with work left")
        dt = max(0.0, nxt - t)

        # Advance.
        for worker in running:
            worker.remaining -= rate * dt
        used = drain * dt
        stats.usage_us += used
        used_since_boundary += used
        if limited:
            pool -= used
        stats.throttled_us += min(len(waiting_throttled), machine.cores) * dt
        t = nxt

        # Tasks that finished.
        for worker in running:
            if worker.remaining <= _EPS:
                dispatch.complete(worker, t, stats)
                end = t
        # Period boundary: count, refill, unthrottle, maybe stop the timer. A refill that
        # falls on a tick comes first, so a quota covering every CPU never throttles.
        while limited and clock.next_boundary <= t + _EPS:
            if timer_active:
                assert quota is not None
                throttled_now = any(w.throttled for w in workers)
                stats.nr_periods += 1
                stats.nr_throttled += int(throttled_now)
                spent = snap - pool  # global runtime consumed in the period
                pool_after = pool + quota
                if spent > quota + _EPS and burst > 0:
                    stats.nr_bursts += 1
                    stats.burst_us += spent - quota
                pool = min(pool_after, quota + burst)
                snap = max(pool, 0.0)
                if pool > 0:
                    for worker in workers:
                        worker.throttled = False
                if used_since_boundary <= _EPS and not throttled_now:
                    timer_active = False
            used_since_boundary = 0.0
            clock.next_boundary += clock.period
        # Ticks: a running worker is stopped once the runtime is spent.
        while clock.next_tick <= t + _EPS:
            if limited and pool <= _EPS:
                for worker in workers:
                    if worker.busy and worker.ready_at <= t + _EPS:
                        worker.throttled = True
            clock.next_tick += clock.tick
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
    )
    return RunFigures(
        limit=limit if limit is not None else {},
        latency=Latency.of([v / 1000 for v in stats.latencies_us]),
        wall_ms=end / 1000,
        stat=figures_stat,
        extra={"period_phase_ms": phase / 1000, "hz": machine.hz},
    )
