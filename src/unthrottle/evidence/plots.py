"""The counters of a few containers over the window, step by step: what the report's plots
draw, read only for the containers plotted, in a handful of batched range queries.

One range query per counter (CPU usage, CFS periods, throttled periods) for every plotted
container at once: a regex matcher names their workloads' pods by the names their
controllers give them (``<deployment>-<template hash>-<5 characters>``,
``<statefulset>-<ordinal>``, ``<daemonset>-<5 characters>``:
:data:`~unthrottle.model.owners.POD_SUFFIX`), so pods gone by now are read too, and a pod's
workload is told from its name (:func:`~unthrottle.model.owners.workload_of_pod_name`).
Never one query per workload: a batch is split only when its pod pattern would pass
:data:`MAX_PATTERN_CHARS`, or when Prometheus refuses it as too big (in halves). So 3
queries up to about 100 plotted workloads, 3 more per hundred beyond.

The agent's copies of the counters fill in where cAdvisor has none, as in
:mod:`unthrottle.evidence.fetching`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import CONCURRENCY
from unthrottle.metrics.promql import (
    CONTAINERS,
    _counters,
    namespaces_matcher,
    regex_literal,
    string,
)
from unthrottle.metrics.source import MetricsError, MetricsSource, RangeSeries
from unthrottle.model.owners import POD_SUFFIX, kind_and_name, workload_of_pod_name

MAX_POINTS = 240
"""Steps a plot's series has at most: a plot 6.4 inches wide shows no more."""
MIN_STEP_S = 300
"""The shortest step, s: ``increase`` over a step needs several samples, and cAdvisor is
scraped every 15–60 s; five minutes holds five at the slowest."""
_NICE_STEPS = (300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400)
MAX_PATTERN_CHARS = 4000
"""The longest pod pattern of one query (about 100 Deployments): the query travels in a
URL, which proxies in front of Prometheus cut at 8 kB."""
SERIES_QUERIES = ("usage_seconds", "periods", "throttled_periods")


def step_for(window_s: int) -> int:
    """A step that fits the window: at most :data:`MAX_POINTS` steps, at least
    :data:`MIN_STEP_S`, rounded up to a step people read (5 m, 10 m … 1 d)."""
    wanted = max(MIN_STEP_S, math.ceil(window_s / MAX_POINTS))
    return next((s for s in _NICE_STEPS if s >= wanted), wanted)


@dataclass
class ContainerSeries:
    """One Deployment container's counters per step, summed over its pods."""

    step_s: int
    times: list[float] = field(default_factory=list)
    """Unix times of the steps' ends, ascending."""
    periods: list[float] = field(default_factory=list)
    throttled: list[float] = field(default_factory=list)
    usage_cores: list[float] = field(default_factory=list)
    """Mean CPU used per pod over the step, cores."""
    peak_cores: list[float] = field(default_factory=list)
    """The busiest pod's CPU over the step, cores."""

    def ratios(self) -> list[tuple[float, float]]:
        """(time, throttled periods / periods) at the steps with periods."""
        return [(t, th / p) for t, p, th in zip(self.times, self.periods, self.throttled,
                                                strict=True) if p >= 1]  # fmt: skip

    def ratio_between(self, start: float, end: float) -> float | None:
        """Throttled periods over periods of the steps ending in (start, end]."""
        periods = throttled = 0.0
        for t, p, th in zip(self.times, self.periods, self.throttled, strict=True):
            if start < t <= end:
                periods, throttled = periods + p, throttled + th
        return throttled / periods if periods >= 1 else None


def pods_pattern(workloads: Iterable[str]) -> str:
    """An RE2 pattern (anchored by PromQL) for the pods of these workloads (references:
    :func:`~unthrottle.model.owners.ref`), one alternative per kind present."""
    by_kind: dict[str, list[str]] = {}
    for reference in sorted(set(workloads)):
        kind, name = kind_and_name(reference)
        by_kind.setdefault(kind, []).append(regex_literal(name))
    parts = [f"({'|'.join(names)}){POD_SUFFIX[kind]}" for kind, names in by_kind.items()]
    return parts[0] if len(parts) == 1 else "|".join(f"({p})" for p in parts)


def series_queries(namespaces: Iterable[str], deployments: Iterable[str],
                   step_s: int) -> dict[str, str]:  # fmt: skip
    """The three counters' increase per step for these Deployments' pods, per container."""
    matchers = (namespaces_matcher(sorted(set(namespaces))),
                f"pod=~{string(pods_pattern(deployments))}", *CONTAINERS)  # fmt: skip
    every = _counters(matchers, f"{int(step_s)}s")
    return {name: every[name] for name in SERIES_QUERIES}


def batches(keys: Iterable[WorkloadKey]) -> list[list[tuple[str, str]]]:
    """(namespace, Deployment) pairs in batches whose pod pattern stays under
    :data:`MAX_PATTERN_CHARS`."""
    out: list[list[tuple[str, str]]] = [[]]
    size = 0
    for pair in sorted({(k.namespace, k.deployment) for k in keys}):
        cost = len(regex_literal(pair[1])) + 1
        if out[-1] and size + cost > MAX_PATTERN_CHARS:
            out.append([])
            size = 0
        out[-1].append(pair)
        size += cost
    return [b for b in out if b]


def fetch_series(
    source: MetricsSource,
    keys: Iterable[WorkloadKey],
    *,
    end: float,
    window_s: int,
    concurrency: int = CONCURRENCY,
    on_query: Callable[[str], None] | None = None,
) -> dict[WorkloadKey, ContainerSeries]:
    """The counters of ``keys`` per step over the window ending at ``end``; a container
    without samples is left out. Raises :class:`MetricsError` when Prometheus cannot
    answer (a batch it refuses as too big is sent again in halves, down to one
    Deployment)."""
    wanted = set(keys)
    step = step_for(window_s)
    start = end - window_s + step
    answers: dict[str, list[RangeSeries]] = {name: [] for name in SERIES_QUERIES}

    def send(batch: list[tuple[str, str]], name: str) -> list[RangeSeries]:
        promql = series_queries((ns for ns, _ in batch), (d for _, d in batch), step)[name]
        try:
            found = source.range(promql, start, end, step)
        except MetricsError as error:
            if not error.too_big or len(batch) < 2:
                raise
            half = len(batch) // 2
            return send(batch[:half], name) + send(batch[half:], name)
        if on_query is not None:
            on_query(name)
        return found

    jobs = [(b, name) for b in batches(wanted) for name in SERIES_QUERIES]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for (_, name), found in zip(jobs, pool.map(lambda j: send(*j), jobs), strict=True):
            answers[name] += found
    return _grouped(wanted, answers, step)


def _grouped(wanted: set[WorkloadKey], answers: dict[str, list[RangeSeries]],
             step: int) -> dict[WorkloadKey, ContainerSeries]:  # fmt: skip
    """Per Deployment container and step: periods and throttled periods summed over its
    pods; usage as the mean per pod and the busiest pod's."""
    per: dict[WorkloadKey, dict[float, list[float]]] = {}  # time → [periods, throttled, …]
    usage: dict[WorkloadKey, dict[float, list[float]]] = {}  # time → each pod's cores

    names = frozenset(k.deployment for k in wanted)

    def key_of(s: RangeSeries) -> WorkloadKey | None:
        ns, pod, container = (s.labels.get(k, "") for k in ("namespace", "pod", "container"))
        reference = workload_of_pod_name(pod, names)
        key = None if reference is None else WorkloadKey(ns, reference, container)
        return key if key in wanted else None

    for index, name in enumerate(("periods", "throttled_periods")):
        for s in answers[name]:
            key = key_of(s)
            if key is None:
                continue
            steps = per.setdefault(key, {})
            for t, v in zip(s.times, s.values, strict=True):
                if math.isfinite(v):
                    steps.setdefault(t, [0.0, 0.0])[index] += max(0.0, v)
    for s in answers["usage_seconds"]:
        key = key_of(s)
        if key is None:
            continue
        steps = usage.setdefault(key, {})
        for t, v in zip(s.times, s.values, strict=True):
            if math.isfinite(v):
                steps.setdefault(t, []).append(max(0.0, v) / step)
    out = {}
    for key in per.keys() | usage.keys():
        counted, used = per.get(key, {}), usage.get(key, {})
        series = ContainerSeries(step)
        for t in sorted(counted.keys() | used.keys()):
            periods, throttled = counted.get(t, [0.0, 0.0])
            pods = used.get(t, [])
            series.times.append(t)
            series.periods.append(periods)
            series.throttled.append(min(throttled, periods))
            series.usage_cores.append(sum(pods) / len(pods) if pods else 0.0)
            series.peak_cores.append(max(pods, default=0.0))
        out[key] = series
    return out
