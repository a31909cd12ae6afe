"""Evidence span by span, in the same handful of batched queries as the whole window.

A policy reconciled every 5 minutes over a 24 h window would have Prometheus
read the whole window 288 times a day. Instead, the first reconcile reads the
window once, cut into steps, and later ones read only what is new since the
last; :mod:`unthrottle.evidence.aggregates` keeps the steps' increases per
container on a grid of slots, so that what ages out of the window is dropped
exactly.

:func:`fetch_slots` sends the batch :func:`~unthrottle.evidence.fetching.fetch`
sends (owners when not given, four counters, the histogram, limits, requests),
each as ONE range query: the increase over ``[step]`` evaluated every ``step``
from ``start + step`` to ``end``. Its answers are grouped step by step by the
same :func:`~unthrottle.evidence.gathering.gather` as ``fetch``'s, so a step's
evidence is what ``fetch`` would say of that span. A query refused as too big
is sent again once per namespace, as ``fetch`` does.

Steps: ``n = ceil((end − start) / slot_s)`` spans of equal length, whole
milliseconds (PromQL's resolution for ranges and steps), but none shorter than a
minute when the read is longer than one (fewer spans then): a 90 s read on 60 s
slots is one span, not two of 45 s. A short span may hold a single scrape, and
VictoriaMetrics replaces the last points of a range query whose step is under
``-search.maxStepForPointsAdjustment`` (1 minute) by the point before them when
they fall within ``-search.latencyOffset`` of its clock (docs/metrics.md). When
``end − start`` in milliseconds is not a multiple of ``n``, the spans end up to
``n − 1`` ms before ``end``: the last span's end is what was read, and the rest is
read next time, so nothing is lost or read twice.

Recorded series (unthrottle's recording rules, 5-minute increases) work too:
a span's total is ``sum_over_time`` of the samples in it. Prometheus 2 ranges
are closed at both ends, ``[t − r, t]``, so a sample on a boundary would count
in two spans: the range is 1 ms shorter, ``(t − step, t]`` at millisecond
timestamps. (Prometheus 3 ranges are left-open already; a rule sample falling
exactly 1 ms after a boundary would then be missed, which rule evaluation
times, aligned to their interval, make all but impossible.) A span shorter
than the rule interval may hold no sample; its increase is in the next span.

Cost: the first read makes Prometheus load the samples ``fetch`` loads
(1.005× on the tests' day of history; a 5-minute read then loads 0.34 % of
them), but its answers hold 24 points per series instead of one. Where
Prometheus's work per sample dominates (a fine scrape, a long window) that is
cheap; on a coarse history (one sample an hour for a week, 42,000 series) the
first read took 2.4× ``fetch``'s time: Prometheus's own evaluation grew 1.5×
and the JSON answer 5× (23 MB against 4.9 MB), and decoding it is ours.

Raw counters need two samples in a span for an increase: read spans of a few
scrape intervals at least (the slots are never shorter than 60 s, and
:meth:`~unthrottle.evidence.aggregates.WindowAggregates.next_read` does not ask
for less).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import NamedTuple

from unthrottle.evidence.containers import Points, Slot
from unthrottle.evidence.fetching import (
    CONCURRENCY,
    EVIDENCE_QUERIES,
    batch_queries,
    in_flight,
    increase_queries,
    owners_of,
    split_namespaces,
)
from unthrottle.evidence.gathering import gather
from unthrottle.metrics.promql import RECORDED, namespaces_matcher, recorded_by, selector
from unthrottle.metrics.source import MetricsSource, RangeSeries
from unthrottle.model.owners import DEPLOYMENT, Owners

_OWNER_QUERIES = ("replicaset_owners", "pod_owners")
MIN_STEP_MS = 60_000
"""The shortest span of a read longer than it (see the module's docstring)."""


class Steps(NamedTuple):
    """Equal spans, whole milliseconds, from ``start_ms``."""

    start_ms: int
    step_ms: int
    n: int

    @property
    def end_ms(self) -> int:
        """Where the last span ends."""
        return self.start_ms + self.step_ms * self.n

    def spans(self) -> list[tuple[float, float]]:
        """Each span's (start, end), Unix seconds."""
        at = [(self.start_ms + k * self.step_ms) / 1000 for k in range(self.n + 1)]
        return list(pairwise(at))


def steps(start: float, end: float, slot_s: float) -> Steps:
    """``ceil((end − start) / slot_s)`` equal spans from ``start`` to (nearly) ``end``,
    fewer when they would be shorter than :data:`MIN_STEP_MS` (one at least)."""
    start_ms, total_ms = round(start * 1000), round(end * 1000) - round(start * 1000)
    slot_ms = max(1, round(slot_s * 1000))
    if total_ms <= 0:
        return Steps(start_ms, 0, 0)
    n = max(1, min(-(-total_ms // slot_ms), total_ms // MIN_STEP_MS))
    return Steps(start_ms, total_ms // n, n)


def range_queries(
    namespaces: list[str],
    plan: Steps,
    *,
    with_owners: bool,
    recorded: bool = False,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> dict[str, str]:
    """Every query :func:`fetch_slots` sends, by name, in the order its answers are used."""
    step = f"{plan.step_ms}ms"
    if recorded:
        ns = namespaces_matcher(namespaces)
        left_open = f"{max(1, plan.step_ms - 1)}ms"  # (t − step, t]: see the module's docstring
        evidence = {}
        for name in EVIDENCE_QUERIES:
            by = recorded_by(name)
            total = f"sum_over_time({selector(RECORDED[name], ns)}[{left_open}])"
            evidence[name] = f"sum by ({by}) ({total})"
    else:
        evidence = increase_queries(namespaces, step)
    owners_window = f"{plan.step_ms * plan.n}ms" if with_owners else None
    return batch_queries(namespaces, evidence, owners_window=owners_window, kinds=kinds)


def fetch_slots(
    source: MetricsSource,
    namespaces: list[str],
    start: float,
    end: float,
    *,
    slot_s: float,
    owners: Owners | None = None,
    concurrency: int = CONCURRENCY,
    on_query: Callable[[str], None] | None = None,
    recorded: bool = False,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> list[Slot]:
    """The evidence of every container of the workloads of ``kinds`` in these namespaces
    (all when empty), span by span: consecutive spans of :func:`steps` from ``start``, none when
    ``end <= start``.

    Arguments as :func:`~unthrottle.evidence.fetching.fetch`'s. Owners not given are read
    from kube-state-metrics over the whole read (two more queries, evaluated at its end).
    """
    plan = steps(start, end, slot_s)
    if plan.n == 0:
        return []
    first, last, step_s = (
        (plan.start_ms + plan.step_ms) / 1000,
        plan.end_ms / 1000,
        plan.step_ms / 1000,
    )
    with_owners = owners is None

    def build(names: list[str]) -> dict[str, str]:
        return range_queries(names, plan, with_owners=with_owners, recorded=recorded,
                             kinds=kinds)  # fmt: skip

    def send(name: str, promql: str) -> list[RangeSeries]:
        return source.range(promql, last if name in _OWNER_QUERIES else first, last, step_s)

    def parts() -> list[str]:  # the owners known by the time a query is refused
        return split_namespaces(namespaces, owners)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        answer = in_flight(pool, send, build(namespaces), build, parts, on_query)
        if owners is None:
            owners = owners_of(answer("replicaset_owners"), answer("pod_owners"), kinds)

        def points(name: str) -> Iterator[Points]:
            return _points(answer(name), plan)

        found = gather(owners, points, plan.n)
    return [Slot(a, b, evidence) for (a, b), evidence in zip(plan.spans(), found, strict=True)]


def _points(series: list[RangeSeries], plan: Steps) -> Iterator[Points]:
    """Each series with the steps its values are at (most series have every step)."""
    every = range(plan.n)
    first_ms = plan.start_ms + plan.step_ms
    for s in series:
        if len(s.times) == plan.n:
            yield s.labels, every, s.values
        else:
            at = [round((t * 1000 - first_ms) / plan.step_ms) for t in s.times]
            yield s.labels, at, s.values
