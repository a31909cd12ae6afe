"""Evidence per workload container, from Prometheus, in a fixed number of queries.

For a selection of namespaces, eleven queries in all, whatever the number of
pods and whatever the kinds of workload read (nine when the caller has the owners from the
Kubernetes API and leaves out the first two; ``recommend`` adds one for the recording
rules' coverage):
- pod → ReplicaSet, StatefulSet or DaemonSet, and ReplicaSet → Deployment
  (kube-state-metrics' ``kube_pod_owner``, ``kube_replicaset_owner``): one query for the
  pods' owners of every kind asked for;
- the four CPU counters, increased over the window: cAdvisor's, or the agent's
  copies where cAdvisor has none; and the agent's wait
  (``unthrottle_cpu_wait_seconds_total``), which cAdvisor does not have, with the
  kubelet's PSI (``container_pressure_cpu_waiting_seconds_total``, cgroup v2) riding
  along in the same query, labelled ``source="psi"``. Each reads the containers and their
  pods' own cgroups (``container=""``) together: the pod level costs no query;
- the agent's demand histogram (``unthrottle_cpu_demand_cores_bucket``);
- the agent's backlog series and active windows, in one query
  (``unthrottle_cpu_demand_backlog_windows_total … or unthrottle_cpu_active_windows_total``):
  the order of the windows, which the histogram loses (:mod:`unthrottle.cfs.backlog`);
- today's CPU limits and requests (``kube_pod_container_resource_*``); the limits
  query also brings the agent's CFS period gauge (``… or
  unthrottle_cpu_cfs_period_seconds``), which costs no query of its own.

:func:`fetch` sends them as instant queries over the window; the same batch
sent as range queries gives the evidence span by span
(:mod:`unthrottle.evidence.incremental`), and both group their answers with
:func:`gather`.

Results are grouped in Python by (namespace, workload, container). Summing
increases over a workload's pods handles pod churn: a pod that lived an hour
of the window adds an hour of periods. Usage per active period, rather than
per pod, keeps the average honest whatever the churn. A container with no
periods at all has evidence ``none``, and no recommendation is made from it.


The data is :mod:`.containers`'; the folding, :mod:`.gathering`; the pod's own quota's
share of the throttling, :mod:`.pods`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from unthrottle.evidence.containers import ContainerEvidence, Points, WorkloadKey
from unthrottle.evidence.gathering import COUNTER_FIELDS, gather
from unthrottle.metrics.promql import (
    ACTIVE_COUNTER,
    BACKLOG_COUNTER,
    BY_BACKLOG,
    BY_CONTAINER,
    PERIOD_GAUGE,
    RECORDED,
    WITH_PODS,
    duration,
    evidence_counter_queries,
    namespaces_matcher,
    recorded_query,
    selector,
)
from unthrottle.metrics.source import MetricsError, MetricsSource
from unthrottle.model.owners import DEPLOYMENT, KINDS, Owners, ref

_log = logging.getLogger(__name__)


QUERIES_WITH_OWNERS = 11
"""Queries :func:`fetch` sends when it must ask kube-state-metrics for owners (9 otherwise)."""


CONCURRENCY = 3
"""Queries in flight at once: Prometheus evaluates them in parallel while this process
decodes the last answer. Prometheus's own default limit is 20 (``--query.max-concurrency``)."""


EVIDENCE_QUERIES = (*COUNTER_FIELDS, "histogram", "backlog")
"""The queries that read increases (the rest read owners and today's settings)."""


def metric_of(promql: str) -> str:
    """The first metric a query names (for a progress display)."""
    match = re.search(r"[a-z_:]+(?=\{)", promql)
    return match.group(0) if match else promql[:40]


def queries(
    namespaces: list[str],
    window_s: int,
    *,
    with_owners: bool,
    recorded: bool = False,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> dict[str, str]:
    """Every query :func:`fetch` sends, by name, in the order its answers are used.

    ``recorded``: counters and histogram from unthrottle's recording rules
    (:func:`~unthrottle.metrics.promql.recording_rules`) instead of raw samples.
    """
    window = duration(window_s)
    if recorded:
        evidence = {name: recorded_query(name, namespaces, window_s) for name in EVIDENCE_QUERIES}
    else:
        evidence = increase_queries(namespaces, window)
    return batch_queries(namespaces, evidence, owners_window=window if with_owners else None,
                         kinds=kinds)  # fmt: skip


def increase_queries(namespaces: list[str], window: str) -> dict[str, str]:
    """The four counters' and the histogram's increase over ``window``, a PromQL range
    (``86400s``, ``3600000ms``), per container (and ``le``)."""
    ns = namespaces_matcher(namespaces)
    out = evidence_counter_queries(namespaces, window)
    bucket = selector("unthrottle_cpu_demand_cores_bucket", ns)
    out["histogram"] = f"sum by ({BY_CONTAINER}, le) (increase({bucket}[{window}]))"
    backlog, active = selector(BACKLOG_COUNTER, ns), selector(ACTIVE_COUNTER, ns)
    # one query: the active windows have no level label, so `or` keeps both
    out["backlog"] = (f"sum by ({BY_BACKLOG}) (increase({backlog}[{window}])) "
                      f"or sum by ({BY_CONTAINER}) (increase({active}[{window}]))")  # fmt: skip
    return out


POD_OWNER_KIND = {DEPLOYMENT: "ReplicaSet", "StatefulSet": "StatefulSet",
                  "DaemonSet": "DaemonSet"}  # fmt: skip
"""The ``owner_kind`` of ``kube_pod_owner`` for a workload's pods, by the workload's kind."""


def batch_queries(
    namespaces: list[str],
    evidence: dict[str, str],
    *,
    owners_window: str | None,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> dict[str, str]:
    """Owners over ``owners_window`` (None: they are known), the ``evidence`` queries, then
    today's limits and requests: every query of a batch, in the order answers are used.
    ``kinds``: the kinds of workload whose pods' owners are read (one query whatever they
    are)."""
    ns = namespaces_matcher(namespaces)
    out = {}
    if owners_window is not None:  # every owner seen in the window: pods that are gone count too
        rs = selector("kube_replicaset_owner", ns, 'owner_kind="Deployment"')
        owner_kinds = [POD_OWNER_KIND[k] for k in KINDS if k in kinds]
        match = (f'owner_kind="{owner_kinds[0]}"' if len(owner_kinds) == 1
                 else f'owner_kind=~"{"|".join(owner_kinds)}"')  # fmt: skip
        pods = selector("kube_pod_owner", ns, match)
        out["replicaset_owners"] = f"last_over_time({rs}[{owners_window}])"
        out["pod_owners"] = f"last_over_time({pods}[{owners_window}])"
    out.update(evidence)
    # the agent's period gauge rides along with the limits (told apart by metric name):
    # the two never share a label set, since kube-state-metrics' has a resource label
    limits = selector("kube_pod_container_resource_limits", ns, 'resource="cpu"')
    # … with the pods' own cgroups: a pod-level limit's row is sized at its pod's period
    out["limits"] = f"{limits} or {selector(PERIOD_GAUGE, ns, *WITH_PODS)}"
    out["requests"] = selector("kube_pod_container_resource_requests", ns, 'resource="cpu"')
    return out


def recorded_covers(
    source: MetricsSource, namespaces: list[str], window_s: int, at: float | None = None
) -> bool:
    """Do unthrottle's recorded series reach back to the window's start (one small query)?

    Rules installed yesterday cannot answer for a week: then the raw series must.
    """
    total = window_s
    ns = namespaces_matcher(namespaces)
    recorded = selector(RECORDED["periods"], ns)
    if total <= 900:
        probe = f"count(count_over_time({recorded}[{duration(window_s)}]))"
    else:  # the first 15 minutes of the window: three evaluations at the 5 m interval
        probe = f"count(count_over_time({recorded}[15m] offset {total - 900}s))"
    return bool(source.instant(probe, at))


def split_namespaces(namespaces: list[str], owners: Owners | None) -> list[str]:
    """The parts a query refused as too big is split into: the namespaces asked for, else
    those in which pods or ReplicaSets are known (none before owners are)."""
    if namespaces:
        return sorted(set(namespaces))
    if owners is None:
        return []
    return sorted(owners.namespaces())


class Labelled(Protocol):
    """A series of an instant or a range query: what owners are read from."""

    @property
    def labels(self) -> dict[str, str]: ...


def owners_of(
    replicasets: Iterable[Labelled],
    pods: Iterable[Labelled],
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> Owners:
    """Pods and ReplicaSets → their workload, from kube-state-metrics: a pod through its
    ReplicaSet to its Deployment, or straight to its StatefulSet or DaemonSet; only
    workloads of ``kinds``."""
    owners = Owners()
    if DEPLOYMENT in kinds:
        for s in replicasets:  # a series without the labels kube-state-metrics gives: skipped
            ns, rs, deploy = (s.labels.get(k) for k in ("namespace", "replicaset", "owner_name"))
            if ns and rs and deploy:
                owners.replicasets[(ns, rs)] = deploy
    direct = {POD_OWNER_KIND[k]: k for k in kinds if k != DEPLOYMENT}
    for s in pods:
        ns, pod, owner = (s.labels.get(k) for k in ("namespace", "pod", "owner_name"))
        if not (ns and pod and owner):
            continue
        kind = direct.get(s.labels.get("owner_kind", ""))
        if kind is not None:
            owners.direct[(ns, owner)] = kind
            owners.pods[(ns, pod)] = ref(kind, owner)
            continue
        deploy = owners.replicasets.get((ns, owner))
        if deploy is not None:
            owners.pods[(ns, pod)] = deploy
    return owners


def workload_labels(
    source: MetricsSource,
    namespaces: list[str],
    at: float | None = None,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, workload reference) → its ``kube_deployment_labels`` (or
    ``kube_statefulset_labels``, ``kube_daemonset_labels``) series labels, for the workloads
    of ``kinds``: one query.

    kube-state-metrics exports a workload's labels only when allowed
    (``--metric-labels-allowlist=deployments=[...],statefulsets=[...]``); an empty answer
    may mean that.
    """
    ns = namespaces_matcher(namespaces)
    wanted = [k for k in KINDS if k in kinds]
    promql = " or ".join(selector(f"kube_{k.lower()}_labels", ns) for k in wanted)
    out = {}
    for s in source.instant(promql, at):
        for kind in wanted:  # told apart by the label that names the workload
            name = s.labels.get(kind.lower())
            if name:
                out[(s.labels.get("namespace", ""), ref(kind, name))] = s.labels
                break
    return out


def fetch(
    source: MetricsSource,
    namespaces: list[str],
    window_s: int,
    *,
    at: float | None = None,
    owners: Owners | None = None,
    on_query: Callable[[str], None] | None = None,
    concurrency: int = CONCURRENCY,
    recorded: bool = False,
    kinds: tuple[str, ...] = (DEPLOYMENT,),
) -> dict[WorkloadKey, ContainerEvidence]:
    """Every container of the workloads of ``kinds`` in these namespaces (all when empty),
    with its evidence.

    ``owners`` comes from the Kubernetes API when there is cluster access; without it,
    kube-state-metrics is asked (two more queries). Pods gone before the end of the
    window are counted: :class:`Owners` knows them by name.
    Up to ``concurrency`` queries are in flight; answers are used in a fixed order, and
    ``on_query`` hears each query's metric as its answer is used. ``recorded`` reads the
    counters and histogram from unthrottle's recording rules (see :func:`recorded_covers`).

    A query Prometheus refuses as too big (samples, time) is sent again once per
    namespace: the namespaces asked for, else those of the owners known by then. If it
    cannot be split, or a part is refused too, the error is raised here, and queries
    not yet sent are not sent.
    """
    with_owners = owners is None

    def build(names: list[str]) -> dict[str, str]:
        return queries(names, window_s, with_owners=with_owners, recorded=recorded,
                       kinds=kinds)  # fmt: skip

    def parts() -> list[str]:  # the owners known by the time a query is refused
        return split_namespaces(namespaces, owners)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        answer = in_flight(pool, lambda _, promql: source.instant(promql, at), build(namespaces),
                           build, parts, on_query)  # fmt: skip
        if owners is None:
            owners = owners_of(answer("replicaset_owners"), answer("pod_owners"), kinds)

        def points(name: str) -> Iterator[Points]:
            return ((s.labels, _FIRST_STEP, (s.value,)) for s in answer(name))

        return gather(owners, points)[0]


R = TypeVar("R")


def in_flight(
    pool: ThreadPoolExecutor,
    send: Callable[[str, str], list[R]],
    sent: dict[str, str],
    build: Callable[[list[str]], dict[str, str]],
    parts: Callable[[], list[str]],
    on_query: Callable[[str], None] | None,
) -> Callable[[str], list[R]]:
    """Send every query of ``sent`` (name → PromQL) on the pool at once, as
    ``send(name, promql)``; the function returned waits for one query's answer, by name.

    A query Prometheus refuses as too big is sent again once per namespace of ``parts()``
    (``build([namespace])[name]``), one after another, and the answers are joined. If
    there are fewer than two parts, or a part is refused too, the error is raised, and the
    queries not yet sent are cancelled. ``on_query`` hears each query's metric as its
    answer is used.
    """
    pending = {name: pool.submit(send, name, promql) for name, promql in sent.items()}

    def split(name: str, error: MetricsError) -> list[R]:
        namespaces = parts()
        if len(namespaces) < 2:
            raise error
        _log.warning(
            "%s; sending it once per namespace instead (%d queries)", error, len(namespaces)
        )
        out: list[R] = []
        for ns in namespaces:
            out += send(name, build([ns])[name])
        return out

    def answer(name: str) -> list[R]:
        try:
            try:
                result = pending[name].result()
            except MetricsError as error:
                if not error.too_big:
                    raise
                result = split(name, error)
        except BaseException:
            for future in pending.values():
                future.cancel()
            raise
        if on_query is not None:
            on_query(metric_of(sent[name]))
        return result

    return answer


_FIRST_STEP = (0,)
