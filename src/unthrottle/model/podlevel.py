"""A CPU limit set for the pod as a whole (``spec.resources``), as one row of its own.

Since Kubernetes 1.34 (beta, on by default) a pod may carry ``spec.resources``: its
containers then share the pod's limit. The kubelet writes it as the pod cgroup's quota and,
for a container without a limit of its own, as that container's quota too (kubelet
v1.36.3 on the real node: tests/cluster/test_agent_real_node.py), so that what is to
change is the pod's limit. Its evidence is the pod cgroup's (``container=""``: cAdvisor's
and the agent's): the workload gets one row for it, named :data:`POD_ROW`, in place of its
containers that have no limit of their own (a container with its own limit keeps its row).
"""

from __future__ import annotations

POD_ROW = "(pod)"
"""The row of a pod-level limit. No container can be called that: a container's name is a
DNS label (lowercase letters, digits and ``-``)."""


def is_pod_row(name: str) -> bool:
    """Is this row the pod's own limit rather than a container's?"""
    return name == POD_ROW
