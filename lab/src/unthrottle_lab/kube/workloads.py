"""A scenario as a Deployment on the real node: the objects a user (or the demo, or a
test) applies to make real throttled pods.

The scenario file goes into a ConfigMap, mounted at ``/scenario``; the pod runs the
workload image (``kubelet.json``'s ``images.workload``, never pulled) with
``args: [workload, /scenario/scenario.yaml]``; it tolerates the real node's taint
and is placed on it by name. Its CPU request and limit are the container's; everything
else in the pod is left to the kubelet's defaults, so what the kubelet makes of it (its
cgroups, the pod-level quota, the QoS class) is what it makes of any pod.
"""

from __future__ import annotations

from typing import Any

__all__ = ["REAL_NODE_TAINT", "scenario_objects"]

REAL_NODE_TAINT = {"key": "unthrottle.io/real-node", "value": "true", "effect": "NoSchedule"}
"""The real node's taint: only pods meant for it (which tolerate it) run there; the fake
nodes' pods, whose images the real node does not have, never land on it."""


def scenario_objects(name: str, namespace: str, scenario_yaml: str, *, image: str, node: str,
                     cpu_limit: str | None, cpu_request: str = "100m", replicas: int = 1,
                     memory: str = "128Mi", container: str = "app",
                     labels: dict[str, str] | None = None,
                     resize_policy: str | None = None,
                     pod_cpu_limit: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The ConfigMap and the Deployment that run ``scenario_yaml`` as ``name``'s pods;
    ``pod_cpu_limit``: a CPU limit for the pod as a whole (``spec.resources``, its request
    ``cpu_request``), the container then with none of its own."""
    labels = {"app": name, **(labels or {})}
    limits = {"memory": memory} | ({"cpu": cpu_limit} if cpu_limit else {})
    spec_container: dict[str, Any] = {
        "name": container, "image": image, "imagePullPolicy": "Never",
        "args": ["workload", "/scenario/scenario.yaml"],
        "resources": {"requests": {"cpu": cpu_request, "memory": memory}, "limits": limits},
        "volumeMounts": [{"name": "scenario", "mountPath": "/scenario", "readOnly": True}],
    }  # fmt: skip
    if resize_policy:
        spec_container["resizePolicy"] = [
            {"resourceName": "cpu", "restartPolicy": resize_policy}]  # fmt: skip
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-scenario", "namespace": namespace},
        "data": {"scenario.yaml": scenario_yaml},
    }  # fmt: skip
    pod_level: dict[str, Any] = {}
    if pod_cpu_limit is not None:
        pod_level = {"resources": {"limits": {"cpu": pod_cpu_limit},
                                   "requests": {"cpu": cpu_request}}}  # fmt: skip
        spec_container["resources"] = {"requests": {"memory": memory},
                                       "limits": {"memory": memory}}  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
                    "terminationGracePeriodSeconds": 2,
                    "enableServiceLinks": False, "automountServiceAccountToken": False,
                    **pod_level,
                    "containers": [spec_container],
                    "volumes": [{"name": "scenario",
                                 "configMap": {"name": f"{name}-scenario"}}],
                },
            },
        },
    }  # fmt: skip
    return [config_map, deployment]
