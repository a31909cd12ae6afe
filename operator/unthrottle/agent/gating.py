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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

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
