"""Workloads (Deployments, StatefulSets, DaemonSets), their containers' CPU settings and
runtimes, and which pods they own.

Read through :class:`WorkloadStore`, a narrow interface; :class:`KubeWorkloadStore`
serves it from the API (raw JSON: only the fields needed are read, so objects
with fields this version does not know are fine).

The runtime is read from the container's environment, never guessed from an
image name: ``GOMAXPROCS``, ``GOGC`` or ``GOMEMLIMIT`` mean Go;
``JAVA_TOOL_OPTIONS``, ``JAVA_OPTS`` or ``JDK_JAVA_OPTIONS`` mean a JVM;
anything else is unknown, and no processor count is recommended.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from unthrottle.kube.informer import by_name
from unthrottle.model.burst import BurstAnnotationError, BurstSpec, burst_specs, spec_for
from unthrottle.model.owners import DAEMONSET, DEPLOYMENT, STATEFULSET, Owners, ref
from unthrottle.model.podlevel import POD_ROW
from unthrottle.model.runtime import Runtime
from unthrottle.units import parse_cpu, quota_of

_log = logging.getLogger(__name__)

_GO_ENV = {"GOMAXPROCS", "GOGC", "GOMEMLIMIT"}
_JVM_ENV = {"JAVA_TOOL_OPTIONS", "JAVA_OPTS", "JDK_JAVA_OPTIONS"}


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container of a Deployment's pod template."""

    name: str
    limit_millicores: int | None
    request_millicores: int
    runtime: Runtime = Runtime.UNKNOWN
    gomaxprocs_env: int | None = None
    burst: BurstSpec | None = None
    """What the pod template's annotation asks for, before it is resolved against the
    container's quota, which depends on its node's CFS period (:meth:`burst_at`);
    None: no annotation, or a malformed one."""

    def burst_at(self, period_us: int) -> int:
        """The burst the annotation gives at this CFS period, µs: a share of the quota is a
        share of ``limit × period``, and a burst above that quota is clamped to it, as the
        agent writes it on the node."""
        if self.burst is None or self.limit_millicores is None:
            return 0
        return self.burst.resolve(quota_of(self.limit_millicores, period_us))[0]


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """A workload (a Deployment unless :attr:`kind` says otherwise) and its template's
    containers."""

    namespace: str
    name: str
    containers: dict[str, ContainerSpec] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    """The Deployment's own annotations (``unthrottle.io/ignore`` opts it out)."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The object as the API served it (Apply mode reads its record, status and template)."""
    kind: str = DEPLOYMENT

    @property
    def ref(self) -> str:
        """Its reference (:func:`~unthrottle.model.owners.ref`): the name of a Deployment."""
        return ref(self.kind, self.name)


class WorkloadStore(Protocol):
    """What the recommender needs of the cluster."""

    def deployments(
        self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,)
    ) -> list[DeploymentInfo]:
        """Workloads of ``kinds`` in these namespaces (all when empty)."""
        ...

    def pod_owners(self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,),
                   listed: Iterable[DeploymentInfo] | None = None) -> Owners:  # fmt: skip
        """Pods → the workload of ``kinds`` that owns them (a Deployment's through their
        ReplicaSet), and the ReplicaSets, StatefulSets and DaemonSets known; ``listed``:
        the workloads :meth:`deployments` just gave for the same namespaces and kinds,
        which are then not listed again."""
        ...


def container_spec(raw: dict[str, Any]) -> ContainerSpec:
    """A container of a pod template, from the API's JSON."""
    resources = raw.get("resources") or {}
    limit = (resources.get("limits") or {}).get("cpu")
    request = (resources.get("requests") or {}).get("cpu")
    env = {e.get("name"): e.get("value") for e in raw.get("env") or [] if e.get("name")}
    runtime = Runtime.UNKNOWN
    if _GO_ENV & set(env):
        runtime = Runtime.GO
    elif _JVM_ENV & set(env):
        runtime = Runtime.JVM
    gomaxprocs = env.get("GOMAXPROCS")
    return ContainerSpec(
        name=raw.get("name", ""),
        limit_millicores=parse_cpu(limit) if limit is not None else None,
        request_millicores=parse_cpu(request) if request is not None else 0,
        runtime=runtime,
        gomaxprocs_env=int(gomaxprocs) if gomaxprocs and gomaxprocs.isdigit() else None,
    )


def pod_row(template: dict[str, Any]) -> ContainerSpec | None:
    """The pod-level limit of a pod template's spec (``spec.resources``), as a row
    (:mod:`unthrottle.model.podlevel`); None when it sets no CPU limit for the pod."""
    resources = template.get("resources") or {}
    limit = (resources.get("limits") or {}).get("cpu")
    if limit is None:
        return None
    request = (resources.get("requests") or {}).get("cpu")
    return ContainerSpec(
        name=POD_ROW,
        limit_millicores=parse_cpu(limit),
        request_millicores=parse_cpu(request) if request is not None else 0,
    )


def template_rows(template: dict[str, Any], annotations: dict[str, str],
                  meta: dict[str, Any]) -> list[ContainerSpec]:  # fmt: skip
    """The rows a pod template gives: its containers, or, under a pod-level limit, its
    containers with a limit of their own and the pod's row (the others are throttled by
    the pod's quota alone, which the pod's row sizes)."""
    specs = [_with_burst(container_spec(c), annotations, meta)
             for c in template.get("containers") or []]  # fmt: skip
    pod = pod_row(template)
    if pod is None:
        return specs
    return [*(c for c in specs if c.limit_millicores is not None), pod]


def _with_burst(
    spec: ContainerSpec, annotations: dict[str, str], meta: dict[str, Any]
) -> ContainerSpec:
    """The container with the burst its pod template's annotation asks for (as the agent
    will write it: clamped to the quota). A malformed annotation counts as none, said once
    in the log; the agent refuses it the same way."""
    try:
        wanted = spec_for(burst_specs(annotations), spec.name)
    except BurstAnnotationError as error:
        _log.warning("Deployment %s/%s: %s", meta.get("namespace"), meta.get("name"), error)
        return spec
    return spec if wanted is None else replace(spec, burst=wanted)


def workload_info(item: dict[str, Any], kind: str) -> DeploymentInfo:
    """A workload of ``kind`` from the API's JSON (``raw``: the object itself, its ``kind``
    set, which a list's items have not: Apply reads it)."""
    item.setdefault("kind", kind)
    meta = item.get("metadata", {})
    pod_template = (item.get("spec") or {}).get("template") or {}
    template = pod_template.get("spec") or {}
    annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
    specs = template_rows(template, annotations, meta)
    return DeploymentInfo(meta.get("namespace", ""), meta.get("name", ""),
                          {c.name: c for c in specs}, dict(meta.get("labels") or {}),
                          dict(meta.get("annotations") or {}), item, kind)  # fmt: skip


PodLink = tuple[tuple[str, str], tuple[tuple[str, str], ...]]
"""A pod's (namespace, name) and its controllers' (kind, name): what ownership needs of it."""


def pod_link(pod: dict[str, Any]) -> PodLink:
    """What :func:`link_pods` needs of a pod object (a few strings, whatever its size)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return by_name(pod), tuple((str(r.get("kind")), str(r.get("name"))) for r in refs
                               if r.get("controller", True))  # fmt: skip


def link_pods(owners: Owners, pods: Iterable[PodLink]) -> None:
    """Give each pod its workload in ``owners.pods``: a StatefulSet or DaemonSet of
    ``owners.direct`` that controls it, else the Deployment of its ReplicaSet."""
    for (ns, name), controllers in pods:
        found = None
        for kind in (STATEFULSET, DAEMONSET):
            for owner_kind, owner in controllers:
                if owner_kind == kind and owners.direct.get((ns, owner)) == kind:
                    found = ref(kind, owner)
        if found is None:
            replica_set = next((o for k, o in controllers if k == "ReplicaSet"), "")
            found = owners.replicasets.get((ns, replica_set))
        if found is not None:
            owners.pods[(ns, name)] = found


REPLICASETS, PODS = "replicasets", "pods"

LIST_CALLS: dict[str, tuple[str, str, str]] = {
    # resource (a workload's kind, or one of the two above) → (the kubernetes client's API,
    # its namespaced list method, its every-namespace one)
    DEPLOYMENT: ("apps", "list_namespaced_deployment", "list_deployment_for_all_namespaces"),
    STATEFULSET: ("apps", "list_namespaced_stateful_set", "list_stateful_set_for_all_namespaces"),
    DAEMONSET: ("apps", "list_namespaced_daemon_set", "list_daemon_set_for_all_namespaces"),
    REPLICASETS: ("apps", "list_namespaced_replica_set", "list_replica_set_for_all_namespaces"),
    PODS: ("core", "list_namespaced_pod", "list_pod_for_all_namespaces"),
}
"""The list calls of what a :class:`WorkloadStore` reads, listed or watched."""


def _owner(meta: dict[str, Any], kind: str) -> str | None:
    for owner in meta.get("ownerReferences") or []:
        if owner.get("kind") == kind and owner.get("controller", True):
            return str(owner.get("name"))
    return None


class KubeWorkloadStore:
    """A :class:`WorkloadStore` over ``kubernetes.client`` (CoreV1Api and AppsV1Api)."""

    def __init__(self, core: Any, apps: Any, *, timeout_s: float = 30.0) -> None:
        self.core = core
        self.apps = apps
        self.timeout_s = timeout_s
        """Every list call's timeout: a hung API server must not hang the caller."""

    @staticmethod
    def _items(reply: Any) -> list[dict[str, Any]]:
        return list(json.loads(reply.data).get("items", []))

    def _list(self, resource: str, namespaces: Iterable[str]) -> list[Any]:
        """Every object of ``resource`` (:data:`LIST_CALLS`) in these namespaces (all when
        empty): one LIST per namespace."""
        api_name, namespaced, everywhere = LIST_CALLS[resource]
        api = self.core if api_name == "core" else self.apps
        selected = list(namespaces)
        options = {"_preload_content": False, "_request_timeout": self.timeout_s}
        if not selected:
            return self._items(getattr(api, everywhere)(**options))
        out = []
        for ns in selected:
            out += self._items(getattr(api, namespaced)(ns, **options))
        return out

    def deployments(
        self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,)
    ) -> list[DeploymentInfo]:
        """Workloads of ``kinds`` with their template containers (one LIST per kind and
        namespace)."""
        selected = list(namespaces)
        return [workload_info(item, kind) for kind in kinds
                for item in self._list(kind, selected)]  # fmt: skip

    def pod_owners(self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,),
                   listed: Iterable[DeploymentInfo] | None = None) -> Owners:  # fmt: skip
        """Pods → their workload of ``kinds``: a Deployment's through their ReplicaSet, a
        StatefulSet's and a DaemonSet's directly. The StatefulSets and DaemonSets are
        known too, so that their pods gone by now are known by name: from ``listed`` (what
        :meth:`deployments` gave for the same namespaces and kinds), else listed here."""
        selected = list(namespaces)
        owners = Owners()
        if DEPLOYMENT in kinds:
            replica_sets = self._list(REPLICASETS, selected)
            for rs in replica_sets:
                deploy = _owner(rs.get("metadata", {}), DEPLOYMENT)
                if deploy is not None:
                    owners.replicasets[by_name(rs)] = deploy
        if listed is not None:
            owners.direct.update({(w.namespace, w.name): w.kind for w in listed
                                  if w.kind in (STATEFULSET, DAEMONSET)})  # fmt: skip
        else:
            for kind in (k for k in (STATEFULSET, DAEMONSET) if k in kinds):
                for item in self._list(kind, selected):
                    meta = item.get("metadata", {})
                    owners.direct[(meta.get("namespace", ""), meta.get("name", ""))] = kind
        pods = self._list(PODS, selected)
        link_pods(owners, (pod_link(pod) for pod in pods))
        return owners
