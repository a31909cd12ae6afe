"""The admission webhook of InPlace changes: a pod that an InPlace change's ReplicaSet
creates later (a restart, a scale-up, a drained node) is given the applied CPU settings
as it is created, without a change to the pod template.

The lookup: the pod → its controlling ReplicaSet (GET) → the ReplicaSet's controlling
Deployment (GET) → the Deployment's record (``unthrottle.io/last-applied``) →
:func:`unthrottle.kube.inplace.admission_patch`, which decides whether the record covers
that ReplicaSet (:meth:`Record.admits`: past its canary, not rolled back, the same
ReplicaSet).

The webhook never stands in a pod's way. Whatever goes wrong here (the API slow or down,
a record that cannot be read, a pod the change does not fit) the pod is allowed as it
came, with one log line; a lookup is given a budget below the webhook's timeout, so
that a slow API server ends in that answer rather than in the API server's own timeout.
The configuration's ``failurePolicy: Ignore`` covers the rest (the operator down).

The API calls sit behind :class:`OwnerSource`; :class:`KubeOwners` serves it over
``kubernetes.client``. Kopf is not imported here: ``handlers.py`` wires this in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from unthrottle.kube.inplace import admission_patch, owner_replicaset
from unthrottle.kube.patching import Record, record_of

__all__ = [
    "HANDLER_ID",
    "AdmissionSettings",
    "KubeOwners",
    "OwnerSource",
    "PodAdmission",
    "controller_of",
]

HANDLER_ID = "inplace-pods"
"""The mutating handler's id, and so its URL path (``/inplace-pods``): Kopf's webhook
server routes a request to the handler its path names. The chart's configuration uses it."""

_log = logging.getLogger("unthrottle.operator")
Obj = dict[str, Any]


class OwnerSource(Protocol):
    """What the webhook reads: a pod's owners, each by name, each within a timeout."""

    def replicaset(self, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        """The ReplicaSet now, or None when there is none."""
        ...

    def deployment(self, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        """The Deployment now, or None when there is none."""
        ...

    def workload(self, kind: str, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        """The StatefulSet or DaemonSet now, or None when there is none."""
        ...


class KubeOwners:
    """An :class:`OwnerSource` over ``kubernetes.client`` (AppsV1Api), on a client of its
    own (``None``: the loaded kubeconfig's) that tries each call once: urllib3 would retry
    a read that timed out three times, each with a fresh timeout, far past the budget."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        if api_client is None:
            config = client.Configuration.get_default_copy()
            config.retries = False
            api_client = client.ApiClient(config)
        self.apps: Any = client.AppsV1Api(api_client)

    def _read(self, method: Any, namespace: str, name: str, timeout_s: float) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            reply = method(name, namespace, _preload_content=False, _request_timeout=timeout_s)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(json.loads(reply.data))

    def replicaset(self, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        return self._read(self.apps.read_namespaced_replica_set, namespace, name, timeout_s)

    def deployment(self, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        return self._read(self.apps.read_namespaced_deployment, namespace, name, timeout_s)

    def workload(self, kind: str, namespace: str, name: str, *, timeout_s: float) -> Obj | None:
        method = (self.apps.read_namespaced_stateful_set if kind == "StatefulSet"
                  else self.apps.read_namespaced_daemon_set)  # fmt: skip
        return self._read(method, namespace, name, timeout_s)


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """How the webhook looks a pod's record up."""

    budget_s: float = 1.5
    """Time for the whole lookup (both reads, and the wait for a free worker), s. Below the
    configuration's ``timeoutSeconds: 2`` with room for the round trip, so that a slow API
    server ends in "allowed unchanged" from here, logged, rather than in a timeout that only
    the API server sees."""
    workers: int = 4
    """Threads for the lookups, apart from the reconciler's: a reconcile holds its thread
    for as long as it runs, and must never make a pod's admission wait. A lookup takes a
    few milliseconds, so four serve a burst of pod creations (a ReplicaSet creates them in
    batches of 1, 2, 4… up to 500)."""


def controller_of(obj: Obj, kind: str) -> tuple[str, str | None] | None:
    """(name, uid) of ``obj``'s controlling owner of ``kind``, if it has one."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref.get("name")), ref.get("uid")
    return None


class _Skip(Exception):
    """The pod is allowed unchanged, for the reason given (logged)."""


def _pod_name(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    # at admission a ReplicaSet's pod has only its generateName: the name comes after
    return f"{meta.get('namespace')}/{meta.get('name') or (meta.get('generateName') or '') + '*'}"


def _error_text(error: Exception) -> str:
    """One line: the API server's own message for an API error (not its headers)."""
    if isinstance(error, _Skip):
        return str(error)
    status = getattr(error, "status", None)
    if isinstance(status, int):
        try:
            message = json.loads(getattr(error, "body", None) or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"HTTP {status}: {message or getattr(error, 'reason', '')}"
    return " ".join(f"{type(error).__name__}: {error}".split())[:500]


class PodAdmission:
    """The mutation of a pod being created: a merge patch, or None (allowed unchanged).

    ``namespaces``: the operator's watched namespaces (empty: every one); a pod elsewhere
    is left alone whatever the configuration sends."""

    def __init__(self, owners: OwnerSource, settings: AdmissionSettings | None = None, *,
                 namespaces: Iterable[str] = ()) -> None:  # fmt: skip
        self.owners = owners
        self.settings = settings or AdmissionSettings()
        self.namespaces = frozenset(namespaces)
        self._pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="admission")

    def _remaining(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Skip(f"no answer within {self.settings.budget_s:g} s")
        return left

    def _direct_record(self, namespace: str, pod: Obj, deadline: float) -> Record | None:
        """The record of the StatefulSet or DaemonSet that controls ``pod`` (one read)."""
        for kind in ("StatefulSet", "DaemonSet"):
            owner = controller_of(pod, kind)
            if owner is None:
                continue
            name, uid = owner
            found = self.owners.workload(kind, namespace, name,
                                         timeout_s=self._remaining(deadline))  # fmt: skip
            if found is None or (uid and found["metadata"].get("uid") != uid):
                return None  # gone, or another of the same name since
            return record_of(found)
        return None

    def _record(self, namespace: str, replicaset: str, deadline: float) -> Record | None:
        """The record of the Deployment that controls ``replicaset``, or None."""
        rs = self.owners.replicaset(namespace, replicaset, timeout_s=self._remaining(deadline))
        owner = None if rs is None else controller_of(rs, "Deployment")
        if owner is None:
            return None  # gone already, or a ReplicaSet of its own
        name, uid = owner
        deployment = self.owners.deployment(namespace, name,
                                            timeout_s=self._remaining(deadline))  # fmt: skip
        if deployment is None or (uid and deployment["metadata"].get("uid") != uid):
            return None  # gone, or another Deployment of the same name since
        return record_of(deployment)

    def patch(self, pod: Obj, *, deadline: float | None = None) -> Obj | None:
        """The merge patch that gives ``pod`` its ReplicaSet's applied settings, or None.
        Never raises: an error is logged in one line and the pod allowed unchanged."""
        if deadline is None:
            deadline = time.monotonic() + self.settings.budget_s
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        replicaset = owner_replicaset(pod)
        if replicaset is None or not namespace:
            return None
        if self.namespaces and namespace not in self.namespaces:
            return None
        direct = controller_of(pod, "ReplicaSet") is None  # a StatefulSet's or DaemonSet's
        where = (f"pod {_pod_name(pod)} of revision {replicaset}" if direct
                 else f"pod {_pod_name(pod)} of ReplicaSet {replicaset}")  # fmt: skip
        try:
            record = (self._direct_record(namespace, pod, deadline) if direct
                      else self._record(namespace, replicaset, deadline))  # fmt: skip
            # None, or a patch the API server accepts: InPlaceError (logged) for a request
            # the new limit would fall under, which would keep the pod from being created
            merge = None if record is None else admission_patch(pod, record)
        except Exception as error:  # never in a pod's way: one line, allowed unchanged
            _log.warning("admission: %s allowed unchanged: %s", where, _error_text(error))
            return None
        if merge is not None and record is not None:
            limits = ", ".join(f"{c.name}={c.after.cpu_limit}m" for c in record.containers)
            _log.info("admission: %s given the CPU limits of policy %s (%s)", where,
                      record.policy, limits)  # fmt: skip
        return merge

    async def review(self, pod: Obj) -> Obj | None:
        """:meth:`patch` on the webhook's own threads, within the budget (the event loop
        is never blocked; a lookup still queued at the end is answered with None)."""
        deadline = time.monotonic() + self.settings.budget_s
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._pool, lambda: self.patch(pod, deadline=deadline))
        try:
            return await asyncio.wait_for(work, self.settings.budget_s + 0.1)
        except TimeoutError:  # still waiting for a worker, or for the API past its timeout
            _log.warning("admission: pod %s allowed unchanged: no answer within %g s",
                         _pod_name(pod), self.settings.budget_s)  # fmt: skip
            return None
