"""Evidence per Deployment container, from Prometheus, in a fixed number of queries.

For a selection of namespaces, nine queries in all, whatever the number of
pods:
- pod → ReplicaSet and ReplicaSet → Deployment (kube-state-metrics'
  ``kube_pod_owner``, ``kube_replicaset_owner``);
- cAdvisor's four CPU counters, increased over the window;
- the agent's demand histogram (``unthrottle_cpu_demand_cores_bucket``);
- today's CPU limits and requests (``kube_pod_container_resource_*``).

Results are grouped in Python by (namespace, deployment, container). Summing
increases over a Deployment's pods handles pod churn: a pod that lived an hour
of the window adds an hour of periods. Usage per active period, rather than
per pod, keeps the average honest whatever the churn. A container with no
periods at all has evidence ``none``, and no recommendation is made from it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from unthrottle.metrics.promql import BY_CONTAINER, cadvisor_queries, namespaces_matcher, selector
from unthrottle.metrics.source import MetricsSource, Sample
from unthrottle.recommend.histogram import evidence_from_histogram
from unthrottle.recommend.types import CounterEvidence, PeriodEvidence

DEFAULT_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    """A Deployment's container."""

    namespace: str
    deployment: str
    container: str


@dataclass
class ContainerEvidence:
    """What Prometheus knows of one Deployment container over the window."""

    key: WorkloadKey
    pods: set[str] = field(default_factory=set)
    usage_s: float = 0.0
    periods: float = 0.0
    throttled_periods: float = 0.0
    throttled_s: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)
    """Agent histogram: upper bound (cores) → cumulative windows, summed over pods."""
    limit_millicores: int | None = None
    request_millicores: int = 0
    gomaxprocs_env: int | None = None
    """An explicit GOMAXPROCS in the container's environment (cluster mode only)."""

    @property
    def kind(self) -> str:
        """``period`` (agent histogram), ``counters`` (cAdvisor only) or ``none``."""
        if self.buckets and max(self.buckets.values(), default=0) >= 1:
            return "period"
        return "counters" if self.periods >= 1 else "none"

    def throttle_ratio(self) -> float | None:
        """Throttled periods over periods (None without periods)."""
        return self.throttled_periods / self.periods if self.periods >= 1 else None

    def counters(self, window_s: float, period_us: int = DEFAULT_PERIOD_US) -> CounterEvidence:
        """Counter-level evidence; usage is per active period, so pod churn does not dilute it."""
        period_s = period_us / 1e6
        usage_cores = self.usage_s / (self.periods * period_s) if self.periods >= 1 else 0.0
        return CounterEvidence(
            window_s=window_s,
            usage_cores=usage_cores,
            nr_periods=round(self.periods),
            nr_throttled=round(self.throttled_periods),
            throttled_s=self.throttled_s,
        )

    def period_evidence(self, period_us: int = DEFAULT_PERIOD_US) -> PeriodEvidence:
        """Period-level evidence rebuilt from the agent's histogram."""
        bounds = sorted(self.buckets)
        evidence = evidence_from_histogram(
            bounds, [self.buckets[b] for b in bounds], period_us=period_us
        )
        ratio = self.throttle_ratio()
        return PeriodEvidence(evidence.demand_us, period_us, observed_throttle_ratio=ratio)


class _Announcing:
    """A source that says each query's metric before sending it (for a progress display)."""

    def __init__(self, inner: MetricsSource, say: Callable[[str], None]) -> None:
        self.inner, self.say = inner, say

    def instant(self, promql: str, at: float | None = None) -> list[Sample]:
        match = re.search(r"[a-z_]+(?=\{)", promql)
        self.say(match.group(0) if match else promql[:40])
        return self.inner.instant(promql, at)


QUERIES_WITH_OWNERS = 9
"""Queries :func:`fetch` sends when it must ask kube-state-metrics for owners (7 otherwise)."""


def _owners(source: MetricsSource, ns: str, at: float | None) -> dict[tuple[str, str], str]:
    """(namespace, pod) → Deployment, through ReplicaSets."""
    rs_to_deploy = {
        (s.labels["namespace"], s.labels["replicaset"]): s.labels["owner_name"]
        for s in source.instant(
            selector("kube_replicaset_owner", ns, 'owner_kind="Deployment"'), at
        )
    }
    owners = {}
    for s in source.instant(selector("kube_pod_owner", ns, 'owner_kind="ReplicaSet"'), at):
        deploy = rs_to_deploy.get((s.labels["namespace"], s.labels["owner_name"]))
        if deploy is not None:
            owners[(s.labels["namespace"], s.labels["pod"])] = deploy
    return owners


def fetch(
    source: MetricsSource,
    namespaces: list[str],
    window: str,
    *,
    at: float | None = None,
    owners: dict[tuple[str, str], str] | None = None,
    on_query: Callable[[str], None] | None = None,
) -> dict[WorkloadKey, ContainerEvidence]:
    """Every Deployment container of these namespaces (all when empty), with its evidence.

    ``owners`` ((namespace, pod) → Deployment) comes from the Kubernetes API when there
    is cluster access; without it, kube-state-metrics is asked (two more queries).
    """
    if on_query is not None:
        source = _Announcing(source, on_query)
    ns = namespaces_matcher(namespaces)
    if owners is None:
        owners = _owners(source, ns, at)
    found: dict[WorkloadKey, ContainerEvidence] = {}

    def entry(labels: dict[str, str]) -> ContainerEvidence | None:
        deploy = owners.get((labels.get("namespace", ""), labels.get("pod", "")))
        if deploy is None or not labels.get("container") or labels["container"] == "POD":
            return None
        key = WorkloadKey(labels["namespace"], deploy, labels["container"])
        item = found.setdefault(key, ContainerEvidence(key))
        item.pods.add(labels["pod"])
        return item

    fields = {
        "usage_seconds": "usage_s",
        "periods": "periods",
        "throttled_periods": "throttled_periods",
        "throttled_seconds": "throttled_s",
    }
    for name, query in cadvisor_queries(namespaces, window).items():
        for s in source.instant(query, at):
            item = entry(s.labels)
            if item is not None and math.isfinite(s.value):
                setattr(item, fields[name], getattr(item, fields[name]) + s.value)

    histogram = (
        f"sum by ({BY_CONTAINER}, le) (increase("
        f"{selector('unthrottle_cpu_demand_cores_bucket', ns)}[{window}]))"
    )
    per_pod: dict[WorkloadKey, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for s in source.instant(histogram, at):
        item = entry(s.labels)
        if item is not None and math.isfinite(s.value):
            per_pod[item.key][float(s.labels["le"])] += s.value
    for key, buckets in per_pod.items():
        found[key].buckets = dict(buckets)

    resources = (
        ("kube_pod_container_resource_limits", "limit_millicores"),
        ("kube_pod_container_resource_requests", "request_millicores"),
    )
    for metric, attr in resources:
        for s in source.instant(selector(metric, ns, 'resource="cpu"'), at):
            item = entry(s.labels)
            if item is not None and math.isfinite(s.value):
                # the largest across pods: a rollout in progress may mix old and new values
                value = math.ceil(s.value * 1000)
                setattr(item, attr, max(getattr(item, attr) or 0, value))
    return found
