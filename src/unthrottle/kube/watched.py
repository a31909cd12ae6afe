"""The operator's :class:`~unthrottle.kube.workloads.WorkloadStore`, fed by watches.

A reconcile used to LIST every Deployment, ReplicaSet and pod of the policy's namespace and
decode them: measured on the real control plane at 1,000 Deployments, 1.58–1.84 s of CPU a
steady reconcile, and three LISTs of the namespace against the user's API server every
interval (docs/benchmarks.md §9). :class:`WatchedWorkloadStore` keeps them in memory instead,
one :class:`~unthrottle.kube.informer.Informer` per resource and namespace (one per resource
when the operator watches every namespace), started by the first reconcile that needs it: a
steady reconcile reads memory and sends no LIST; each object is decoded once per change.

What is kept, each object converted as it arrives:
- a workload (Deployment, StatefulSet, DaemonSet): its :class:`DeploymentInfo`, whose
  ``raw`` is the object without ``metadata.managedFields`` (Apply reads its record, status
  and template; nothing reads the field owners', which are a third to a half of a small
  object's JSON);
- a ReplicaSet: the name of the Deployment that controls it (nothing for the others);
- a pod: its name and its controllers' kinds and names (:data:`PodLink`).

A stale state must not pass for a fresh one: while an informer's watch fails (the API
server is down, the operator's role lost ``watch``), a reconcile that needs it fails as a
LIST would have (the policy's ``ApiUnavailable``), and so does one whose informer has not
had its first list within ``timeout_s``. A watch that the server ends, or that drops, is
resumed from its ``resourceVersion`` without a LIST.

A write of ours (Apply's patch) reaches the store through the watch, within milliseconds;
a read that is older than the object is harmless: every patch tests the
``resourceVersion`` it read (:mod:`unthrottle.kube.patching`), and a stale one is refused
and retried at the next reconcile.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

from unthrottle.kube.informer import Informer, by_name, one_attempt
from unthrottle.kube.workloads import (
    LIST_CALLS,
    PODS,
    REPLICASETS,
    DeploymentInfo,
    PodLink,
    _owner,
    link_pods,
    pod_link,
    workload_info,
)
from unthrottle.model.owners import DAEMONSET, DEPLOYMENT, STATEFULSET, Owners


def trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without ``metadata.managedFields`` (the server's record of who set which
    field, which nothing here reads)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _workload(kind: str) -> Callable[[dict[str, Any]], DeploymentInfo]:
    return lambda obj: workload_info(trimmed(obj), kind)


def _replica_set(obj: dict[str, Any]) -> str | None:
    return _owner(obj.get("metadata") or {}, DEPLOYMENT)


RESOURCES = tuple(LIST_CALLS)
"""What is watched, per namespace: at most one informer (and one open connection) each."""

_CONVERT: dict[str, Callable[[dict[str, Any]], Any]] = {
    DEPLOYMENT: _workload(DEPLOYMENT),
    STATEFULSET: _workload(STATEFULSET),
    DAEMONSET: _workload(DAEMONSET),
    REPLICASETS: _replica_set,
    PODS: pod_link,
}


class WatchStale(RuntimeError):
    """An informer a reconcile needs has no list yet, or its watch is failing."""


class WatchedWorkloadStore:
    """Workloads, ReplicaSets and pods of ``namespaces`` (every namespace when empty), kept
    by watches (module doc). :meth:`close` ends them."""

    def __init__(self, core: Any, apps: Any, *, namespaces: Iterable[str] = (),
                 timeout_s: float = 30.0, watch_s: int = 300) -> None:  # fmt: skip
        self.apis = {"core": core, "apps": apps}
        for api in self.apis.values():
            one_attempt(api)  # an informer retries itself, keeping its state meanwhile
        self.namespaces = tuple(namespaces)
        """The namespaces the operator watches; empty: every one (an informer per resource
        for the whole cluster)."""
        self.timeout_s = timeout_s
        """How long a reconcile waits for an informer's first list, s; and each request's
        connect timeout."""
        self.watch_s = watch_s
        self.informers: dict[tuple[str, str | None], Informer[Any]] = {}
        """(resource, namespace or None for all) → its informer."""
        self._lock = threading.Lock()

    # -- WorkloadStore ---------------------------------------------------------------------

    def deployments(
        self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,)
    ) -> list[DeploymentInfo]:
        """Workloads of ``kinds`` in these namespaces (all watched when empty), as last
        seen: no request."""
        selected = set(namespaces)
        return [info for kind in kinds for info in self._values(kind, selected)
                if not selected or info.namespace in selected]  # fmt: skip

    def pod_owners(self, namespaces: Iterable[str], kinds: tuple[str, ...] = (DEPLOYMENT,),
                   listed: Iterable[DeploymentInfo] | None = None) -> Owners:  # fmt: skip
        """Pods → their workload of ``kinds``, from memory (see
        :meth:`~unthrottle.kube.workloads.KubeWorkloadStore.pod_owners`)."""
        selected = set(namespaces)
        owners = Owners()
        if DEPLOYMENT in kinds:
            informers = self._needed(REPLICASETS, selected)
            for informer in informers:
                for key, deploy in informer.items():
                    namespace, name = cast(tuple[str, str], key)  # by_name
                    if not selected or namespace in selected:
                        owners.replicasets[(namespace, name)] = deploy
        workloads = listed
        if workloads is None:
            workloads = self.deployments(selected, tuple(k for k in kinds if k != DEPLOYMENT))
        owners.direct.update({(w.namespace, w.name): w.kind for w in workloads
                              if w.kind in (STATEFULSET, DAEMONSET)})  # fmt: skip
        links: list[PodLink] = [link for link in self._values(PODS, selected)
                                if not selected or link[0][0] in selected]  # fmt: skip
        link_pods(owners, links)
        return owners

    # -- the informers ---------------------------------------------------------------------

    def close(self) -> None:
        """End every watch."""
        with self._lock:
            informers, self.informers = list(self.informers.values()), {}
        for informer in informers:
            informer.close()

    @property
    def requests(self) -> tuple[int, int]:
        """LISTs and WATCHes sent so far, over every informer."""
        informers = list(self.informers.values())
        return sum(i.lists for i in informers), sum(i.watches for i in informers)

    def _scopes(self, selected: set[str]) -> list[str | None]:
        if not self.namespaces:
            return [None]  # one informer for the whole cluster serves any namespace
        return list(sorted(selected) if selected else self.namespaces)

    def _informer(self, resource: str, scope: str | None) -> Informer[Any]:
        with self._lock:
            informer = self.informers.get((resource, scope))
            if informer is None:
                api_name, namespaced, everywhere = LIST_CALLS[resource]
                api = self.apis[api_name]
                call = (getattr(api, everywhere) if scope is None
                        else functools.partial(getattr(api, namespaced), scope))  # fmt: skip
                where = "every namespace" if scope is None else scope
                label = resource if resource in (REPLICASETS, PODS) else f"{resource.lower()}s"
                informer = Informer(call, _CONVERT[resource], name=f"{label} in {where}",
                                    key=by_name, timeout_s=self.timeout_s,
                                    watch_s=self.watch_s).start()  # fmt: skip
                self.informers[(resource, scope)] = informer
        return informer

    def _needed(self, resource: str, selected: set[str]) -> list[Informer[Any]]:
        """The informers that hold ``resource`` for these namespaces, synced and healthy
        (else :class:`WatchStale`)."""
        informers = [self._informer(resource, scope) for scope in self._scopes(selected)]
        for informer in informers:
            if not informer.wait_synced(self.timeout_s):
                failure = f": {informer.failure}" if informer.failure else ""
                raise WatchStale(f"no list of {informer.name} within {self.timeout_s:g} s{failure}")
            if informer.failure is not None:
                raise WatchStale(f"the watch of {informer.name} fails: {informer.failure}")
        return informers

    def _values(self, resource: str, selected: set[str]) -> list[Any]:
        return [v for informer in self._needed(resource, selected) for v in informer.values()]
