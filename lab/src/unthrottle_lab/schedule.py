"""Read a cgroup's counters on a fixed schedule, in a thread.

One mechanism for every sampler that is not the agent's hot loop: the lab's
per-period samples (aligned with the kernel's grid, 1 ms after each
boundary), and the window-alignment bench and tests (the agent's unaligned
windows at any phase, or sliding windows). Readings are full ``cpu.stat``
counters, taken through a :class:`CounterReader` the caller owns.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from unthrottle.cgroups.counters import CounterReader
from unthrottle.cgroups.files import CpuStat


@dataclass
class ScheduledReader:
    """Readings at ``start + phase + k × step`` (k ≥ 0), until stopped.

    ``baseline``: also read once at :meth:`start`, before the schedule begins,
    so that the first window covers everything since then.
    """

    reader: CounterReader
    start_ns: int
    step_ns: int
    phase_ns: int = 0
    baseline: bool = False
    readings: list[tuple[int, CpuStat]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin reading in the background."""
        if self.baseline:
            self.readings.append((time.monotonic_ns(), self.reader.read()))
        self._thread = threading.Thread(target=self._run, name="cgroup-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        at = self.start_ns + self.phase_ns
        while not self._stop.wait(max(0.0, (at - time.monotonic_ns()) / 1e9)):
            self.readings.append((time.monotonic_ns(), self.reader.read()))
            at += self.step_ns

    def stop(self) -> None:
        """Stop reading; the reader stays open (the caller owns it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def deltas(self) -> list[CpuStat]:
        """What changed between consecutive readings."""
        return [b - a for (_, a), (_, b) in zip(self.readings, self.readings[1:], strict=False)]

    def demands(self, window_ns: int) -> list[float]:
        """Demand (cores: usage + throttled time) of every window of ``window_ns`` ending
        at a reading; a window longer than the step slides."""
        per = max(1, round(window_ns / self.step_ns))
        out = []
        for i in range(per, len(self.readings)):
            (t0, a), (t1, b) = self.readings[i - per], self.readings[i]
            if t1 > t0:
                used = b.usage_us - a.usage_us + b.throttled_us - a.throttled_us
                out.append(max(0, used) / ((t1 - t0) / 1000))
        return out
