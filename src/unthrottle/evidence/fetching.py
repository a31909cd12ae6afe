"""Evidence per Deployment container, from Prometheus, in a fixed number of queries.

For a selection of namespaces, eleven queries in all, whatever the number of
pods (nine when the caller has the owners from the Kubernetes API and leaves out
the first two; ``recommend`` adds one for the recording rules' coverage):
- pod → ReplicaSet and ReplicaSet → Deployment (kube-state-metrics'
  ``kube_pod_owner``, ``kube_replicaset_owner``);
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

Results are grouped in Python by (namespace, deployment, container). Summing
increases over a Deployment's pods handles pod churn: a pod that lived an hour
of the window adds an hour of periods. Usage per active period, rather than
per pod, keeps the average honest whatever the churn. A container with no
periods at all has evidence ``none``, and no recommendation is made from it.

**The pod's own quota.** A kubelet gives a pod whose containers all have limits a quota of
its own, the sum of theirs; when it runs out first the containers stall and their own
counters do not show it (docs/recommend.md, "The pod's own quota"). A window in which the
pod was throttled is one in which each of its running containers wanted more than it got,
so each container gets a share of its pod's throttling, pod by pod
(:func:`share_pod_throttling`): of the throttled time, in proportion to its usage over the
span (the kernel sums a group's throttled time over the CPUs it was stalled on, and a
container that ran on more of them was stalled on more); of the throttled periods, the
pod's throttled periods in proportion to the share of the pod's periods in which the
container was active (a throttled period of the pod stalls every container that was
running in it, whole).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol, TypeVar

from unthrottle.cfs.backlog import Backlog
from unthrottle.metrics.promql import (
    ACTIVE_COUNTER,
    BACKLOG_COUNTER,
    BURST_SOURCE,
    BY_BACKLOG,
    BY_CONTAINER,
    CONTAINERS,
    PERIOD_GAUGE,
    PRESSURE_SOURCE,
    RECORDED,
    duration,
    evidence_counter_queries,
    namespaces_matcher,
    recorded_query,
    selector,
)
from unthrottle.metrics.source import MetricsError, MetricsSource
from unthrottle.model.owners import Owners
from unthrottle.recommend.histogram import evidence_from_histogram, highest, quantile
from unthrottle.recommend.types import CounterEvidence, PeriodEvidence, Waits
from unthrottle.units import DEFAULT_PERIOD_US, MAX_PERIOD_US, MIN_PERIOD_US

_log = logging.getLogger(__name__)


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
    wait_s: float | None = None
    """Time its threads waited for a CPU (the agent's counter); None without the agent."""
    pod_throttled_periods: float = 0.0
    """Its share of its pods' own throttled periods (the pod cgroup's quota), beyond its
    own counters: see the module's docstring."""
    pod_throttled_s: float = 0.0
    """Its share of its pods' own throttled time, seconds, beyond its own counters."""
    pressure_s: float | None = None
    """The kubelet's PSI: wall time in which at least one of its threads waited for a CPU
    (``container_pressure_cpu_waiting_seconds_total``, cgroup v2); None where not exported."""
    burst_periods: float | None = None
    """Periods in which it ran above its quota on its burst (cAdvisor's
    ``container_cpu_cfs_burst_periods_total`` or the agent's ``unthrottle_cpu_cfs_bursts_total``):
    0 for a burst never used; None where neither is exported."""
    burst_s: float | None = None
    """CPU time it used above its quota on its burst, seconds (``…_burst_seconds_total``)."""
    buckets: dict[float, float] = field(default_factory=dict)
    """Agent histogram: upper bound (cores) → cumulative windows, summed over pods."""
    backlog: dict[tuple[int, float], float] = field(default_factory=dict)
    """Agent backlog series: (level in millicores, threshold in quotas of the level) →
    windows above it, summed over pods (:mod:`unthrottle.cfs.backlog`); empty from an
    agent without them."""
    active_windows: float | None = None
    """Windows with demand (the backlog's denominator); None without the backlog series."""
    limit_millicores: int | None = None
    request_millicores: int = 0
    gomaxprocs_env: int | None = None
    """An explicit GOMAXPROCS in the container's environment (cluster mode only)."""
    burst_us: int = 0
    """The burst its pod template asks for (cluster mode only)."""
    agent_periods_us: set[int] = field(default_factory=set)
    """The CFS periods (µs) the node agent reports for its pods now
    (``unthrottle_cpu_cfs_period_seconds``): one, or several when its pods run on nodes
    whose kubelets' ``--cpu-cfs-quota-period`` differ; empty without the agent."""

    @property
    def kind(self) -> str:
        """``period`` (agent histogram), ``counters`` (cAdvisor only) or ``none``."""
        if self.buckets and max(self.buckets.values(), default=0) >= 1:
            return "period"
        return "counters" if self.periods >= 1 else "none"

    @property
    def all_throttled_periods(self) -> float:
        """Its own throttled periods and its share of its pods', at most its periods.

        Their sum: where both quotas ran out in the same period it counts that period
        twice, the cap keeping the ratio at most 1 (a container under a pod quota equal to
        its own was throttled by both in the same periods: ``bench/pod_quota.py``)."""
        return min(self.periods, self.throttled_periods + self.pod_throttled_periods)

    @property
    def all_throttled_s(self) -> float:
        """Its own throttled time and its share of its pods', seconds."""
        return self.throttled_s + self.pod_throttled_s

    def throttle_ratio(self) -> float | None:
        """Throttled periods over periods, its pods' share counted (None without periods)."""
        return self.all_throttled_periods / self.periods if self.periods >= 1 else None

    def counters(self, window_s: float, period_us: int = DEFAULT_PERIOD_US) -> CounterEvidence:
        """Counter-level evidence; usage is per active period, so pod churn does not dilute it."""
        period_s = period_us / 1e6
        usage_cores = self.usage_s / (self.periods * period_s) if self.periods >= 1 else 0.0
        return CounterEvidence(
            window_s=window_s,
            usage_cores=usage_cores,
            nr_periods=round(self.periods),
            nr_throttled=round(self.all_throttled_periods),
            throttled_s=self.all_throttled_s,
            waits=self.waits(),
            pod_throttled_s=self.pod_throttled_s,
            burst_periods=self.burst_periods,
        )

    def waits(self) -> Waits | None:
        """Where its threads waited for a CPU: the agent's counter, else the kubelet's PSI (a
        lower bound), else None. The wait holds the throttled waits, the pod's included
        (``bench/pod_wait.py``): the rest was behind other processes."""
        throttled = self.all_throttled_s
        if self.wait_s is not None:
            return Waits(throttled, max(0.0, self.wait_s - throttled))
        if self.pressure_s is not None:
            # wall time ≤ the threads' wait, and the throttled wall time ≤ the throttled
            # time, so what PSI holds beyond the throttled time is at most the contention
            return Waits(throttled, max(0.0, self.pressure_s - throttled), from_pressure=True)
        return None

    def demand_millicores(self) -> dict[str, int] | None:
        """Per-window demand from the agent's histogram: median, p99 and the largest window
        (to the bucket it fell in); None without the histogram."""
        if self.kind != "period":
            return None
        bounds, counts = self._histogram()
        p50, p99 = quantile(bounds, counts, 0.5), quantile(bounds, counts, 0.99)
        return {
            "p50_millicores": round((p50 or 0.0) * 1000),
            "p99_millicores": round((p99 or 0.0) * 1000),
            "max_millicores": round(highest(bounds, counts) * 1000),
        }

    def period_evidence(self, period_us: int = DEFAULT_PERIOD_US) -> PeriodEvidence:
        """Period-level evidence rebuilt from the agent's histogram, with the order the
        backlog series keep where the agent exports them. Like the histogram's windows, the
        backlog's are read as CFS periods (a level's quota is level × period). The usage
        counter per active period rides along (``usage_cores``): what it certainly used,
        whatever the windows read, below which a refinement never goes."""
        evidence = evidence_from_histogram(*self._histogram(), period_us=period_us)
        backlog = None
        if self.backlog and self.active_windows is not None:
            backlog = Backlog(period_us, self.active_windows, dict(self.backlog))
        usage = self.counters(0.0, period_us).usage_cores if self.periods >= 1 else None
        return replace(evidence, observed_throttle_ratio=self.throttle_ratio(), waits=self.waits(),
                       pod_throttled_s=self.pod_throttled_s, backlog=backlog,
                       usage_cores=usage)  # fmt: skip

    def _histogram(self) -> tuple[list[float], list[float]]:
        """Bucket bounds in order, and their cumulative counts."""
        bounds = sorted(self.buckets)
        return bounds, [self.buckets[b] for b in bounds]


class Slot(NamedTuple):
    """Evidence over one span of time: increases over (start, end], settings at ``end``."""

    start: float
    """Unix time, seconds (millisecond precision)."""
    end: float
    evidence: dict[WorkloadKey, ContainerEvidence]


QUERIES_WITH_OWNERS = 11
"""Queries :func:`fetch` sends when it must ask kube-state-metrics for owners (9 otherwise)."""
CONCURRENCY = 3
"""Queries in flight at once: Prometheus evaluates them in parallel while this process
decodes the last answer. Prometheus's own default limit is 20 (``--query.max-concurrency``)."""


_COUNTER_FIELDS = {  # query name → ContainerEvidence field
    "usage_seconds": "usage_s",
    "periods": "periods",
    "throttled_periods": "throttled_periods",
    "throttled_seconds": "throttled_s",
    "wait_seconds": "wait_s",
}


EVIDENCE_QUERIES = (*_COUNTER_FIELDS, "histogram", "backlog")
"""The queries that read increases (the rest read owners and today's settings)."""


def metric_of(promql: str) -> str:
    """The first metric a query names (for a progress display)."""
    match = re.search(r"[a-z_:]+(?=\{)", promql)
    return match.group(0) if match else promql[:40]


def queries(
    namespaces: list[str], window_s: int, *, with_owners: bool, recorded: bool = False
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
    return batch_queries(namespaces, evidence, owners_window=window if with_owners else None)


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


def batch_queries(
    namespaces: list[str], evidence: dict[str, str], *, owners_window: str | None
) -> dict[str, str]:
    """Owners over ``owners_window`` (None: they are known), the ``evidence`` queries, then
    today's limits and requests: every query of a batch, in the order answers are used."""
    ns = namespaces_matcher(namespaces)
    out = {}
    if owners_window is not None:  # every owner seen in the window: pods that are gone count too
        rs = selector("kube_replicaset_owner", ns, 'owner_kind="Deployment"')
        pods = selector("kube_pod_owner", ns, 'owner_kind="ReplicaSet"')
        out["replicaset_owners"] = f"last_over_time({rs}[{owners_window}])"
        out["pod_owners"] = f"last_over_time({pods}[{owners_window}])"
    out.update(evidence)
    # the agent's period gauge rides along with the limits (told apart by metric name):
    # the two never share a label set, since kube-state-metrics' has a resource label
    limits = selector("kube_pod_container_resource_limits", ns, 'resource="cpu"')
    out["limits"] = f"{limits} or {selector(PERIOD_GAUGE, ns, *CONTAINERS)}"
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
    return sorted({ns for ns, _ in owners.pods} | {ns for ns, _ in owners.replicasets})


class Labelled(Protocol):
    """A series of an instant or a range query: what owners are read from."""

    @property
    def labels(self) -> dict[str, str]: ...


def owners_of(replicasets: Iterable[Labelled], pods: Iterable[Labelled]) -> Owners:
    """Pods and ReplicaSets → Deployment, from kube-state-metrics."""
    owners = Owners()
    for s in replicasets:  # a series without the labels kube-state-metrics gives is skipped
        ns, rs, deploy = (s.labels.get(k) for k in ("namespace", "replicaset", "owner_name"))
        if ns and rs and deploy:
            owners.replicasets[(ns, rs)] = deploy
    for s in pods:
        ns, pod, rs = (s.labels.get(k) for k in ("namespace", "pod", "owner_name"))
        deploy = owners.replicasets.get((ns or "", rs or ""))
        if pod and deploy is not None:
            owners.pods[(ns or "", pod)] = deploy
    return owners


def deployment_labels(
    source: MetricsSource, namespaces: list[str], at: float | None = None
) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, Deployment) → its ``kube_deployment_labels`` series labels (one query).

    kube-state-metrics exports a Deployment's labels only when allowed
    (``--metric-labels-allowlist=deployments=[...]``); an empty answer may mean that.
    """
    ns = namespaces_matcher(namespaces)
    return {
        (s.labels.get("namespace", ""), s.labels.get("deployment", "")): s.labels
        for s in source.instant(selector("kube_deployment_labels", ns), at)
    }


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
) -> dict[WorkloadKey, ContainerEvidence]:
    """Every Deployment container of these namespaces (all when empty), with its evidence.

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
        return queries(names, window_s, with_owners=with_owners, recorded=recorded)

    def parts() -> list[str]:  # the owners known by the time a query is refused
        return split_namespaces(namespaces, owners)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        answer = in_flight(pool, lambda _, promql: source.instant(promql, at), build(namespaces),
                           build, parts, on_query)  # fmt: skip
        if owners is None:
            owners = owners_of(answer("replicaset_owners"), answer("pod_owners"))

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


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound (``+Inf`` included); None when the label is not a number."""
    try:
        return float(le) if le is not None else None
    except ValueError:
        return None


def _backlog_key(labels: dict[str, str]) -> tuple[int, float] | None:
    """(level in millicores, threshold) of a backlog series; None for another series."""
    try:
        level, over = float(labels["level"]), float(labels["over"])
    except (KeyError, ValueError):
        return None
    if not (math.isfinite(level) and math.isfinite(over)) or level <= 0:
        return None
    return round(level * 1000), over


def _period_us(seconds: float) -> int | None:
    """The agent's period gauge in whole µs; None for a value no kernel would have."""
    if not math.isfinite(seconds):
        return None
    period = round(seconds * 1e6)
    return period if MIN_PERIOD_US <= period <= MAX_PERIOD_US else None


Points = tuple[dict[str, str], Sequence[int], Sequence[float]]
"""A series' labels, the steps (0, 1, …) of the evaluation at which it has a value, and
those values: one step for an instant query, ``steps`` for a range query."""
_FIRST_STEP = (0,)


class _PodLevel:
    """The pods' own counters (``container=""``) and their containers' usage and periods,
    per step of the evaluation, until :meth:`share` gives each container its share."""

    def __init__(self) -> None:
        # (step, namespace, pod) → counter name → the pod cgroup's increase
        self.pods: dict[tuple[int, str, str], dict[str, float]] = {}
        # (step, namespace, pod) → container → [evidence, usage, periods]
        self.members: dict[tuple[int, str, str], dict[str, list[Any]]] = {}

    def add(self, owners: Owners, labels: dict[str, str], name: str, at: Sequence[int],
            values: Sequence[float]) -> None:  # fmt: skip
        """A pod cgroup's series (of a Deployment's pod; others are not evidence)."""
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if name not in _POD_COUNTERS or owners.deployment_of(ns, pod) is None:
            return
        for k, value in zip(at, values, strict=False):
            if math.isfinite(value):
                counters = self.pods.setdefault((k, ns, pod), {})
                counters[name] = counters.get(name, 0.0) + value

    def note(self, labels: dict[str, str], name: str, at: Sequence[int],
             items: list[ContainerEvidence] | None, values: Sequence[float]) -> None:  # fmt: skip
        """A container's usage or periods in one pod, which its share is measured by."""
        if items is None or name not in ("usage_seconds", "periods"):
            return
        ident = (labels.get("namespace", ""), labels.get("pod", ""))
        column = 1 if name == "usage_seconds" else 2
        for k, item, value in zip(at, items, values, strict=False):
            member = self.members.setdefault((k, *ident), {}).setdefault(
                labels.get("container", ""), [item, 0.0, 0.0]
            )
            member[column] += value if math.isfinite(value) else 0.0

    def share(self) -> None:
        """Give every container its share of its pod's throttling at each step."""
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


_POD_COUNTERS = ("periods", "throttled_periods", "throttled_seconds")


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
    sum of its new limits) throttled it read only its own counters.
    """
    pod_periods, pod_throttled = periods.get("", 0.0), throttled.get("", 0.0)
    members = {c: (usage_s.get(c, 0.0), n) for c, n in periods.items() if c and n > 0}
    shares = (share_pod_throttling(pod_periods, pod_throttled, 0.0, members)
              if members and pod_periods > 0 else {})  # fmt: skip
    return {
        c: (min(1.0, (throttled.get(c, 0.0) + shares.get(c, (0.0, 0.0))[0]) / n), n)
        for c, (_, n) in members.items()
    }


def gather(
    owners: Owners, answer: Callable[[str], Iterable[Points]], steps: int = 1
) -> list[dict[WorkloadKey, ContainerEvidence]]:
    """Group the answers by Deployment container, at each step of the evaluation."""
    found: list[dict[WorkloadKey, ContainerEvidence]] = [{} for _ in range(steps)]
    # (namespace, pod, container) → its Deployment container and pod, or None when it is
    # not one: the same container comes back in every query (28 times in the histogram's)
    seen: dict[tuple[str, str, str], tuple[WorkloadKey, str] | None] = {}
    # … and its evidence at every step, for the series that have a value at every step
    everywhere: dict[tuple[str, str, str], list[ContainerEvidence] | None] = {}

    def owner(ident: tuple[str, str, str]) -> tuple[WorkloadKey, str] | None:
        if ident in seen:
            return seen[ident]
        deploy = owners.deployment_of(ident[0], ident[1])
        item = None
        if deploy is not None and ident[2] and ident[2] != "POD":
            item = (WorkloadKey(ident[0], deploy, ident[2]), ident[1])
        seen[ident] = item
        return item

    def evidence(labels: dict[str, str], at: Sequence[int]) -> list[ContainerEvidence] | None:
        """The series' container's evidence at each of the steps ``at`` (None: not one)."""
        ident = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
        full = len(at) == steps
        if full and ident in everywhere:
            return everywhere[ident]
        found_owner = owner(ident)
        items = None
        if found_owner is not None:
            key, pod = found_owner
            items = []
            for k in at:
                item = found[k].get(key)
                if item is None:
                    item = found[k][key] = ContainerEvidence(key)
                item.pods.add(pod)
                items.append(item)
        if full:
            everywhere[ident] = items
        return items

    pods = _PodLevel()
    for name, attr in _COUNTER_FIELDS.items():
        for labels, at, values in answer(name):
            into, source = attr, labels.get(PRESSURE_SOURCE[0])
            if source == PRESSURE_SOURCE[1]:
                into = "pressure_s"  # the PSI series, riding along in the wait's answer
            elif source == BURST_SOURCE[1]:  # … and the burst counters in two others
                into = "burst_periods" if name == "periods" else "burst_s"
            elif labels.get("container", "") == "":
                pods.add(owners, labels, name, at, values)
                continue
            items = evidence(labels, at)
            pods.note(labels, name, at, items, values)
            for item, value in zip(items or (), values, strict=False):
                if math.isfinite(value):
                    setattr(item, into, (getattr(item, into) or 0.0) + value)
    pods.share()

    bounds: dict[str | None, float | None] = {}
    for labels, at, values in answer("histogram"):
        items = evidence(labels, at)
        le = labels.get("le")
        bound = bounds[le] if le in bounds else bounds.setdefault(le, _bound(le))
        if bound is None:
            continue
        for item, value in zip(items or (), values, strict=False):
            if math.isfinite(value):
                item.buckets[bound] = item.buckets.get(bound, 0.0) + value

    for labels, at, values in answer("backlog"):
        items = evidence(labels, at)
        key = _backlog_key(labels)
        for item, value in zip(items or (), values, strict=False):
            if not math.isfinite(value):
                continue
            if key is not None:
                item.backlog[key] = item.backlog.get(key, 0.0) + value
            elif "level" not in labels:
                item.active_windows = (item.active_windows or 0.0) + value

    for name, attr in (("limits", "limit_millicores"), ("requests", "request_millicores")):
        for labels, at, values in answer(name):
            items = evidence(labels, at)
            if labels.get("__name__") == PERIOD_GAUGE:
                for item, value in zip(items or (), values, strict=False):
                    period = _period_us(value)
                    if period is not None:
                        item.agent_periods_us.add(period)
                continue
            for item, value in zip(items or (), values, strict=False):
                if math.isfinite(value):
                    # the largest across pods: a rollout in progress may mix old and new values
                    millicores = math.ceil(value * 1000)
                    setattr(item, attr, max(getattr(item, attr) or 0, millicores))
    return found
