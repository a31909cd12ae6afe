"""The operator's own metrics (served on ``--metrics``): reconcile duration, policies by
condition, recommendations by state, Prometheus queries and errors."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class _QueriesSent(Collector):
    """The Prometheus client's own count of queries, read at scrape time."""

    def __init__(self, queries: Callable[[], int]) -> None:
        self.queries = queries

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("unthrottle_operator_prometheus_queries",
                                  "Prometheus queries sent.", value=self.queries())  # fmt: skip


class Telemetry:
    """Metrics in a registry of their own (tests make as many as they like)."""

    def __init__(self, queries: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "unthrottle_operator_reconcile_duration_seconds", "Time one policy's reconcile took.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120), registry=self.registry,
        )  # fmt: skip
        self.faults = Counter("unthrottle_operator_reconcile_faults_total",
                              "Reconciles that failed, by reason.", ["reason"],
                              registry=self.registry)  # fmt: skip
        self.policies = Gauge("unthrottle_operator_policies",
                              "Policies by the reason of their last reconcile (Reconciled when "
                              "it succeeded).", ["condition"], registry=self.registry)  # fmt: skip
        self.recommendations = Gauge("unthrottle_operator_recommendations",
                                     "Deployments by state, over every policy.", ["state"],
                                     registry=self.registry)  # fmt: skip
        self.errors = Counter(
            "unthrottle_operator_prometheus_errors_total",
            "Prometheus queries or reads that failed.",
            registry=self.registry,
        )
        if queries is not None:
            self.registry.register(_QueriesSent(queries))
        self._last: dict[str, str] = {}
        self._states: dict[str, Tally[str]] = {}

    def reconciled(self, policy: str, seconds: float, fault: str | None) -> None:
        """One reconcile's duration and outcome; the policy is counted under it."""
        self.duration.observe(seconds)
        if fault is not None:
            self.faults.labels(fault).inc()
        self._last[policy] = fault or "Reconciled"
        self.policies.clear()
        for reason, n in Tally(self._last.values()).items():
            self.policies.labels(reason).set(n)

    def states(self, policy: str, states: Mapping[str, StrEnum]) -> None:
        """A policy's Deployments by state."""
        self._states[policy] = Tally(s.value for s in states.values())
        self._publish()

    def forget(self, policy: str) -> None:
        """A policy is gone."""
        self._last.pop(policy, None)
        self._states.pop(policy, None)
        self._publish()

    def prometheus_error(self) -> None:
        """A read from Prometheus failed."""
        self.errors.inc()

    def _publish(self) -> None:
        total: Tally[str] = Tally()
        for tally in self._states.values():
            total.update(tally)
        self.recommendations.clear()
        for state, n in total.items():
            self.recommendations.labels(state).set(n)
