"""Sample every container cgroup each window: demand per window, counters, peaks.

Demand in a window = Δusage + Δthrottled time over the window's real length,
in cores: what the container wanted, not what the quota let it have (DESIGN.md
§2). Each window lands in a histogram with buckets dense around typical
quotas, and in a trailing window for the peak.

The peak is the largest window of the last ``peak_window_s`` seconds (default
60), not "since the last scrape": with more than one scraper (HA Prometheus
pairs), a reset on scrape would hand each one half the peaks. A trailing
maximum gives every scraper the same answer.
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

from unthrottle.agent.discovery import Found
from unthrottle.cfs.settings import Bandwidth
from unthrottle.cgroups import CgroupError, CpuStat, Layout
from unthrottle.cgroups.counters import CounterReader, Vanished

log = logging.getLogger("unthrottle.agent")

BUCKETS_CORES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0, 1.25, 1.5,
                 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)  # fmt: skip
"""Histogram upper bounds, cores: a step every 50m–250m where limits usually sit."""


@dataclass
class Series:
    """One container's sampling state."""

    found: Found
    reader: CounterReader
    bandwidth: Bandwidth
    last_demand_us: int
    """Usage + throttled time at the last window's end (cumulative)."""
    last_ns: int
    latest: CpuStat
    """The full counters, refreshed when scraped."""
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_CORES) + 1))
    total: int = 0
    sum_cores: float = 0.0
    recent: collections.deque[float] = field(default_factory=collections.deque)
    last_usage_ns: int = -1
    """``cpuacct.usage`` at the last window (cgroup v1; -1 on v2 or before the first)."""

    def idle(self, now_ns: int, keep: int) -> None:
        """Account a window in which the cgroup did not run: zero demand, nothing read but
        its usage. Throttled time cannot grow without running first; if it ever does,
        it is counted in the next window that reads cpu.stat, not lost."""
        if now_ns > self.last_ns:
            self._record(0.0, keep)
            self.last_ns = now_ns

    def observe(self, demand_us: int, now_ns: int, keep: int) -> None:
        """Account one window ending now, given cumulative usage + throttled time."""
        elapsed_us = (now_ns - self.last_ns) / 1000
        if elapsed_us <= 0:
            return
        self._record(max(0, demand_us - self.last_demand_us) / elapsed_us, keep)
        self.last_demand_us, self.last_ns = demand_us, now_ns

    def _record(self, demand: float, keep: int) -> None:
        """Count one window's demand (cores) in the histogram and the trailing peak."""
        self.counts[bisect.bisect_left(BUCKETS_CORES, demand)] += 1
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


class Sampler:
    """Keeps the set of cgroups current and samples them on a fixed schedule."""

    def __init__(
        self,
        layout: Layout,
        discover: Callable[[frozenset[str]], list[Found]],
        *,
        period_ns: int = 100_000_000,
        peak_window_s: float = 60.0,
        refresh_s: float = 5.0,
        settings_s: float = 30.0,
    ) -> None:
        self.layout = layout
        self.discover = discover
        self.settings_ns = int(settings_s * 1e9)
        self._settings_read_ns = 0
        self.period_ns = period_ns
        self.keep = max(1, round(peak_window_s * 1e9 / period_ns))
        self.refresh_ns = int(refresh_s * 1e9)
        self.series: dict[str, Series] = {}
        self.lock = threading.Lock()
        self.last_sample_ns = 0
        self.windows = 0
        self._warned: set[str] = set()

    def refresh(self) -> None:
        """Pick up new cgroups, drop vanished ones; now and then re-read quota and burst."""
        found = {f.path: f for f in self.discover(frozenset(self.series))}
        reread = time.monotonic_ns() - self._settings_read_ns >= self.settings_ns
        with self.lock:
            if reread:
                self._settings_read_ns = time.monotonic_ns()
                for series in self.series.values():
                    with contextlib.suppress(CgroupError):  # vanishing: the next sample drops it
                        series.bandwidth = series.reader.bandwidth()
            for path in list(self.series):
                if path not in found:
                    self.series.pop(path).reader.close()
            for path, item in found.items():
                if path in self.series:
                    continue
                try:
                    reader = CounterReader(self.layout, path)
                    start = reader.read()
                    bandwidth = reader.bandwidth()
                    demand = reader.demand()
                except (Vanished, CgroupError):
                    continue  # gone between the walk and the open: pods die all the time
                except PermissionError as err:
                    if path not in self._warned:
                        self._warned.add(path)
                        log.error("cannot read %s: %s (the agent needs root)", path, err)
                    continue
                self.series[path] = Series(
                    item, reader, bandwidth, demand, time.monotonic_ns(), start
                )

    def sample(self) -> None:
        """Read every cgroup once and account the window that just ended."""
        keep = self.keep
        gone = []
        with self.lock:
            for path, series in self.series.items():
                reader = series.reader
                try:
                    if reader.usage_apart:  # v1: cpu.stat only when the cgroup ran
                        usage = reader.usage_ns()
                        if usage == series.last_usage_ns:
                            series.idle(time.monotonic_ns(), keep)
                            continue
                        series.last_usage_ns = usage
                        demand = reader.demand_with(usage)
                    else:
                        demand = reader.demand()
                except Vanished:
                    gone.append(path)
                    continue
                series.observe(demand, time.monotonic_ns(), keep)
            for path in gone:
                self.series.pop(path).reader.close()
            self.last_sample_ns = time.monotonic_ns()
            self.windows += 1

    def snapshot(self) -> list[Series]:
        """Every series with its full counters read now (for a scrape); call with the lock."""
        out, gone = [], []
        for path, series in self.series.items():
            try:
                series.latest = series.reader.read()
            except Vanished:
                gone.append(path)
                continue
            out.append(series)
        for path in gone:
            self.series.pop(path).reader.close()
        return out

    def run(self, stop: threading.Event) -> None:
        """Sample every period (on an absolute schedule) and refresh now and then, until stopped."""
        self.refresh()
        next_ns = time.monotonic_ns() + self.period_ns
        next_refresh = time.monotonic_ns() + self.refresh_ns
        while not stop.wait(max(0.0, (next_ns - time.monotonic_ns()) / 1e9)):
            self.sample()
            next_ns += self.period_ns
            now = time.monotonic_ns()
            if next_ns < now:  # fell behind (a stalled host): skip, do not burst to catch up
                next_ns = now + self.period_ns
            if now >= next_refresh:
                self.refresh()
                next_refresh = now + self.refresh_ns

    def close(self) -> None:
        """Close every open file."""
        with self.lock:
            for series in self.series.values():
                series.reader.close()
            self.series.clear()
