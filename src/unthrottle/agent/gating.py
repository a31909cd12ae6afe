"""Which cgroups a window must read: none below a cgroup whose usage did not move.

CPU usage is hierarchical (v1 ``cpuacct.usage``, v2 ``usage_usec``): a pod's
cgroup counts all its containers, a QoS cgroup all its pods. If a pod's usage
is unchanged since the last window, none of its containers ran, and they need
no read: each gets a window of zero demand, as an idle cgroup read on its own
would (a cgroup that did not run was not throttled either; docs/agent.md). On
a kubelet's tree most pods are idle in any 100 ms, so a window reads a few
gates and the containers that ran (docs/benchmarks.md §5).

Why a skipped cgroup loses nothing: a gate is read before anything below it in
the same window. If its usage equals its previous reading, nothing below it ran
between its two readings, and every reading below it was taken after the
earlier one; so each counter below still holds the value it had when it was
last read, and the next window that reads it counts everything since.

The plan is a list of steps in depth-first order; a step knows where its
subtree ends, so a window skips a quiet subtree with one jump.

A window runs the plan as a :class:`UsagePass`: parallel lists (usage file
descriptors, subtree ends, the bytes each file read last, when it was read) and
one tight loop. A cgroup whose usage file reads the same bytes as last time did
not run: that costs its ``pread``, one comparison of bytes and a timestamp, and
nothing else; its series is not touched, and its zero window is accounted with
the others it missed when it next moves or is scraped, as a skipped subtree's
are. Only a cgroup that moved goes back to its series. On a flat layout of 200
cgroups, where the root moves whenever anything runs, a window's CPU went from
0.9-1.15 ms to 0.6-0.7 ms, of which 0.5 ms is the ``pread`` calls themselves
(docs/benchmarks.md §5).
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from unthrottle.cgroups.counters import GONE, Vanished

S = TypeVar("S")
G = TypeVar("G")


@dataclass(frozen=True, slots=True)
class Step(Generic[S, G]):
    """One cgroup of a window's plan: a sampled series, or a gate (usage only)."""

    path: str
    series: S | None
    """The cgroup's own series, when it is sampled; its usage gates what is below."""
    gate: G | None
    """A usage reader, for a cgroup above several series that is not sampled itself."""
    end: int
    """Index of the first step after this cgroup's subtree."""


def ancestors(path: str) -> list[str]:
    """Every proper ancestor of a cgroup path, nearest last (``a/b/c`` → ``a``, ``a/b``)."""
    parts = path.strip("/").split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def gate_paths(series: Iterable[str]) -> set[str]:
    """The cgroups worth reading as gates: above two or more series, not sampled themselves.

    A gate above one series would cost a read to save one. A sampled cgroup with series
    below it gates them with its own reading, at no extra cost.
    """
    paths = set(series)
    below: dict[str, int] = {}
    for path in paths:
        for parent in ancestors(path):
            below[parent] = below.get(parent, 0) + 1
    return {path for path, count in below.items() if count >= 2 and path not in paths}


def plan(series: dict[str, S], gates: dict[str, G]) -> list[Step[S, G]]:
    """The depth-first plan over the series and gates given (all paths below one mount)."""
    paths = sorted(set(series) | set(gates), key=lambda p: p.split("/"))
    steps: list[Step[S, G]] = []
    # Depth first is the sorted order by path components; a subtree ends at the first
    # later path that is not below it.
    ends = [len(paths)] * len(paths)
    open_: list[int] = []
    for index, path in enumerate(paths):
        while open_ and not path.startswith(paths[open_[-1]] + "/"):
            ends[open_.pop()] = index
        open_.append(index)
    for index, path in enumerate(paths):
        steps.append(Step(path, series.get(path), gates.get(path), ends[index]))
    return steps


Moved = Callable[[S, bytes, int], None]
"""Called for a sampled cgroup whose usage file read other bytes than last time: its
series, the bytes, and when it was read before (monotonic ns; 0: never by this pass).
May raise :class:`Vanished`."""


class UsagePass(Generic[S]):
    """A plan made ready to run every window: one ``pread`` per cgroup that may have run.

    The state of each step sits in lists indexed like the plan: its usage file, where
    its subtree ends, the bytes it read last (equal bytes, equal usage: nothing is
    parsed for a cgroup that did not move) and when it was last read. A new pass (the
    tree changed) takes over the last bytes and times of the paths it keeps, so
    rediscovery costs no window anything.
    """

    def __init__(
        self,
        steps: Sequence[Step[S, G]],
        fds: Sequence[int],
        *,
        size: int,
        skip: bool = True,
        previous: UsagePass[S] | None = None,
    ) -> None:
        count = len(steps)
        self.paths = [step.path for step in steps]
        self.series = [step.series for step in steps]
        self.fds = list(fds)
        self.ends = [step.end if skip else index + 1 for index, step in enumerate(steps)]
        """Where a quiet cgroup's window goes on: past its subtree (or just past it, when
        quiet subtrees are read anyway)."""
        self.size = size
        self.index = {path: index for index, path in enumerate(self.paths)}
        self.last: list[bytes | None] = [None] * count
        """What each usage file read last; None before the first read (never equal)."""
        self.stamps = array("q", bytes(8 * count))
        """When each was last read and found quiet (monotonic ns; 0: not by this pass)."""
        if previous is not None:
            for index, path in enumerate(self.paths):
                was = previous.index.get(path)
                if was is not None:
                    self.last[index] = previous.last[was]
                    self.stamps[index] = previous.stamps[was]

    def read_ns(self, path: str) -> int:
        """When the cgroup was last read and found quiet (0: not yet, or not in the pass)."""
        index = self.index.get(path)
        return 0 if index is None else self.stamps[index]

    def run(self, moved: Moved[S], clock: Callable[[], int] = time.monotonic_ns) -> list[int]:
        """Read every usage file whose cgroup may have run, in plan order; ``moved`` is
        called for each sampled cgroup that did. A quiet cgroup's subtree is jumped over.

        Returns the steps that vanished (their file failed or read empty); what is below
        one is read, and what is gone there is reported too.
        """
        fds, ends, last, stamps, series = self.fds, self.ends, self.last, self.stamps, self.series
        pread, size = os.pread, self.size
        gone: list[int] = []
        index, count = 0, len(fds)
        while index < count:
            try:
                data = pread(fds[index], size, 0)
            except OSError as err:
                if err.errno not in GONE:
                    raise
                data = b""
            if data == last[index]:  # nothing at or below it ran since its last read
                stamps[index] = clock()
                index = ends[index]
                continue
            if data:
                last[index] = data
                if (item := series[index]) is not None:
                    try:
                        moved(item, data, stamps[index])
                    except Vanished:
                        gone.append(index)
            else:
                gone.append(index)
            index += 1
        return gone
