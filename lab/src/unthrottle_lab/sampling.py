"""Per-period samples of a lab run: usage, throttled time and wait, aligned with the kernel.

This is the period-level evidence the recommendation engine takes: demand =
usage + the larger of throttled time and wait, per period. Observed usage alone
is censored by the quota (DESIGN.md §2), and on a busy machine also by the other
processes: a thread waiting for a CPU is neither running nor throttled. The
wait (``cgroups.waits``: the threads' schedstat run delay) holds the throttled
waits too, so the larger of the two is taken, never their sum.

The lab knows the cgroup's period grid (it calibrated it), so readings are
taken 1 ms after each boundary: the kernel adds a period's throttled time
when it unthrottles, at the refill, and 1 ms leaves time for that. (The node
agent cannot see the grid; how much that costs it is measured in
bench/window_alignment.py.)

**A reading taken late** (the sampler thread waits its turn on a busy machine) does
not split the counters in proportion to time: the throttled time of a period is booked
at its refill, while usage runs on, on the next period's quota. A window that ends 40 ms
late holds one refill, one period's throttled time and up to two quotas' usage; the
next, one refill and the usage that is left. And a refill can come after the reading:
the period timer (``nr_periods`` unchanged), or one CPU's unthrottle, books its stall in
the next window. So a window's counters are attributed by the refills it holds
(:func:`attribute`; docs/benchmarks.md §3, "Late readings").

**A pod of two containers** (a run's ``sidecar``): the pod's throttled time stalls both, and
each container's samples hold its share of it, window by window, by the rule the
operator's evidence uses (:func:`unthrottle.evidence.pods.share_pod_throttling`: time
in proportion to usage). The sampler reads the other container's usage at each of its
own readings, so both usages are of the same window.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unthrottle.cfs.pod import stalled_us
from unthrottle.cgroups import Cgroup, CpuStat, Layout
from unthrottle.cgroups.counters import CounterReader
from unthrottle.cgroups.waits import WaitReader
from unthrottle.evidence.pods import share_pod_throttling
from unthrottle.units import Bandwidth
from unthrottle_lab.schedule import ScheduledReader

AFTER_BOUNDARY_NS = 1_000_000
LATE_NS = 5_000_000
"""A reading this long after its boundary is late (the sampler aims at 1 ms after it):
the usage it holds of the next period can pass what the period before could use."""
Reading = tuple[int, CpuStat]
"""When a reading was taken (CLOCK_MONOTONIC ns), and the counters it read."""


@dataclass(frozen=True, slots=True)
class PeriodSamples:
    """Per-period usage and throttled time (µs) of one run."""

    usage_us: npt.NDArray[np.int64]
    throttled_us: npt.NDArray[np.int64]
    period_us: int
    wait_us: npt.NDArray[np.int64] | None = None
    """Per-period wait of the threads (throttled or behind other processes), if read."""
    threads: int = 0
    """The most threads the cgroup had while it was sampled (0: not read)."""
    pod_throttled_us: npt.NDArray[np.int64] | None = None
    """Per-period throttled time of the pod cgroup around the container (a ``pod_quota``
    run), in the container's periods; with a sidecar, this container's share of it
    (:func:`pod_share_us`); None without a pod quota."""

    @property
    def stalled_us(self) -> npt.NDArray[np.int64]:
        """Per-period stall the quotas made, the container's and its pod's, no more than
        the threads waited (:func:`unthrottle.cfs.pod.stalled_us`)."""
        return stalled_us(self.throttled_us, self.pod_throttled_us, self.wait_us)

    @property
    def demand_us(self) -> npt.NDArray[np.int64]:
        """Per-period demand: usage plus the larger of throttled time and wait (censoring
        by the quota and by other processes corrected, neither counted twice).

        The kernel adds a thread's wait when the thread next runs, so a long wait lands
        in the window after the one it was spent in: beside two busy threads, one thread's
        windows read up to 139 ms of demand per 100 ms. No window can want more than its
        threads × its length, so the wait counts up to that (never below usage +
        throttled time)."""
        stalled = self.stalled_us
        base = self.usage_us + stalled
        if self.wait_us is None:
            return base
        wanted = self.usage_us + np.maximum(stalled, self.wait_us)
        if self.threads:
            wanted = np.maximum(base, np.minimum(wanted, self.threads * self.period_us))
        demand: npt.NDArray[np.int64] = wanted
        return demand

    @property
    def contention_us(self) -> npt.NDArray[np.int64]:
        """Per-period wait that was not the quota's: behind other processes."""
        if self.wait_us is None:
            return np.zeros_like(self.usage_us)
        contention: npt.NDArray[np.int64] = np.maximum(self.wait_us - self.stalled_us, 0)
        return contention


class CountersAndWaits(CounterReader):
    """A cgroup's counters with its threads' wait in each reading (``CpuStat.wait_us``)."""

    def __init__(
        self, layout: Layout, path: str, *, pod: str | None = None, siblings: Sequence[str] = ()
    ) -> None:
        super().__init__(layout, path)
        self.waits = WaitReader(layout, path)
        self.most_threads = 0
        self.pod = CounterReader(layout, pod) if pod is not None else None
        self.pod_throttled: list[int] = []
        """The pod cgroup's throttled time at each reading, µs (with ``pod``)."""
        self.siblings = [CounterReader(layout, other) for other in siblings]
        self.sibling_usage: list[int] = []
        """The other containers' usage, summed, at each reading, µs (with ``siblings``)."""

    def read(self) -> CpuStat:
        """The counters, then the threads' summed run delay, µs (and the pod's counters)."""
        stat = super().read()
        wait = self.waits.wait_us()
        if self.pod is not None:
            self.pod_throttled.append(self.pod.read().throttled_us)
        if self.siblings:
            self.sibling_usage.append(sum(other.read().usage_us for other in self.siblings))
        self.most_threads = max(self.most_threads, self.waits.threads)
        return dataclasses.replace(stat, wait_us=wait)

    def close(self) -> None:
        """Close the counters' and the threads' files."""
        self.waits.close()
        if self.pod is not None:
            self.pod.close()
        for other in self.siblings:
            other.close()
        super().close()


def grant_of(bandwidth: Bandwidth) -> int | None:
    """What one refill grants under ``bandwidth``, µs: quota + burst; None without a
    quota. (A period can run a little over it on the runtime its CPUs kept from the
    period before, up to a 5 ms slice each: 26.8 ms on a 25 ms quota was traced. A late
    window keeps what its refills granted, the rest goes with the next.)"""
    if bandwidth.quota_us is None:
        return None
    return bandwidth.quota_us + bandwidth.burst_us


@dataclass(frozen=True, slots=True)
class Refills:
    """Where a run's quota is refilled, and how much one refill can grant."""

    start_ns: int
    """When the run began: no refill before it counts."""
    period_ns: int
    boundary_ns: int
    """One of the kernel's period boundaries (the lab calibrates it); without a quota,
    the run's start."""
    grant_us: int | None = None
    """What one refill grants: quota + burst (:func:`grant_of`); None without a quota
    (nothing bounds a period's usage)."""

    def since_last(self, at_ns: int) -> int:
        """How long after the last refill (a boundary of the grid) ``at_ns`` is, ns."""
        return (at_ns - self.boundary_ns) % self.period_ns

    def before(self, at_ns: int) -> int:
        """How many refills have happened from the run's start to ``at_ns``."""
        return (max(at_ns, self.start_ns) - self.boundary_ns) // self.period_ns - (
            self.start_ns - self.boundary_ns
        ) // self.period_ns


def attribute(
    readings: list[Reading], refills: Refills, threads: int = 0
) -> tuple[list[int], list[int], list[int]]:
    """Per-period usage, throttled time and wait (µs) from readings taken about once a
    period, each window's counters attributed by the refills it holds (module docstring).

    Under a quota the refills are the kernel's own (``nr_periods``, counted when its
    period timer fires): a window that ran and holds none (the timer fired after the
    reading) goes with the next, and one that holds n is n periods. Without a quota, the
    grid's boundaries count. A window read late (more than :data:`LATE_NS` after its
    boundary) holds usage of the period its last refill began: beyond n grants, it goes
    with the next window. With ``threads`` known, throttled time beyond what they could
    stall in a period is the period before's, booked after its reading (a CPU's
    unthrottle can come later than the timer), and so is wait beyond what they could wait:
    the kernel books a thread's wait when it next runs. What is still carried after the
    last reading is one more period's.
    """
    usage: list[int] = []
    throttled: list[int] = []
    wait: list[int] = []
    carried = [0, 0, 0, 0]
    limited = refills.grant_us is not None
    for (t0, a), (t1, b) in itertools.pairwise(readings):
        carried[0] += b.usage_us - a.usage_us
        carried[1] += b.throttled_us - a.throttled_us
        carried[2] += b.wait_us - a.wait_us
        carried[3] += b.nr_periods - a.nr_periods
        ran = carried[0] > 0 or carried[1] > 0
        n = carried[3] if limited and ran else refills.before(t1) - refills.before(t0)
        if n <= 0:
            continue
        used = carried[0]
        if refills.grant_us is not None and refills.since_last(t1) > LATE_NS:
            used = min(used, n * refills.grant_us)
        for out, total in ((usage, used), (throttled, carried[1]), (wait, carried[2])):
            out.extend(round(total * (i + 1) / n) - round(total * i / n) for i in range(n))
        carried = [carried[0] - used, 0, 0, 0]
    if any(carried[:3]):
        usage.append(carried[0])
        throttled.append(carried[1])
        wait.append(carried[2])
    if threads:
        most_us = threads * refills.period_ns // 1000
        _back(usage, throttled, most_us)
        _back(usage, wait, most_us)
    return usage, throttled, wait


def _back(usage: list[int], held: list[int], most_us: int) -> None:
    """Time held back (throttled time, or wait) that would make a period want more than its
    threads can (``most_us``) goes back to the period before, as far as that one has room.

    Each thread runs, waits or sleeps: a period's usage + wait is at most threads ×
    period. The kernel books a wait when the thread next runs, so a thread stalled across
    a boundary has its whole wait in the window after it: in a pod whose quota ran out
    first, windows read 44-57 ms of wait beside 136-144 ms, and the evidence, which caps
    the two quotas' stall by the window's wait (cfs.pod.stalled_us), read 144-157 ms of
    demand in windows that wanted 200, and the answer (1,950m) throttled the pod's periods."""
    for i in range(len(usage) - 1, 0, -1):
        excess = usage[i] + held[i] - most_us
        room = most_us - usage[i - 1] - held[i - 1]
        move = min(excess, room, held[i])
        if move > 0:
            held[i] -= move
            held[i - 1] += move


def pod_share_us(
    pod_throttled_us: npt.NDArray[np.int64],
    usage_us: npt.NDArray[np.int64],
    others_usage_us: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """A container's share of its pod's throttled time in each of its windows: the pod's
    throttled time in proportion to its usage beside the other containers' in the same
    window (equal shares where none ran), as the operator's evidence shares a span's
    (:func:`unthrottle.evidence.pods.share_pod_throttling`)."""
    n = min(len(pod_throttled_us), len(usage_us), len(others_usage_us))
    share = np.zeros_like(pod_throttled_us)
    for t in range(n):
        members = {"own": (float(usage_us[t]), 1.0), "others": (float(others_usage_us[t]), 1.0)}
        found = share_pod_throttling(1.0, 0.0, float(pod_throttled_us[t]), members)
        share[t] = round(found["own"][1])
    share[n:] = pod_throttled_us[n:]  # past the other's last reading: no one to share with
    return share


class PeriodSampler:
    """Reads a lab cgroup once per period from ``start_ns`` on, 1 ms after each of the
    kernel's boundaries (``boundary_ns`` is one; without a quota, ``start_ns`` is)."""

    def __init__(
        self,
        cgroup: Cgroup,
        start_ns: int,
        period_ns: int,
        *,
        boundary_ns: int | None = None,
        grant_us: int | None = None,
        pod: Cgroup | None = None,
        siblings: Sequence[Cgroup] = (),
    ) -> None:
        pod_path = pod.path if pod is not None else None
        self.reader = CountersAndWaits(cgroup.layout, cgroup.path, pod=pod_path,
                                       siblings=[other.path for other in siblings])  # fmt: skip
        self.period_ns = period_ns
        boundary = start_ns if boundary_ns is None else boundary_ns
        self.refills = Refills(start_ns, period_ns, boundary, grant_us)
        first = boundary + ((start_ns - boundary) // period_ns + 1) * period_ns
        self.schedule = ScheduledReader(
            self.reader, first, period_ns, AFTER_BOUNDARY_NS, baseline=True
        )

    def start(self) -> None:
        """Start sampling in the background."""
        self.schedule.start()

    def stop(self) -> None:
        """Stop sampling and close the cgroup's files."""
        self.schedule.stop()
        self.reader.close()

    def _sibling_usage(self, readings: list[Reading]) -> npt.NDArray[np.int64]:
        """The other containers' usage in this container's windows: the same readings split
        by the same refills. It rides in the wait's place, which is split as the window's
        own counters decide (whether it ran, how many refills it holds), so the windows are
        this container's; the usage in its place is its own, as in :meth:`samples`."""
        used = self.reader.sibling_usage
        others = [(t, dataclasses.replace(stat, wait_us=u))
                  for (t, stat), u in zip(readings, used, strict=True)]  # fmt: skip
        return np.asarray(attribute(others, self.refills)[2], dtype=np.int64)

    def samples(self) -> PeriodSamples:
        """What was sampled, as arrays, a period each, attributed by refills."""
        threads = self.reader.most_threads
        readings = self.schedule.readings
        usage, throttled, wait = attribute(readings, self.refills, threads)
        pod = None
        if self.reader.pod is not None:
            # The pod's throttled time in the container's windows: the same readings, split
            # by the same refills, with the pod's throttled time in place of the container's.
            pod_throttled = self.reader.pod_throttled
            pods = [(t, dataclasses.replace(stat, throttled_us=own))
                    for (t, stat), own in zip(readings, pod_throttled, strict=True)]  # fmt: skip
            pod = np.asarray(attribute(pods, self.refills, threads)[1], dtype=np.int64)
            if self.reader.siblings:
                pod = pod_share_us(pod, np.asarray(usage, dtype=np.int64),
                                   self._sibling_usage(readings))  # fmt: skip
        return PeriodSamples(
            np.asarray(usage, dtype=np.int64),
            np.asarray(throttled, dtype=np.int64),
            self.period_ns // 1000,
            np.asarray(wait, dtype=np.int64),
            self.reader.most_threads,
            pod,
        )
