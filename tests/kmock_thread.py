"""The kmock Kubernetes emulator on a real HTTP port, in a thread of its own.

For tests whose code under test is synchronous (the kubernetes client) or runs
in another process (the agent): the emulator's event loop must not be the
test's. Objects are added and removed through the loop, thread-safely.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import kmock


class KmockThread:
    """A running emulator; ``url`` is its address. Use as a context manager."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.url = ""
        self.emulator: kmock.KubernetesEmulator | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
            self.emulator = emulator
            for resource in ("v1/pods", "apps/v1/deployments", "apps/v1/replicasets"):
                emulator.resources[resource] = {}  # listable before any object exists
            self.url = str(emulator.url)
            self.ready.set()
            await self._stop.wait()

    def _call(self, fn: Any) -> Any:
        future = asyncio.run_coroutine_threadsafe(self._async(fn), self.loop)
        return future.result(timeout=10)

    @staticmethod
    async def _async(fn: Any) -> Any:
        return fn()

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Create or replace a pod object."""
        meta = pod["metadata"]

        def put() -> None:
            assert self.emulator is not None
            self.emulator.objects["v1/pods", meta["namespace"], meta["name"]] = pod

        self._call(put)

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        """Create or replace any object (``resource`` as ``apps/v1/deployments``)."""
        meta = obj["metadata"]

        def put() -> None:
            assert self.emulator is not None
            self.emulator.objects[resource, meta["namespace"], meta["name"]] = obj

        self._call(put)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod object."""

        def delete() -> None:
            assert self.emulator is not None
            self.emulator.objects["v1/pods", namespace, name].delete()

        self._call(delete)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file pointing at the emulator."""
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
            f"clusters: [{{name: kmock, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: test, user: {token: test}}]\n"
            "contexts: [{name: kmock, context: {cluster: kmock, user: test}}]\n"
        )
        return path

    def __enter__(self) -> KmockThread:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("kmock did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)
        self.loop.close()


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
