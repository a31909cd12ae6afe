"""The Kubernetes API emulator on a real HTTP port, in a thread of its own (old name).

For tests whose code under test is synchronous (the kubernetes client) or runs
in another process (the agent): the emulator's event loop must not be the
test's. ``KmockThread`` is ``kube_emulator.KubeEmulator`` with the pod helpers
the first tests used; new tests use ``KubeEmulator`` directly.
"""

from __future__ import annotations

from typing import Any

from kube_emulator import KubeEmulator


class KmockThread(KubeEmulator):
    """A running emulator; ``url`` is its address. Use as a context manager."""

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Create or replace a pod object (its uid is kept)."""
        self.put("v1/pods", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod object."""
        self.delete("v1/pods", namespace, name)


def pod(namespace: str, name: str, uid: str, node: str, containers: dict[str, str],
        annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod object with container statuses (name → containerd ID)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "annotations": annotations or {},
        },
        "spec": {"nodeName": node, "containers": [{"name": n} for n in containers]},
        "status": {
            "containerStatuses": [
                {"name": n, "containerID": f"containerd://{cid}"} for n, cid in containers.items()
            ]
        },
    }
