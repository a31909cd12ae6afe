"""A shop of Deployments with known 100 ms demand: Prometheus history and API objects.

Each workload's demand is a mix of quiet windows (uniform up to twice its base) and
bursts (around ``burst`` cores in a ``share`` of windows), as in ``make demo``.
:func:`openmetrics` writes what the agent and cAdvisor would have exported, one
sample a minute; :func:`deploy` puts their Deployments on the real control plane
(tests/kube.py), whose controllers make the ReplicaSets and kwok's pods (owners come from
the API, as in cluster mode).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from cluster_query import BOUNDS, backlog_rates, cdf
from unthrottle.agent.sampling import BUCKETS_CORES

DAY, STEP = 86_400, 60


@dataclass(frozen=True)
class Workload:
    """A workload (a Deployment unless ``kind`` says otherwise) with one container whose
    demand is known."""

    namespace: str
    name: str
    base: float
    """Quiet windows: uniform on (0, 2·base] cores."""
    share: float
    """Share of windows that burst."""
    burst: float
    """Cores a burst wants (±10 %)."""
    limit: float
    """CPU limit in cores."""
    pods: int = 2
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    container: str = "app"
    env: tuple[tuple[str, str], ...] = ()
    template_hash: str = "7c9d8f"
    """The pod-template-hash of its ReplicaSet: a rollout makes a new one."""
    cfs_periods: tuple[float, ...] = ()
    """The CFS period of each pod's node, s, in turn (the agent's gauge); empty: no gauge,
    and the kubelet's default 100 ms."""

    backlog: bool = True
    """Export the agent's backlog series (the order of the windows: each independent of
    the last); False: an agent from before them, the histogram alone."""

    names: tuple[str, ...] = ()
    """Its pods' names, when they are real pods (an in-place canary's own history); empty:
    names as the ReplicaSet controller makes them, of pods gone by now."""

    kind: str = "Deployment"
    """Deployment, StatefulSet or DaemonSet: its pods are named as its controller names
    them, and :func:`deploy` makes its object."""

    pod_level: bool = False
    """Its limit is the pod's (``spec.resources``) and its container has none: the pod
    cgroup (``container=""``) has the series too, and the container's cgroup the same
    quota (the kubelet gives a container without a limit its pod's)."""

    def period_of(self, pod: int) -> float:
        """The CFS period of the node pod number ``pod`` runs on, s."""
        return self.cfs_periods[pod % len(self.cfs_periods)] if self.cfs_periods else 0.1

    @property
    def replicaset(self) -> str:
        return f"{self.name}-{self.template_hash}"

    @property
    def ref(self) -> str:
        """As unthrottle names it: ``checkout``, ``statefulset/db``."""
        return self.name if self.kind == "Deployment" else f"{self.kind.lower()}/{self.name}"

    def pod_names(self) -> list[str]:
        """Names as its controller makes them: ``<rs>-<5 chars>`` (a Deployment's ReplicaSet),
        ``<statefulset>-<ordinal>``, ``<daemonset>-<5 chars>``."""
        if self.names:
            return list(self.names)
        if self.kind == "StatefulSet":
            return [f"{self.name}-{p}" for p in range(self.pods)]
        if self.kind == "DaemonSet":
            return [f"{self.name}-{'bcdfg'[p]}7q9w" for p in range(self.pods)]
        return [f"{self.replicaset}-{'bcdfg'[p]}2x4k" for p in range(self.pods)]

    def throttled_share(self) -> float:
        return 1 - cdf(self.base, self.share, self.burst, self.limit)


THROTTLED = Workload("shop", "checkout", 0.1, 0.10, 1.2, 0.5, 3, {"team": "pay"})
"""Bursts to 1.2 cores in one window in ten under 500m: 10 % of periods throttled."""
HEALTHY = Workload("shop", "catalog", 0.3, 0.0, 0.0, 1.0, 2, {"team": "pay"})
"""A steady 0.3 core (up to 0.6) under 1 CPU: never throttled."""


def openmetrics(workloads: list[Workload], end: int, span: int = DAY, step: int = STEP,
                start: int | None = None) -> str:  # fmt: skip
    """OpenMetrics text (without ``# EOF``) from ``end - span`` (or ``start``) to ``end``."""
    lines: list[str] = []
    first = end - span if start is None else start
    times = range(first, end + 1, step)

    def emit(name: str, labels: str, rate: float) -> None:
        # counters grow from the epoch of the history, so later chunks continue them
        lines.extend(f"{name}{{{labels}}} {rate * (t - (end - span)):.10g} {t}" for t in times)

    for w in workloads:
        for p, pod in enumerate(w.pod_names()):
            container = f'namespace="{w.namespace}",pod="{pod}",container="{w.container}"'
            if w.base == 0:
                continue
            throttled = w.throttled_share()
            mean = (1 - w.share) * w.base + w.share * w.burst
            period = w.period_of(p)  # the kernel counts periods at its node's period
            cgroups = [container]
            if w.pod_level:  # the pod cgroup's too (its container has the same quota)
                cgroups.append(f'namespace="{w.namespace}",pod="{pod}",container=""')
            for labels in cgroups:
                _cgroup(w, labels, emit, lines, times, mean, throttled, period)
    return "\n".join(lines) + "\n"


def _cgroup(w: Workload, labels: str, emit: Any, lines: list[str], times: range,
            mean: float, throttled: float, period: float) -> None:  # fmt: skip
    """One cgroup's series: cAdvisor's counters and the agent's gauge and histograms."""
    for metric, rate in (("usage_seconds", min(mean, w.limit)),
                         ("cfs_periods", 1 / period),
                         ("cfs_throttled_periods", throttled / period),
                         ("cfs_throttled_seconds", throttled / 2)):  # fmt: skip
        emit(f"container_cpu_{metric}_total", labels, rate)
    if w.cfs_periods:  # a gauge: its value, not a rate
        lines.extend(f"unthrottle_cpu_cfs_period_seconds{{{labels}}} {period} {t}"
                     for t in times)  # fmt: skip
    for le, bound in zip(BOUNDS, (*BUCKETS_CORES, math.inf), strict=True):
        emit("unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"',
             10 * cdf(w.base, w.share, w.burst, bound))  # fmt: skip
    if w.backlog:
        for name, extra, rate in backlog_rates(w.base, w.share, w.burst):
            emit(name, f"{labels},{extra}" if extra else labels, rate)


def deployment(w: Workload) -> dict[str, Any]:
    """The workload's object: a Deployment, or a StatefulSet or DaemonSet of ``w.kind``."""
    env = [{"name": k, "value": v} for k, v in w.env]
    kind_spec: dict[str, Any] = {"replicas": w.pods}
    placement: dict[str, Any] = {}
    if w.kind == "StatefulSet":
        kind_spec.update(serviceName=w.name, podManagementPolicy="Parallel")
    elif w.kind == "DaemonSet":
        kind_spec = {}
    if w.kind != "Deployment":  # kwok's nodes only: no pod of theirs on the real node
        placement = {"nodeSelector": {"type": "kwok"}}
    resources = {"limits": {"cpu": f"{round(w.limit * 1000)}m"},
                 "requests": {"cpu": f"{round(w.limit * 500)}m"}}  # fmt: skip
    if w.pod_level:  # the pod's, its container's none (Kubernetes 1.34: beta, on)
        placement = {**placement, "resources": resources}
    return {
        "apiVersion": "apps/v1",
        "kind": w.kind,
        "metadata": {"namespace": w.namespace, "name": w.name, "labels": dict(w.labels),
                     "annotations": dict(w.annotations)},
        "spec": {
            **kind_spec,
            "selector": {"matchLabels": {"app": w.name}},
            "template": {
                "metadata": {"labels": {"app": w.name}},
                "spec": {**placement, "containers": [{
                    "name": w.container, "image": "registry.example/shop:1",
                    "env": env, "resources": {} if w.pod_level else resources,
                }]},
            },
        },
    }  # fmt: skip


def deploy(kube: Any, workloads: list[Workload]) -> list[Workload]:
    """Put the workloads on the real control plane (tests/kube.py) and return them as they
    landed: each namespace renamed to a fresh one (``shop`` → ``shop-1a2b3c``, the same for
    every workload of it), and each ``template_hash`` the one the real Deployment controller
    gave its ReplicaSet. History written for the returned workloads (:func:`openmetrics`)
    names pods ``<replicaset>-xxxxx`` that are gone by now, as a window's pods mostly are:
    unthrottle finds their Deployment through the ReplicaSet's name."""
    from kube import fresh_name

    renamed: dict[str, str] = {}
    for w in workloads:
        if w.namespace not in renamed:
            renamed[w.namespace] = fresh_name(w.namespace)
            kube.create_namespace(renamed[w.namespace])
    placed = [replace(w, namespace=renamed[w.namespace]) for w in workloads]
    for w in placed:
        kube.create(f"apps/v1/{w.kind.lower()}s", deployment(w))
    out = []
    for w in placed:
        if w.kind != "Deployment":  # its pods are its own: no ReplicaSet, no template hash
            out.append(replace(w, names=own_pods(kube, w)))
            continue
        rs = kube.replicaset_of(kube.rolled_out(w.namespace, w.name))
        out.append(replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"]))
    return out


def own_pods(kube: Any, w: Workload) -> tuple[str, ...]:
    """The names of the live pods the StatefulSet or DaemonSet of ``w`` made, once its
    rollout is done (``kubectl rollout status``; one pod per kwok node for a DaemonSet)."""
    from unthrottle.operator.gates import rollout

    resource = f"apps/v1/{w.kind.lower()}s"
    kube.until(f"{w.kind} {w.name} rolled out",
               lambda: {"kind": w.kind, **(kube.get(resource, w.namespace, w.name) or {})},
               lambda obj: rollout(obj) == "done", timeout_s=90.0)  # fmt: skip
    uid = (kube.get(resource, w.namespace, w.name) or {})["metadata"]["uid"]

    def ours() -> list[str]:
        return sorted(p["metadata"]["name"] for p in kube.list("v1/pods", w.namespace)
                      if not p["metadata"].get("deletionTimestamp")
                      and any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences")
                              or [])
                      and (p.get("status") or {}).get("phase") == "Running")  # fmt: skip

    obj = kube.get(resource, w.namespace, w.name) or {}
    status = obj.get("status") or {}
    wanted = status.get("desiredNumberScheduled") or (obj.get("spec") or {}).get("replicas", 1)
    return tuple(kube.until(f"{w.kind} {w.name}'s pods", ours, lambda n: len(n) == wanted))


def rehash(kube: Any, w: Workload, **changes: Any) -> Workload:
    """``w`` after its Deployment's rollout: the new ReplicaSet's hash (and ``changes``)."""
    rs = kube.replicaset_of(kube.rolled_out(w.namespace, w.name))
    return replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"], **changes)
