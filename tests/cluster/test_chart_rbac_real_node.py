"""The chart's RBAC on the real node (root, the session's real node): the permissions the
operator's InPlace Apply needs (pods/resize, then pods patch for the burst annotation) are
used by the operator's own pod store on the chart's ServiceAccount token, and the kubelet
actuates the resize. The chart's other install tests run on their own control plane with
kwok's nodes (tests/cluster/test_chart_install.py); only one real node runs on a machine at
a time (containerd's state is /run/containerd), so this one joins the session's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from support.chart_rbac import chart_rbac
from support.machine import KERNEL_LAYOUT
from unthrottle_lab.kube import REAL_NODE_TAINT, RealNode

DEPLOYMENTS = "apps/v1/deployments"


IDLE = """name: idle
workload: {kind: serial, task_cpu_ms: 2, workers: 1, tasks: 20, think_ms: 98}
runs: [{}]
"""
"""What the real pod runs: 2 % of a core."""


def _idle_on(node: RealNode, namespace: str) -> dict[str, Any]:
    """A Deployment of one Burstable pod of the workload image on the real node."""
    labels = {"app": "idle"}
    container = {"name": "app", "image": node.images["workload"].name,
                 "imagePullPolicy": "Never", "args": ["workload", "/s/scenario.yaml"],
                 "volumeMounts": [{"name": "s", "mountPath": "/s"}],
                 "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}  # fmt: skip
    spec = {"nodeSelector": {"kubernetes.io/hostname": node.name},
            "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
            "volumes": [{"name": "s", "configMap": {"name": "idle"}}],
            "containers": [container]}  # fmt: skip
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "idle", "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}  # fmt: skip


@pytest.mark.kernel
def test_in_place_the_charts_rbac_resizes_a_real_pod_and_patches_its_burst(
    kube: Kube, tmp_path: Path, real_node: RealNode
) -> None:
    """What the chart's install tests on kwok cannot reach: on the real node, the
    operator's own pod store (``KubePods``) on the chart's RBAC, with Apply and InPlace on,
    resizes a running pod (pods/resize: the kubelet writes the new quota into its cgroup)
    and then patches the pod's burst annotation (pods patch), as InPlace does once a
    kubelet reports a resize done. The pod is the same one, never restarted."""
    from kubernetes.config import new_client_from_config

    from unthrottle.cgroups import Cgroup
    from unthrottle.kube.inplace import annotation_patch
    from unthrottle.kube.pods import KubePods
    from unthrottle.model.burst import BURST_ANNOTATION

    namespace = kube.namespace
    values = {"apply": {"enabled": True, "inPlace": {"enabled": True}},
              "watchNamespaces": [namespace]}  # fmt: skip
    kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "idle", "namespace": namespace},
                                  "data": {"scenario.yaml": IDLE}})  # fmt: skip
    kube.create(DEPLOYMENTS, _idle_on(real_node, namespace))
    (pod,) = kube.pods_of(kube.replicaset_of(kube.rolled_out(namespace, "idle", timeout_s=120)))
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    assert KERNEL_LAYOUT is not None
    cgroup = Cgroup(KERNEL_LAYOUT, f"{real_node.cgroup_parent}/kubepods/burstable/pod{uid}/{cid}")
    assert cgroup.read_bandwidth().quota_us == 50_000
    with chart_rbac(kube, {"operator": values}) as rbac:
        config = kube.kubeconfig(tmp_path / "operator.kubeconfig", token=rbac.token())
        pods = KubePods(new_client_from_config(config_file=str(config)))
        body = {"spec": {"containers": [{"name": "app", "resources": {
            "requests": {"cpu": "100m"}, "limits": {"cpu": "700m"}}}]}}  # fmt: skip
        pods.resize(namespace, name, body)
        kube.until("the kubelet's new quota in the pod's cgroup", cgroup.read_bandwidth,
                   lambda bw: bw.quota_us == 70_000, timeout_s=60)  # fmt: skip
        patched = pods.annotate(namespace, name, annotation_patch(BURST_ANNOTATION, "app=10ms"))
    assert patched["metadata"]["annotations"][BURST_ANNOTATION] == "app=10ms"
    now = kube.get("v1/pods", namespace, name)
    assert now is not None and now["metadata"]["uid"] == uid
    status = now["status"]["containerStatuses"][0]
    assert status["containerID"].endswith(cid) and status["restartCount"] == 0, status
