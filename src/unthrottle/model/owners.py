"""Which workload a pod belongs to, including pods that are gone; and how a workload is
named inside unthrottle.

A workload is a Deployment, a StatefulSet or a DaemonSet (:data:`KINDS`). Inside, one
string names it in its namespace, its *reference* (:func:`ref`): a Deployment's bare name
(``web``), as every reader of unthrottle's output and status has it, and
``statefulset/db`` or ``daemonset/agent`` for the others, the form ``kubectl`` takes. A
Kubernetes name never holds a ``/``, so the two never meet; :func:`kind_and_name` splits
one again at the edges (the API, the outputs).

A window of history holds pods that no longer exist: a rollout replaced
them, they were evicted, or their node went. Their CPU counts as much as the live pods'.
The live ones are known by their owner references; a gone pod is recognised by its name:
- the ReplicaSet controller names pods ``<replicaset>-<5 characters>`` from Kubernetes'
  random alphabet, and a Deployment's old ReplicaSets stay (``revisionHistoryLimit``, 10
  by default);
- the StatefulSet controller names them ``<statefulset>-<ordinal>``;
- the DaemonSet controller, ``<daemonset>-<5 characters>``, like a ReplicaSet's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEPLOYMENT, STATEFULSET, DAEMONSET = "Deployment", "StatefulSet", "DaemonSet"
KINDS = (DEPLOYMENT, STATEFULSET, DAEMONSET)
"""The kinds of workload unthrottle reads, in the order it lists them."""
_BY_LOWER = {k.lower(): k for k in KINDS}

_ALPHABET = "[bcdfghjklmnpqrstvwxz2456789]"
"""k8s.io/apimachinery's rand.String alphabet: the suffix of generated names."""
_GENERATED = re.compile(rf"^(?P<rs>.+)-{_ALPHABET}{{5}}$")
"""``<replicaset>-xxxxx`` (and ``<daemonset>-xxxxx``)."""
_ORDINAL = re.compile(r"^(?P<sts>.+)-(?:0|[1-9][0-9]*)$")
"""``<statefulset>-<ordinal>``."""
POD_SUFFIX = {
    DEPLOYMENT: f"-[a-z0-9]+-{_ALPHABET}{{5}}",
    STATEFULSET: "-(0|[1-9][0-9]*)",
    DAEMONSET: f"-{_ALPHABET}{{5}}",
}
"""An RE2 pattern of a pod's name after its workload's, by kind: a Deployment's pods carry
the template hash, then the ReplicaSet controller's suffix."""


def ref(kind: str, name: str) -> str:
    """The reference of a workload: ``web`` for a Deployment, ``statefulset/db`` else."""
    return name if kind == DEPLOYMENT else f"{kind.lower()}/{name}"


def kind_and_name(reference: str) -> tuple[str, str]:
    """``statefulset/db`` → (``StatefulSet``, ``db``); ``web`` → (``Deployment``, ``web``)."""
    head, slash, name = reference.partition("/")
    if not slash:
        return DEPLOYMENT, reference
    return _BY_LOWER.get(head, head), name


def kind_of(reference: str) -> str:
    """The kind of the workload a reference names."""
    return kind_and_name(reference)[0]


def ref_of(obj: dict[str, object]) -> str:
    """The reference of a workload object as the API serves it (one of a list has no
    ``kind``: the lists of unthrottle's stores set it)."""
    meta = obj.get("metadata")
    name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
    return ref(str(obj.get("kind") or DEPLOYMENT), name)


def shown(reference: str) -> str:
    """``StatefulSet db``, ``Deployment web``: a workload for people."""
    return " ".join(kind_and_name(reference))


def workload_of_pod_name(pod: str, wanted: set[str] | frozenset[str]) -> str | None:
    """The reference among ``wanted`` whose pods are named like ``pod``, or None: for
    series read by pod-name patterns (a Deployment's first: its names are the most
    specific)."""
    deploy = pod.rsplit("-", 2)[0]
    if deploy in wanted and re.fullmatch(POD_SUFFIX[DEPLOYMENT], pod[len(deploy) :]):
        return deploy
    base = pod.rsplit("-", 1)[0]
    for kind in (STATEFULSET, DAEMONSET):
        candidate = ref(kind, base)
        if candidate in wanted and re.fullmatch(POD_SUFFIX[kind], pod[len(base) :]):
            return candidate
    return None


@dataclass
class Owners:
    """(namespace, pod) → the reference of its workload; (namespace, ReplicaSet) →
    Deployment; (namespace, name) → kind, for the StatefulSets and DaemonSets known."""

    pods: dict[tuple[str, str], str] = field(default_factory=dict)
    replicasets: dict[tuple[str, str], str] = field(default_factory=dict)
    direct: dict[tuple[str, str], str] = field(default_factory=dict)
    """StatefulSets and DaemonSets (they own their pods directly), by name → kind."""
    pod_level: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, workload reference) of the workloads whose pods have a CPU limit of
    their own (``spec.resources``): their pods' cgroups are evidence of a row
    (:mod:`unthrottle.model.podlevel`), known from the Kubernetes API only."""

    def workload_of(self, namespace: str, pod: str) -> str | None:
        """The reference of the pod's workload: from its owner reference, else from its
        generated name (see the module's docstring)."""
        known = self.pods.get((namespace, pod))
        if known is not None:
            return known
        named = _GENERATED.match(pod)
        if named:
            deploy = self.replicasets.get((namespace, named.group("rs")))
            if deploy is not None:
                return deploy
            if self.direct.get((namespace, named.group("rs"))) == DAEMONSET:
                return ref(DAEMONSET, named.group("rs"))
        ordinal = _ORDINAL.match(pod)
        if ordinal and self.direct.get((namespace, ordinal.group("sts"))) == STATEFULSET:
            return ref(STATEFULSET, ordinal.group("sts"))
        return None

    def namespaces(self) -> set[str]:
        """The namespaces in which pods or their owners are known."""
        return (
            {ns for ns, _ in self.pods}
            | {ns for ns, _ in self.replicasets}
            | {ns for ns, _ in self.direct}
        )
