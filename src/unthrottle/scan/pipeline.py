"""The scan, in named steps: select Deployments → gather evidence → assess (advise, assemble).

:func:`scan` runs them all for a one-shot read of the window (``unthrottle
recommend``). The operator runs :func:`select` and :func:`assess` itself, with
evidence folded incrementally in between, and an :class:`~unthrottle.scan.reuse.EngineCache`
so the engine runs only where evidence changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from unthrottle.evidence.containers import ContainerEvidence, WorkloadKey
from unthrottle.evidence.fetching import fetch, recorded_covers, workload_labels
from unthrottle.kube.workloads import ContainerSpec, DeploymentInfo, WorkloadStore
from unthrottle.metrics.source import MetricsSource
from unthrottle.model.owners import KINDS, Owners, kind_of
from unthrottle.model.podlevel import POD_ROW, is_pod_row
from unthrottle.recommend import Current, Policy, Recommendation, Runtime, Strategy
from unthrottle.scan.advise import Job, advise_all
from unthrottle.scan.request import History, ScanRequest
from unthrottle.scan.result import (
    FATAL,
    ContainerResult,
    Problem,
    ProblemKind,
    ScanResult,
    WorkloadResult,
)
from unthrottle.scan.reuse import EngineCache


class ScanError(RuntimeError):
    """The scan could not read what it needs; the message says what to check."""


class ClusterError(ScanError):
    """The Kubernetes API could not be read."""


@dataclass
class Selection:
    """The Deployments a request selects, as far as the cluster tells."""

    deployments: dict[tuple[str, str], DeploymentInfo] | None
    """From the API; None without cluster access (kube-state-metrics alone)."""
    owners: Owners | None
    """Pods and ReplicaSets → Deployment from the API; None: ask kube-state-metrics."""
    chosen: set[tuple[str, str]] | None = None
    """(namespace, Deployment) the selector lets through; None: every one found."""
    specs: dict[WorkloadKey, ContainerSpec] = field(default_factory=dict)


def kinds_text(request: ScanRequest, found: Iterable[WorkloadKey] | None = None) -> str:
    """``Deployments``, ``Deployments or StatefulSets``: the kinds a request covers (or, with
    ``found``, those of the workloads found)."""
    kinds = request.kinds if found is None else {kind_of(k.deployment) for k in found}
    names = [f"{k}s" for k in KINDS if k in kinds]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def where(request: ScanRequest) -> str:
    """``shop, web matching 'app=api'``: the selection, for messages."""
    text = ", ".join(request.namespaces) if request.namespaces else "any namespace"
    if request.selector.requirements:
        text += f" matching {request.selector.text()!r}"
    return text


def select(request: ScanRequest, store: WorkloadStore | None, metrics: MetricsSource) -> Selection:
    """The Deployments and containers the request covers, and who owns which pod."""
    if store is None:
        chosen = None
        if request.selector.requirements:
            exported = workload_labels(metrics, list(request.namespaces), request.now,
                                         request.kinds)  # fmt: skip
            if not exported:
                series = ", ".join(f"kube_{k.lower()}_labels" for k in request.kinds)
                allow = ",".join(f"{k.lower()}s=[app,...]" for k in request.kinds)
                raise ScanError(
                    f"a selector without cluster access needs kube-state-metrics' {series}, "
                    f"and there are none: kube-state-metrics exports {kinds_text(request)} "
                    f"labels only when allowed (--metric-labels-allowlist={allow})"
                )
            chosen = {
                k for k, labels in exported.items() if request.selector.matches_exported(labels)
            }
        return Selection(None, None, chosen)
    try:
        listed = store.deployments(request.namespaces, request.kinds)
        owners = store.pod_owners(request.namespaces, request.kinds, listed)
    except Exception as error:  # the API client raises many kinds
        raise ClusterError(
            f"cannot read {kinds_text(request)} from the Kubernetes API: {error}"
        ) from None
    deployments = {(d.namespace, d.ref): d for d in listed if request.selector.matches(d.labels)}
    specs = {
        WorkloadKey(d.namespace, d.ref, spec.name): spec
        for d in deployments.values()
        for spec in d.containers.values()
    }
    owners.pod_level |= {key for key, d in deployments.items() if POD_ROW in d.containers}
    return Selection(deployments, owners, set(deployments), specs)


def gather(
    request: ScanRequest,
    metrics: MetricsSource,
    selection: Selection,
    *,
    on_query: Callable[[str], None] | None = None,
) -> tuple[dict[WorkloadKey, ContainerEvidence], list[Problem]]:
    """The whole window's evidence for the selection, in a handful of batched queries."""
    namespaces = list(request.namespaces)
    recorded = request.history == History.RECORDED
    if request.history == History.AUTO:
        recorded = recorded_covers(metrics, namespaces, request.window_s, request.now)
    problems = []
    if recorded:
        problems.append(
            Problem(
                ProblemKind.RECORDED_SERIES, "reading the series of unthrottle's recording rules"
            )
        )
    found = fetch(metrics, namespaces, request.window_s, at=request.now,
                  owners=selection.owners, on_query=on_query,
                  concurrency=request.concurrency, recorded=recorded,
                  kinds=request.kinds)  # fmt: skip
    return found, problems


def _ms(us: int) -> str:
    return f"{us / 1000:g} ms"


def period_of(request: ScanRequest, item: ContainerEvidence) -> tuple[int, str]:
    """A container's CFS period, µs, and where it comes from, for people.

    The node agent's, where it reports one for the container's pods; when they run on
    nodes whose kubelets differ, the largest (the agent clamps a burst to each node's own
    quota, so sizing at the largest never asks a node for less than it can take). Else
    the request's (``--cfs-period``): cAdvisor's counters carry no period."""
    seen = sorted(item.agent_periods_us)
    if not seen:
        return request.cfs_period_us, f"from {request.cfs_period_from} (no agent series)"
    if len(seen) == 1:
        return seen[0], "from the node agent"
    return seen[-1], (f"the largest the node agent reports for its pods "
                      f"({', '.join(_ms(p) for p in seen)})")  # fmt: skip


def period_reason(request: ScanRequest, item: ContainerEvidence) -> str:
    """``CFS period 50 ms, from the node agent``: the first of a recommendation's reasons."""
    period, source = period_of(request, item)
    return f"CFS period {_ms(period)}, {source}"


def _merged(
    request: ScanRequest, selection: Selection, found: dict[WorkloadKey, ContainerEvidence]
) -> dict[WorkloadKey, ContainerEvidence]:
    """The selected containers' evidence with the API's settings; selected Deployments with
    no series yet are listed too. A burst annotation is resolved at the container's CFS
    period, as the agent resolves it on its node."""
    if selection.chosen is not None:
        found = {k: v for k, v in found.items() if (k.namespace, k.deployment) in selection.chosen}
    for key, spec in selection.specs.items():
        item = found.setdefault(key, ContainerEvidence(key))
        item.limit_millicores, item.request_millicores = (
            spec.limit_millicores,
            spec.request_millicores,
        )
        item.gomaxprocs_env = spec.gomaxprocs_env
        item.burst_us = spec.burst_at(period_of(request, item)[0])
    if selection.deployments is not None:  # the API is the truth: Deployments gone are gone
        found = {
            k: v for k, v in found.items() if (k.namespace, k.deployment) in selection.deployments
        }
    if selection.owners is not None and selection.owners.pod_level:
        # under a pod-level limit, a container without one of its own is the pod row's
        pod_level, specs = selection.owners.pod_level, selection.specs
        found = {k: v for k, v in found.items()
                 if (k.namespace, k.deployment) not in pod_level or k in specs}  # fmt: skip
    return found


def _problems(
    request: ScanRequest, selection: Selection, found: dict[WorkloadKey, ContainerEvidence]
) -> list[Problem]:
    if not found and not selection.deployments:
        source = (
            "the Kubernetes API lists none"
            if selection.deployments is not None
            else "kube-state-metrics' kube_pod_owner and kube_replicaset_owner series are "
            "needed without cluster access"
        )
        return [Problem(ProblemKind.NO_DEPLOYMENTS,
                        f"no {kinds_text(request)} found in {where(request)}: "
                        f"{source}")]  # fmt: skip
    if all(item.periods < 1 for item in found.values()):
        return [Problem(ProblemKind.NO_COUNTERS,
            f"no CPU counters for the {kinds_text(request, found)} in {where(request)}: neither "
            "cAdvisor's container_cpu_cfs_periods_total nor the unthrottle agent's. Is the "
            "kubelet's /metrics/cadvisor endpoint scraped (job kubelet, metrics_path "
            "/metrics/cadvisor), or the agent's /metrics?")]  # fmt: skip
    if not any(item.kind == "period" for item in found.values()):
        return [Problem(ProblemKind.COUNTERS_ONLY,
            "no unthrottle agent series; recommending from cAdvisor counters "
            "(coarse: 15-60 s samples cannot show 100 ms bursts), at a CFS period of "
            f"{_ms(request.cfs_period_us)} ({request.cfs_period_from})")]  # fmt: skip
    return _mixed_periods(found)


def _mixed_periods(found: dict[WorkloadKey, ContainerEvidence]) -> list[Problem]:
    """One warning naming the Deployments whose pods' nodes have different CFS periods."""
    mixed: dict[tuple[str, str], set[int]] = {}
    for key, item in found.items():
        if len(item.agent_periods_us) > 1:
            mixed.setdefault((key.namespace, key.deployment), set()).update(item.agent_periods_us)
    if not mixed:
        return []
    named = [f"{ns}/{name} ({', '.join(_ms(p) for p in sorted(periods))})"
             for (ns, name), periods in sorted(mixed.items())]  # fmt: skip
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    return [Problem(ProblemKind.MIXED_PERIODS,
        f"pods of {len(named)} Deployments run on nodes with different CFS periods (the "
        f"kubelet's --cpu-cfs-quota-period): {', '.join(named[:5])}{more}; each is sized "
        "at its largest period, and the agent clamps a burst to each node's quota")]  # fmt: skip


def current_of(
    request: ScanRequest, item: ContainerEvidence, spec: ContainerSpec | None
) -> Current:
    """A container's settings today, as the engine takes them (its CFS period from
    :func:`period_of`)."""
    return Current(
        item.limit_millicores,
        min(item.request_millicores, item.limit_millicores or 10**9),
        period_us=period_of(request, item)[0],
        runtime=spec.runtime if spec else Runtime.UNKNOWN,
        go_at_least_1_25=request.go_at_least_1_25,
        gomaxprocs_env=item.gomaxprocs_env,
        burst_us=item.burst_us,
    )


def _advise(
    request: ScanRequest,
    selection: Selection,
    found: dict[WorkloadKey, ContainerEvidence],
    cache: EngineCache | None,
    skip: frozenset[tuple[str, str]],
) -> dict[WorkloadKey, Recommendation | None]:
    """Recommendations for the managed containers; kept ones from the cache. Each one's
    first reason says the CFS period it was made at, and where that came from."""
    recs: dict[WorkloadKey, Recommendation | None] = {}
    jobs: list[Job] = []
    pending: list[tuple[WorkloadKey, Current, Policy]] = []
    for key, item in found.items():
        managed = request.containers is None or key.container in request.containers
        if not managed or (key.namespace, key.deployment) in skip:
            recs[key] = None
            continue
        current = current_of(request, item, selection.specs.get(key))
        policy = policy_of(request, key)
        if cache is not None:
            kept, rec = cache.reusable(key, item, current, policy)
            if kept:
                recs[key] = _noted(rec, *reasons_of(request, key, item))
                continue
        jobs.append((item, current, policy, request.window_s))
        pending.append((key, current, policy))
    for (key, current, policy), rec in zip(pending, advise_all(jobs, request.jobs), strict=True):
        recs[key] = _noted(rec, *reasons_of(request, key, found[key]))
        if cache is not None:  # the engine's own: the source of the period may change alone
            cache.keep(key, found[key], current, policy, rec)
    if cache is not None:
        cache.forget_except(set(found))
    return recs


POD_ROW_REASON = ("the pod's own CPU limit (spec.resources): sized from the pod cgroup, "
                  "limit only (no burst is written for a pod-level limit)")  # fmt: skip


def policy_of(request: ScanRequest, key: WorkloadKey) -> Policy:
    """The engine's policy for a row: the request's, limit only for a pod-level limit's
    (the agent writes a pod cgroup's burst as the sum of its containers', so a burst of
    the pod's own would never be written)."""
    if is_pod_row(key.container) and request.policy.strategy != Strategy.LIMIT_ONLY:
        return replace(request.policy, strategy=Strategy.LIMIT_ONLY)
    return request.policy


def reasons_of(request: ScanRequest, key: WorkloadKey, item: ContainerEvidence) -> list[str]:
    """The reasons every recommendation of this row starts with: its CFS period, and for
    a pod-level limit's row, what it is."""
    first = [period_reason(request, item)]
    return [*first, POD_ROW_REASON] if is_pod_row(key.container) else first


def _noted(rec: Recommendation | None, *reasons: str) -> Recommendation | None:
    """The recommendation with ``reasons`` first (the last stays the one-line reason)."""
    return None if rec is None else replace(rec, reasons=[*reasons, *rec.reasons])


def assess(
    request: ScanRequest,
    selection: Selection,
    found: dict[WorkloadKey, ContainerEvidence],
    *,
    problems: list[Problem] | None = None,
    cache: EngineCache | None = None,
    skip: frozenset[tuple[str, str]] = frozenset(),
) -> ScanResult:
    """Advise every selected container and assemble the result, most harmful first.

    Deployments in ``skip`` (opted out, or another policy's) are listed without
    recommendations."""
    found = _merged(request, selection, found)
    problems = [*(problems or []), *_problems(request, selection, found)]
    fatal = any(p.kind in FATAL for p in problems)
    recs = {} if fatal else _advise(request, selection, found, cache, skip)
    grouped: dict[tuple[str, str], list[ContainerResult]] = {}
    for key in sorted(found):
        item = found[key]
        spec = selection.specs.get(key)
        grouped.setdefault((key.namespace, key.deployment), []).append(ContainerResult(
            name=key.container, limit_millicores=item.limit_millicores,
            request_millicores=item.request_millicores, burst_us=item.burst_us,
            gomaxprocs_env=item.gomaxprocs_env,
            runtime=spec.runtime if spec else Runtime.UNKNOWN, evidence=item.kind,
            pods=len(item.pods), throttle_ratio=item.throttle_ratio(),
            demand=item.demand_millicores(), recommendation=recs.get(key),
            managed=request.containers is None or key.container in request.containers,
            histogram=tuple(sorted(item.buckets.items())),
            period_us=period_of(request, item)[0],
            burst_used=None if item.burst_periods is None else (item.burst_periods,
                                                                item.burst_s or 0.0),
        ))  # fmt: skip
    for ns, name in selection.deployments or {}:
        grouped.setdefault((ns, name), [])  # a Deployment with no containers at all
    target = request.policy.target_ratio
    workloads = []
    for (ns, name), containers in grouped.items():
        info = (selection.deployments or {}).get((ns, name))
        workloads.append(WorkloadResult(
            ns, name, tuple(containers),
            labels=dict(info.labels) if info else {},
            annotations=dict(info.annotations) if info else {},
        ))  # fmt: skip
    workloads.sort(key=lambda w: (-w.harm(target), w.namespace, w.deployment))
    return ScanResult(request.now, request.window_s, target, tuple(workloads), tuple(problems))


def scan(
    request: ScanRequest,
    metrics: MetricsSource,
    store: WorkloadStore | None,
    *,
    on_query: Callable[[str], None] | None = None,
) -> ScanResult:
    """Select, read the whole window, advise: a one-shot scan.

    Raises :class:`ScanError` when the cluster cannot be read, and
    :class:`~unthrottle.metrics.source.MetricsError` when Prometheus cannot answer;
    everything else wrong comes back in :attr:`ScanResult.problems`.
    """
    selection = select(request, store, metrics)
    found, problems = gather(request, metrics, selection, on_query=on_query)
    return assess(request, selection, found, problems=problems)
