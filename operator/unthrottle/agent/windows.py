"""Demand per window from an agent's readings, at any phase and window length.

The agent's windows cannot be aligned with the kernel's periods (it cannot
see the grid). :class:`WindowSampler` takes readings every ``step`` from
``start + phase`` and computes the demand of each window of ``window`` ending
at a reading: ``window == step`` is plain unaligned sampling, ``step`` a
fraction of ``window`` gives sliding windows. It drives the agent's own
:class:`CounterReader`, and the lab's alignment bench and tests use it to
compare phases and steps against the kernel's aligned periods.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from unthrottle.agent.counters import CounterReader


@dataclass
class WindowSampler:
    """Readings of one cgroup on a fixed schedule, in a thread."""

    reader: CounterReader
    start_ns: int
    step_ns: int
    phase_ns: int = 0
    readings: list[tuple[int, int]] = field(default_factory=list)
    """(time ns, cumulative usage + throttled µs)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin reading in the background."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        at = self.start_ns + self.phase_ns
        while not self._stop.wait(max(0.0, (at - time.monotonic_ns()) / 1e9)):
            self.readings.append((time.monotonic_ns(), self.reader.demand()))
            at += self.step_ns

    def stop(self) -> None:
        """Stop reading; the reader stays open (the caller owns it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def demands(self, window_ns: int) -> list[float]:
        """Demand (cores) of every window of ``window_ns`` ending at a reading."""
        per = max(1, round(window_ns / self.step_ns))
        out = []
        for i in range(per, len(self.readings)):
            (t0, d0), (t1, d1) = self.readings[i - per], self.readings[i]
            if t1 > t0:
                out.append(max(0, d1 - d0) / ((t1 - t0) / 1000))
        return out
