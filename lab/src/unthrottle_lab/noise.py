"""How busy the rest of the machine was while the lab measured: its noise, in cores.

A lab run is a physical measurement. Any other process on a 2-core machine
takes a core from a 2-worker scenario now and then, and latencies stretch
(an unlimited open pool measured p95 43 ms instead of 13 ms beside a test
suite). ``unthrottle_lab.isolation`` keeps that load out of a run; this says
how much there was, for the record beside the figures: the CPU time the whole
machine spent (``/proc/stat``, steal included), less what this process and its
children (the lab's workers, reaped) used, over the span's wall time.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from types import TracebackType

QUIET_CORES = 0.05
"""Other load, in cores on average, under which the machine counts as quiet: an
idle Debian host measures 0.00–0.02 here. Reported, never a reason to skip."""


def _all_cpus(stat: Path) -> list[int]:
    """The first line of /proc/stat (all CPUs), in USER_HZ ticks: user, nice, system, idle,
    iowait, irq, softirq, steal, guest, guest_nice (older kernels end earlier)."""
    return [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]


def _machine_busy_s(stat: Path) -> float:
    """CPU seconds the machine spent on anything but idle and iowait, steal included."""
    fields = _all_cpus(stat)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    # guest and guest_nice (fields 8, 9) are already counted in user and nice.
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _one_cpu(stat: Path, cpu: int) -> list[int]:
    """The ``cpuN`` line of /proc/stat, in USER_HZ ticks (fields as :func:`_all_cpus`)."""
    name = f"cpu{cpu}"
    for line in stat.read_text().splitlines():
        head, _, rest = line.partition(" ")
        if head == name:
            return [int(x) for x in rest.split()]
    raise ValueError(f"{stat}: no line for {name}")


def steal_ms(stat: Path = Path("/proc/stat"), cpu: int | None = None) -> float:
    """Steal time the kernel has counted so far on all CPUs, or on ``cpu`` alone, ms: time
    a virtual CPU was ready to run and the host ran something else (0 on bare metal)."""
    fields = _all_cpus(stat) if cpu is None else _one_cpu(stat, cpu)
    return fields[7] * 1000 / os.sysconf("SC_CLK_TCK") if len(fields) > 7 else 0.0


def _own_cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


class OtherLoad:
    """A context manager: afterwards ``cores`` is the other processes' average load.

    Children must be reaped (waited for) before the block ends, or their CPU time
    counts as other load: the lab's workers are.
    """

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self.stat = stat
        self.cores = 0.0
        self.seconds = 0.0
        self._start = (0.0, 0.0, 0.0)

    def __enter__(self) -> OtherLoad:
        self._start = (time.monotonic(), _machine_busy_s(self.stat), _own_cpu_s())
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        wall0, busy0, own0 = self._start
        self.seconds = time.monotonic() - wall0
        others = (_machine_busy_s(self.stat) - busy0) - (_own_cpu_s() - own0)
        self.cores = max(0.0, others / self.seconds) if self.seconds > 0 else 0.0

    @property
    def quiet(self) -> bool:
        """True when the rest of the machine used less than :data:`QUIET_CORES`."""
        return self.cores < QUIET_CORES

    def describe(self) -> str:
        """``other processes used 0.31 cores on average over 62 s``."""
        return f"other processes used {self.cores:.2f} cores on average over {self.seconds:.0f} s"
