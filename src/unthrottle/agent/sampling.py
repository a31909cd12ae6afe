"""Sample every container cgroup each window: demand per window, counters, peaks.

Demand in a window = Δusage + max(Δthrottled time, Δwait) over the window's real
length, in cores: what the container wanted, not what the quota, nor the other
processes on the node, let it have (DESIGN.md §2). The wait is the run delay of
its threads (:mod:`unthrottle.cgroups.waits`): time runnable without a CPU,
throttled or behind other processes. A throttled thread waits in its run queue,
so the wait holds the throttled time already; and throttled time is summed per
CPU, the wait per thread: the larger of the two is taken, never their sum
(:func:`window_demand_us`). Each window lands in a histogram with buckets dense
around typical quotas, and in a trailing window for the peak.

The peak is the largest window of the last ``peak_window_s`` seconds (default
60), not "since the last scrape": with more than one scraper (HA Prometheus
pairs), a reset on scrape would hand each one half the peaks. A trailing
maximum gives every scraper the same answer.

Two threads: sampling, on an absolute schedule, and discovery (the cgroup walk,
the pod list, the burst writer), every ``refresh_s``. Discovery never runs on
the sampling thread: a slow API list must not stretch a window (demand is
divided by the window's length, so a late window reads as a merged one) nor
stall ``/healthz``. The series are swapped in under a lock held for
microseconds. A window reads a cgroup only when the usage above it moved, and a
cgroup whose usage did not move costs its read and nothing else (:mod:`.gating`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from unthrottle.agent.discovery import Found, NotFound
from unthrottle.agent.files import OUT_OF_FILES
from unthrottle.agent.gating import UsagePass, gate_paths, plan
from unthrottle.agent.settings import AgentSettings
from unthrottle.cfs.backlog import BacklogFold
from unthrottle.cgroups import CgroupError, CpuStat, Layout
from unthrottle.cgroups.counters import CounterReader, UsageReader, Vanished, usage_read_size
from unthrottle.cgroups.waits import Waited, WaitReader
from unthrottle.units import Bandwidth

log = logging.getLogger("unthrottle.agent")

BUCKETS_CORES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0, 1.25, 1.5,
                 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)  # fmt: skip
"""Histogram upper bounds, cores: a step every 50m–250m where limits usually sit."""


def window_demand_us(usage_us: int, throttled_us: int, wait_us: int) -> int:
    """What a container wanted in a window, from the increases of its counters in it, µs:
    its usage, plus the larger of its throttled time and its threads' wait.

    Never their sum: a throttled thread waits in its run queue, so its run delay holds
    the throttled time already (Linux 6.18: a thread at 0.5 CPU alone for 2 s used 1.00 s,
    was throttled 1.00 s and waited 1.00 s). Throttled time is summed over the CPUs the
    group was stalled on, the wait over its threads: either can be the larger.
    """
    return usage_us + max(throttled_us, wait_us)


def backfill(earlier_us: int, threads: int, missed: int, window_us: int) -> tuple[list[float], int]:
    """Wait that landed late, given back to the windows it happened in, oldest first, cores.

    The kernel adds a thread's run delay when it gets a CPU, so a thread stalled through
    whole windows (they read no usage: nothing below them was read) brings that wait to
    the window in which it runs. It was waiting right before: each of the ``missed``
    windows before this one, the nearest first, takes what ``threads`` threads (those whose
    wait began before this window) can wait in one window, until ``earlier_us`` is given
    back; what is left stays in this one. Returns those windows' demand and the µs given
    back.
    """
    out: list[float] = []
    left, capacity = earlier_us, threads * window_us
    while left > 0 and len(out) < missed and capacity > 0:
        take = min(left, capacity)
        out.append(take / window_us)
        left -= take
    return out[::-1], earlier_us - left


@dataclass
class Series:
    """One container's sampling state."""

    found: Found
    reader: CounterReader
    bandwidth: Bandwidth
    last_demand_us: int
    """The demand of every window so far, summed (cumulative, µs): usage + throttled time,
    plus the wait beyond the throttled time where the wait is measured."""
    last_ns: int
    latest: CpuStat
    """The full counters, refreshed when scraped."""
    waits: WaitReader | None = None
    """Its threads' run delay, while measured (``AgentSettings.measure_wait``)."""
    wait_us: int = 0
    """Run delay of its threads since the agent found it, µs (cumulative, as of the last
    window in which it ran: a thread's wait is added when it gets a CPU)."""
    wait_measured: bool = False
    """The wait is measured (exported): it was when the series began."""
    last_throttled_us: int = 0
    """Throttled time at the last window's end (cumulative), µs."""
    contention_us: int = 0
    """The wait beyond the throttled time, window by window, summed (cumulative), µs:
    what :attr:`last_demand_us` holds above usage + throttled time."""
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_CORES) + 1))
    total: int = 0
    sum_cores: float = 0.0
    recent: collections.deque[float] = field(default_factory=collections.deque)
    backlog: BacklogFold | None = None
    """The demand above a few levels, carried from window to window (the order the
    histogram loses: :mod:`unthrottle.cfs.backlog`)."""
    accounted: int = 0
    """Sampler windows accounted in the histogram so far. A window in which the cgroup did
    not run (its usage read unchanged, or a gate above it did) does not touch the series
    when it happens (that is what makes it cheap): it is zero demand, added in one go by
    :meth:`catch_up` when the series next moves or is scraped."""

    def catch_up(
        self, windows: int, at_ns: int, keep: int, late: list[float] | None = None
    ) -> None:
        """Account the windows up to ``windows`` that this series has not: each a window of
        zero demand (it did not run). ``at_ns`` is when its counters were last known to
        hold what they held at its last accounted window: the time of its last quiet read
        if that was in window ``windows``, else the end of that window (a gate above it
        was quiet). Throttled time cannot grow without running first; if it ever does, it
        is counted in the next window that reads cpu.stat, not lost.

        ``late``: the demand (cores) of the last of those windows, oldest first, where a
        wait that landed later is given back to them (:func:`backfill`); the rest are 0.
        """
        missed = windows - self.accounted
        if missed <= 0:
            return
        late = (late or [])[-missed:]
        zeros = missed - len(late)
        self.counts[0] += zeros
        self.total += zeros
        if self.backlog is not None:
            self.backlog.idle(zeros)
        recent = self.recent
        recent.extend([0.0] * min(zeros, keep))
        while len(recent) > keep:
            recent.popleft()
        for demand in late:
            self._record(demand, keep)
        self.accounted = windows
        self.last_ns = max(self.last_ns, at_ns)

    def observe(self, demand_us: int, now_ns: int, keep: int) -> None:
        """Account one window ending now, given the cumulative demand (usage + throttled
        time, plus the wait beyond it: see :attr:`last_demand_us`)."""
        self.accounted += 1
        elapsed_us = (now_ns - self.last_ns) / 1000
        if elapsed_us <= 0:
            return
        self._record(max(0, demand_us - self.last_demand_us) / elapsed_us, keep)
        self.last_demand_us, self.last_ns = demand_us, now_ns

    def _record(self, demand: float, keep: int) -> None:
        """Count one window's demand (cores) in the histogram and the trailing peak."""
        self.counts[bisect.bisect_left(BUCKETS_CORES, demand)] += 1
        if self.backlog is not None:
            self.backlog.observe(round(demand * self.backlog.window_us))
        self.total += 1
        self.sum_cores += demand
        recent = self.recent
        recent.append(demand)
        if len(recent) > keep:
            recent.popleft()

    @property
    def peak(self) -> float:
        """The largest window demand in the trailing peak window, cores."""
        return max(self.recent, default=0.0)

    def close(self) -> None:
        """Close its counters' and its threads' files."""
        self.reader.close()
        if self.waits is not None:
            self.waits.close()


def _fd(gate: UsageReader | None) -> int:
    """A gate's usage file (every step of a plan is a series or a gate)."""
    assert gate is not None
    return gate.fd


Discover = Callable[[frozenset[str]], list[Found]]
"""Known paths in, every cgroup to sample out; raises :class:`NotFound` with the reason
when the place to look is missing."""


class Sampler:
    """Keeps the set of cgroups current and samples them on a fixed schedule."""

    def __init__(
        self,
        layout: Layout,
        discover: Discover,
        settings: AgentSettings | None = None,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.layout = layout
        self.discover = discover
        self.settings = settings or AgentSettings()
        self.clock = clock
        """Monotonic ns: the time of every reading, window and schedule (tests pass theirs)."""
        self.period_ns = self.settings.period_ns
        self.keep = self.settings.keep
        self.series: dict[str, Series] = {}
        self.lock = threading.Lock()
        """Held while the series change and while a window or a scrape reads them."""
        self.last_sample_ns = 0
        """When the last window was taken (monotonic ns; 0: none yet)."""
        self.window_start_ns = 0
        """When the last window began: a quiet read since then was in that window."""
        self.windows = 0
        self.discoveries = 0
        """Discoveries that completed (0: none yet)."""
        self.problem: str | None = None
        """Why the last discovery found nowhere to look (NotFound) or failed, else None."""
        self._gates: dict[str, UsageReader] = {}
        """Cgroups above several series, read for their usage only."""
        self._size = usage_read_size(layout.version)
        self._pass: UsagePass[Series] = UsagePass([], [], size=self._size)
        self._settings_read_ns = self.clock()
        self._warned: set[str] = set()
        self._closed = False

    # --- discovery (its own thread) --------------------------------------------------------

    def refresh(self) -> None:
        """Pick up new cgroups, drop vanished ones; now and then re-read quota and burst.

        The walk, the pod list and opening new files happen outside the lock; only the
        swap happens under it.
        """
        with self.lock:
            current = dict(self.series)
        try:
            found = {f.path: f for f in self.discover(frozenset(current))}
            problem = None
        except NotFound as err:
            found, problem = {}, str(err)
            if problem != self.problem:
                log.error("nothing to sample: %s", problem)
        new = {path: s for path, item in found.items()
               if path not in current and (s := self._open(item)) is not None}  # fmt: skip
        keep = {path for path in current if path in found} | set(new)
        wanted_gates = gate_paths(keep) if self.settings.skip_idle_subtrees else set()
        gates = {path: g for path, g in self._gates.items() if path in wanted_gates}
        for path in sorted(wanted_gates - set(gates)):
            with contextlib.suppress(Vanished, CgroupError, OSError):
                gates[path] = UsageReader(self.layout, path)
        reread = self.clock() - self._settings_read_ns >= self.settings.settings_s * 1e9
        with self.lock:
            if self._closed:  # shut down while this discovery ran: keep nothing open
                for series in new.values():
                    series.close()
                for gate in gates.values():
                    gate.close()
                return
            for path in list(self.series):
                if path not in found:
                    self.series.pop(path).close()
            for series in new.values():
                series.accounted = self.windows  # its histogram starts with the next window
            self.series.update(new)
            if reread:
                self._settings_read_ns = self.clock()
                for series in self.series.values():
                    with contextlib.suppress(CgroupError, Vanished):  # vanishing: dropped next
                        series.bandwidth = series.reader.bandwidth()
            for path, gate in self._gates.items():
                if gates.get(path) is not gate:
                    gate.close()
            self._gates = gates
            self._replan()
            self.discoveries += 1
            self.problem = problem

    def _open(self, item: Found) -> Series | None:
        """A new series for a discovered cgroup; None if it cannot be read."""
        path = item.path
        try:
            reader = CounterReader(self.layout, path)
        except (Vanished, CgroupError):
            return None  # gone between the walk and the open: pods die all the time
        except PermissionError as err:
            if path not in self._warned:
                self._warned.add(path)
                log.error("cannot read %s: %s (the agent needs root)", path, err)
            return None
        except OSError as err:
            if err.errno not in OUT_OF_FILES:
                raise
            if "files" not in self._warned:  # once: every cgroup after it would say the same
                self._warned.add("files")
                log.error("cannot open %s: %s; cgroups that cannot be opened are tried "
                          "again at each discovery (agent/files.py)", path, err)  # fmt: skip
            return None
        try:
            start = reader.read()
            bandwidth = reader.bandwidth()
            demand = reader.demand()
        except (Vanished, CgroupError, OSError):
            reader.close()
            return None
        series = Series(item, reader, bandwidth, demand, self.clock(), start,
                        last_throttled_us=start.throttled_us,
                        backlog=BacklogFold(self.period_ns // 1000))  # fmt: skip
        if self.settings.measure_wait:
            series.wait_measured = True
            series.waits = self._waits(path)
        return series

    def _waits(self, path: str) -> WaitReader | None:
        """A reader of a new series' threads' wait, its threads' delays read now (so the
        first window counts from here); None, logged once, if they cannot be read."""
        waits = WaitReader(self.layout, path, refresh_ns=round(self.settings.threads_s * 1e9))
        try:
            waits.read()
        except OSError as err:
            waits.close()
            self._cannot_wait(path, err)
            return None
        return waits

    def _read_wait(self, series: Series, span_ns: int) -> Waited | None:
        """Its threads' wait now, and how much of it began before ``span_ns``; None, and
        no wait read for it again, if they cannot be read (too many open files)."""
        waits = series.waits
        assert waits is not None
        try:
            return waits.read(span_ns)
        except OSError as err:
            waits.close()
            series.waits = None
            self._cannot_wait(series.found.path, err)
            return None

    def _cannot_wait(self, path: str, err: OSError) -> None:
        if f"wait:{path}" not in self._warned:
            self._warned.add(f"wait:{path}")
            log.error("cannot read the threads' wait of %s: %s (its demand is usage + "
                      "throttled time from now on)", path, err)  # fmt: skip

    def _replan(self) -> None:
        """A new pass over the current series and gates; call with the lock, and before
        releasing it whenever a file was closed (a pass must never read a closed fd,
        which the next open may reuse)."""
        steps = plan(self.series, self._gates)
        fds = [step.series.reader.usage_fd if step.series is not None else _fd(step.gate)
               for step in steps]  # fmt: skip
        skip = self.settings.skip_idle_subtrees
        self._pass = UsagePass(steps, fds, size=self._size, skip=skip, previous=self._pass)

    def discover_loop(self, stop: threading.Event) -> None:
        """Discover now and every ``refresh_s`` until stopped; a failure is logged, not fatal."""
        while True:
            try:
                self.refresh()
            except Exception as err:  # a discovery bug must not end discovery for good
                log.exception("discovery failed; trying again in %g s", self.settings.refresh_s)
                self.problem = f"discovery failed: {type(err).__name__}: {err}"
            if stop.wait(self.settings.refresh_s):
                return

    # --- sampling (its own thread) ---------------------------------------------------------

    def sample(self) -> None:
        """Read every cgroup that may have run once, and account the window that just ended.

        A quiet subtree is skipped whole, nothing below it touched, and a cgroup whose
        usage did not move costs its read alone; their series catch up on those windows
        when they next move or are scraped (:meth:`Series.catch_up`).
        """
        with self.lock:
            start = self.clock()
            gone = self._pass.run(self._moved, self.clock)
            self.last_sample_ns = self.clock()
            self.window_start_ns = start
            self.windows += 1
            dropped = [s.found.path for i in gone if (s := self._pass.series[i]) is not None]
            if dropped:
                for path in dropped:
                    self.series.pop(path).close()
                self._replan()

    def _moved(self, series: Series, data: bytes, read_ns: int) -> None:
        """Account the window of a series whose usage file read ``data``, other bytes than
        last time (it ran): first the quiet windows it missed, then this one.

        With the wait measured, the window's demand is usage + max(throttled, wait)
        (:func:`window_demand_us`); a wait that began before the window, in windows it
        missed, is given back to them (:func:`backfill`)."""
        demand = series.reader.demand_from(data)
        missed = self.windows - series.accounted
        late: list[float] = []
        # A first read, or a cgroup whose usage moved and came back to the same bytes,
        # did not run: its threads added no wait (the kernel adds it when they run).
        if series.waits is not None and demand != series.last_demand_us - series.contention_us:
            start_ns = series.last_ns
            if missed > 0:
                start_ns = max(start_ns, self._quiet_until(read_ns))
            late = self._count_wait(series, data, demand, self.clock() - start_ns, missed)
        if missed > 0:
            series.catch_up(self.windows, self._quiet_until(read_ns), self.keep, late)
        series.observe(demand + series.contention_us, self.clock(), self.keep)

    def _count_wait(
        self, series: Series, data: bytes, demand: int, span_ns: int, missed: int
    ) -> list[float]:
        """Read a series' wait and count in its demand the part beyond its throttled time;
        returns the demand given back to the ``missed`` windows before (oldest first)."""
        waited = self._read_wait(series, span_ns)
        if waited is None:
            return []
        throttled = demand - series.reader.usage_from(data)
        more_throttled = throttled - series.last_throttled_us
        more_wait = waited.total_us - series.wait_us
        series.wait_us, series.last_throttled_us = waited.total_us, throttled
        late: list[float] = []
        given = 0
        if missed > 0 and waited.earlier_us > 0:
            late, given = backfill(waited.earlier_us, waited.spilled, missed,
                                   self.period_ns // 1000)  # fmt: skip
        # A wait from before this window that no missed window took back would make this
        # one want more than its threads can in it (one thread beside two busy ones read
        # up to 139 ms per 100 ms window, and was sized 1410m against 1110m): the counter
        # keeps it, the demand does not.
        more_wait -= waited.earlier_us - given
        series.contention_us += window_demand_us(0, more_throttled, more_wait) - more_throttled
        series.last_demand_us += given  # accounted in those windows, not in this one
        return late

    def _quiet_until(self, read_ns: int) -> int:
        """Until when a series that missed windows is known not to have run, given its
        last quiet read: that read, if it was in the last window (its own reading, as if
        accounted then); else the end of the last window (a gate above it was quiet)."""
        return read_ns if read_ns >= self.window_start_ns else self.last_sample_ns

    def snapshot(self) -> list[Series]:
        """Every series with its full counters read now (for a scrape); call with the lock."""
        out, gone = [], []
        for path, series in self.series.items():
            if series.accounted < self.windows:
                series.catch_up(self.windows, self._quiet_until(self._pass.read_ns(path)),
                                self.keep)  # fmt: skip
            try:
                series.latest = series.reader.read()
            except Vanished:
                gone.append(path)
                continue
            out.append(series)
        for path in gone:
            self.series.pop(path).close()
        if gone:
            self._replan()
        return out

    def run(self, stop: threading.Event) -> None:
        """Sample every period (on an absolute schedule) until stopped.

        It sleeps between windows rather than waiting on ``stop``: a wake-up from an
        event's timed wait costs twice the CPU of a sleep's (``AgentSettings.stop_within_s``).
        """
        chunk_ns = round(self.settings.stop_within_s * 1e9)
        next_ns = self.clock() + self.period_ns
        while not stop.is_set():
            wait_ns = next_ns - self.clock()
            if wait_ns > 0:
                time.sleep(min(wait_ns, chunk_ns) / 1e9)
                continue
            self.sample()
            next_ns += self.period_ns
            now = self.clock()
            if next_ns < now:  # fell behind (a stalled host): skip, do not burst to catch up
                next_ns = now + self.period_ns

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        """Start the discovery and the sampling threads (daemons); they end when stopped."""
        threads = [
            threading.Thread(target=self.discover_loop, args=(stop,), name="discovery",
                             daemon=True),
            threading.Thread(target=self.run, args=(stop,), name="sampler", daemon=True),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        return threads

    # --- health ----------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Healthy, and why not: sampling stalled, nowhere to look, or nothing found there."""
        age_ns = self.clock() - self.last_sample_ns
        if not self.last_sample_ns or age_ns > self.settings.stall_periods * self.period_ns:
            return False, "stalled: no sampling window in the last " + (
                f"{age_ns / 1e9:.1f} s" if self.last_sample_ns else "periods (not started)"
            )
        if self.problem is not None:
            return False, self.problem
        if not self.discoveries:
            return False, "starting: the first discovery has not finished"
        if not self.series:
            return False, "no cgroups found to sample"
        return True, "ok"

    def close(self) -> None:
        """Close every open file; a discovery still running keeps nothing it opens."""
        with self.lock:
            self._closed = True
            for series in self.series.values():
                series.close()
            for gate in self._gates.values():
                gate.close()
            self.series.clear()
            self._gates.clear()
            self._pass = UsagePass([], [], size=self._size)
