"""Deployments that look like the ones users run, for tests against the real API server.

Shell commands with ``&&`` and redirections, env values with URLs and query strings,
non-ASCII text in env and annotations, probes, a sidecar, an init container: every one of
them is something the API server encodes differently from Python's JSON (``&`` as
``\\u0026``, UTF-8 raw), which the old emulator never showed.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

NON_ASCII = "café — naïve façade ✓ 東京"
URL = "https://payments.example/api?region=eu&retry=3&flag=<on>"
COMMAND = ["/bin/sh", "-c", "migrate --yes && exec server --port 8080 2>&1 | tee /dev/stderr"]


def container(name: str, *, limit: str | None = "500m", request: str = "250m",
              env: list[Obj] | None = None) -> Obj:  # fmt: skip
    resources: Obj = {"requests": {"cpu": request, "memory": "64Mi"}}
    if limit is not None:
        resources["limits"] = {"cpu": limit, "memory": "128Mi"}
    return {
        "name": name,
        "image": f"registry.example/{name}:1.4.2",
        "command": COMMAND,
        "args": ["--upstream", URL, "--greeting", NON_ASCII],
        "env": env if env is not None else [
            {"name": "UPSTREAM", "value": URL},
            {"name": "MOTD", "value": NON_ASCII},
            {"name": "GOGC", "value": "100"},
        ],
        "resources": resources,
        "readinessProbe": {"exec": {"command": ["/bin/sh", "-c", "test -f /ready && echo ok"]},
                           "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz?verbose=1&x=<y>", "port": 8080}},
    }  # fmt: skip


def deployment(namespace: str, name: str, *, replicas: int = 2,
               labels: dict[str, str] | None = None, containers: list[Obj] | None = None,
               annotations: dict[str, str] | None = None,
               template_annotations: dict[str, str] | None = None,
               **spec: Any) -> Obj:  # fmt: skip
    """A Deployment with an app container, a sidecar and an init container by default."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "namespace": namespace, "name": name,
            "labels": {"app.kubernetes.io/name": name, **(labels or {})},
            "annotations": {"owner": f"équipe paiements <pay@example.com> & {NON_ASCII}",
                            **(annotations or {})},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {
                    "labels": {"app.kubernetes.io/name": name},
                    "annotations": {"note": f"déployé & vérifié <{NON_ASCII}>",
                                    **(template_annotations or {})},
                },
                "spec": {
                    "initContainers": [{"name": "init", "image": "registry.example/init:1",
                                        "command": ["/bin/sh", "-c", "sleep 1 && echo done"]}],
                    "containers": containers or [container("app"),
                                                 container("sidecar", limit="100m",
                                                           request="50m")],
                },
            },
            **spec,
        },
    }  # fmt: skip
