"""How often Python's cycle collector runs in an ``unthrottle`` process.

A reconcile over 1,000 Deployments decodes about 32,000 series a batch, and builds a
container's evidence from each: hundreds of thousands of small objects that live until
the reconcile ends. Under CPython's default thresholds (700, 10, 10) the collector runs
once every 700 of them, and the older generations, which hold the watches' objects and
the folded evidence, are traversed again and again: decoding one 28,000-series answer
beside a long-lived heap of 2.4 million objects took 0.42 s of CPU, of which 0.27 s was
the collector's (0.15 s with it off). A young generation of 100,000 objects brings it to
0.20 s. Reference counting still frees everything that is not a cycle at once; the
collector still runs, about 140 times less often, and the cycles it finds are at most
100,000 objects late (docs/benchmarks.md §9).
"""

from __future__ import annotations

import gc

YOUNG = 100_000
"""Allocations (less deallocations) between two collections of the young generation."""


def fewer_collections() -> None:
    """Collect the young generation every :data:`YOUNG` allocations; the older ones as
    often, relative to it, as CPython does by default."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, older, oldest)
