"""Which Deployment a pod belongs to, including pods that are gone.

A window of history holds pods that no longer exist: a rollout replaced
them, or they were evicted. Their CPU counts as much as the live pods'. The
live ones are known by their owner references; a gone pod is recognised by
its name: the ReplicaSet controller names pods ``<replicaset>-<5 characters>``
from Kubernetes' random alphabet, and a Deployment's old ReplicaSets stay
(``revisionHistoryLimit``, 10 by default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_GENERATED = re.compile(r"^(?P<rs>.+)-[bcdfghjklmnpqrstvwxz2456789]{5}$")
"""``<replicaset>-xxxxx``: the suffix alphabet of k8s.io/apimachinery's rand.String."""


@dataclass
class Owners:
    """(namespace, pod) → Deployment, and (namespace, ReplicaSet) → Deployment."""

    pods: dict[tuple[str, str], str] = field(default_factory=dict)
    replicasets: dict[tuple[str, str], str] = field(default_factory=dict)

    def deployment_of(self, namespace: str, pod: str) -> str | None:
        """The pod's Deployment: from its owner reference, else from its generated name."""
        deploy = self.pods.get((namespace, pod))
        if deploy is not None:
            return deploy
        named = _GENERATED.match(pod)
        return self.replicasets.get((namespace, named.group("rs"))) if named else None
