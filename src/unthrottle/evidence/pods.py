"""The pod's own quota, in the evidence (pure).

A kubelet gives a pod whose containers all have limits a quota of its own, the sum of
theirs; when it runs out first the containers stall and their own counters do not show it
(docs/recommend.md, "The pod's own quota"). A window in which the pod was throttled is one
in which each of its running containers wanted more than it got, so each container gets a
share of its pod's throttling, pod by pod (:func:`share_pod_throttling`): of the throttled
time, in proportion to its usage over the span (the kernel sums a group's throttled time
over the CPUs it was stalled on, and a container that ran on more of them was stalled on
more); of the throttled periods, the pod's throttled periods in proportion to the share of
the pod's periods in which the container was active (a throttled period of the pod stalls
every container that was running in it, whole). :func:`canary_ratios` applies the same rule
to one pod's counters (the operator's in-place canary)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from unthrottle.evidence.containers import ContainerEvidence
from unthrottle.model.owners import Owners
from unthrottle.model.podlevel import POD_ROW


class PodLevel:
    """The pods' own counters (``container=""``) and their containers' usage and periods,
    per step of the evaluation, until :meth:`share` gives each container its share."""

    def __init__(self) -> None:
        # (step, namespace, pod) → counter name → the pod cgroup's increase
        self.pods: dict[tuple[int, str, str], dict[str, float]] = {}
        # (step, namespace, pod) → container → [evidence, usage, periods]
        self.members: dict[tuple[int, str, str], dict[str, list[Any]]] = {}
        # what :meth:`note` was given: counted in :meth:`share`, for the pods that have
        # counters of their own (most answers hold none; their containers cost nothing)
        self._notes: list[tuple[dict[str, str], str, Sequence[int],
                                list[ContainerEvidence], Sequence[float]]] = []  # fmt: skip

    def add(self, owners: Owners, labels: dict[str, str], name: str, at: Sequence[int],
            values: Sequence[float]) -> None:  # fmt: skip
        """A pod cgroup's series (of a Deployment's pod; others are not evidence)."""
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if name not in POD_COUNTERS or owners.workload_of(ns, pod) is None:
            return
        for k, value in zip(at, values, strict=False):
            if math.isfinite(value):
                counters = self.pods.setdefault((k, ns, pod), {})
                counters[name] = counters.get(name, 0.0) + value

    def note(self, labels: dict[str, str], name: str, at: Sequence[int],
             items: list[ContainerEvidence] | None, values: Sequence[float]) -> None:  # fmt: skip
        """A container's usage or periods in one pod, which its share is measured by."""
        if items is not None and name in ("usage_seconds", "periods"):
            self._notes.append((labels, name, at, items, values))

    def _members(self) -> None:
        """The noted containers' usage and periods, for the pods that have counters."""
        pods = {(ns, pod) for _, ns, pod in self.pods}
        for labels, name, at, items, values in self._notes:
            ident = (labels.get("namespace", ""), labels.get("pod", ""))
            if ident not in pods:
                continue
            column = 1 if name == "usage_seconds" else 2
            for k, item, value in zip(at, items, values, strict=False):
                member = self.members.setdefault((k, *ident), {}).setdefault(
                    labels.get("container", ""), [item, 0.0, 0.0]
                )
                member[column] += value if math.isfinite(value) else 0.0
        self._notes.clear()

    def share(self) -> None:
        """Give every container its share of its pod's throttling at each step."""
        self._members()
        for at, counters in self.pods.items():
            members = self.members.get(at)
            if not members:
                continue
            found = share_pod_throttling(
                counters.get("periods", 0.0),
                counters.get("throttled_periods", 0.0),
                counters.get("throttled_seconds", 0.0),
                {c: (m[1], m[2]) for c, m in members.items()},
            )
            for container, (periods, seconds) in found.items():
                item = members[container][0]
                item.pod_throttled_periods += periods
                item.pod_throttled_s += seconds


POD_COUNTERS = ("periods", "throttled_periods", "throttled_seconds")


def share_pod_throttling(
    periods: float, throttled_periods: float, throttled_s: float,
    members: dict[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Each container's share of its pod's throttling over one span: container → (throttled
    periods, throttled seconds), from the pod cgroup's periods, throttled periods and
    throttled time and each container's (usage seconds, periods) over the same span.

    Time in proportion to usage (equal shares if none ran); periods in proportion to the
    share of the pod's periods the container was active in, at most all of them.
    """
    total_usage = sum(usage for usage, _ in members.values())
    out = {}
    for container, (usage, active) in members.items():
        part = usage / total_usage if total_usage > 0 else 1 / len(members)
        seen = min(1.0, active / periods) if periods > 0 else 0.0
        out[container] = (throttled_periods * seen, throttled_s * part)
    return out


def canary_ratios(
    usage_s: dict[str, float], periods: dict[str, float], throttled: dict[str, float]
) -> dict[str, tuple[float, float]]:
    """One pod's containers over a span: container → (throttle ratio, periods), from each
    container's usage, periods and throttled periods, keyed by ``container`` label; the
    pod's own cgroup is ``""`` (:func:`unthrottle.metrics.promql.pod_counter_queries`).

    A container's ratio counts its share of the pod's own throttled periods as the
    evidence does (:func:`share_pod_throttling`): an in-place canary is verified by the
    same measure its recommendation was made from. Before, a canary whose pod quota (the
    sum of its new limits) throttled it read only its own counters. The pod cgroup's own
    ratio is the row of a pod-level limit (:data:`~unthrottle.model.podlevel.POD_ROW`).
    """
    pod_periods, pod_throttled = periods.get("", 0.0), throttled.get("", 0.0)
    members = {c: (usage_s.get(c, 0.0), n) for c, n in periods.items() if c and n > 0}
    shares = (share_pod_throttling(pod_periods, pod_throttled, 0.0, members)
              if members and pod_periods > 0 else {})  # fmt: skip
    out = {
        c: (min(1.0, (throttled.get(c, 0.0) + shares.get(c, (0.0, 0.0))[0]) / n), n)
        for c, (_, n) in members.items()
    }
    if pod_periods > 0:
        out[POD_ROW] = (min(1.0, pod_throttled / pod_periods), pod_periods)
    return out
