"""The chart installed on the real node the way a user installs it: ``helm install`` (Helm's
own Go SDK, helm-python-sdk: the action a ``helm install`` runs, CRDs and hooks included),
its pods scheduled on the real node from the image built from the Dockerfile
(:mod:`.image`), and a Prometheus on the host that finds them as a user's Prometheus does,
through ``kubernetes_sd_configs`` against the API server.

What the real node needs that a user's cluster has already (the only values set here that
a user would not): the image is imported, not pulled (``image.pullPolicy: Never``); the
operator tolerates the real node's taint (:data:`REAL_NODE_TAINT`, ours, which keeps the
other tests' pods on kwok's nodes); the agent is told where the node's ``kubepods`` sits
below the cgroup mount (``agent.kubepodsParent``, as on kind nodes); both are held to the
real node by ``nodeSelector`` (the control plane's kwok nodes would take, and fake, them
too). Prometheus listens on the node's address, where pods reach the host.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unthrottle_lab.kube.admin import Admin
from unthrottle_lab.kube.cluster import ControlPlane
from unthrottle_lab.kube.image import repository_and_tag
from unthrottle_lab.kube.images import Image
from unthrottle_lab.kube.node import NODE_ADDRESS, RealNode
from unthrottle_lab.kube.workloads import REAL_NODE_TAINT

CHART = Path(__file__).resolve().parents[4] / "charts" / "unthrottle"
"""The repository's chart (the laboratory runs from the source tree)."""
RELEASE = "unthrottle"
NAMESPACE = "unthrottle"
INSTALL_TIMEOUT_S = 300
"""``helm install --wait --timeout``: the pods' first start on a cold node (the image's
unpack, the agent's first discovery) is well under a minute; the rest is slack."""


@dataclass(frozen=True, slots=True)
class Installed:
    """A release of the chart on the control plane."""

    release: str
    namespace: str
    values: dict[str, Any]
    manifest: str
    """What Helm applied (``helm get manifest``)."""


def image_values(image: Image) -> dict[str, Any]:
    """``image.*`` for an imported image (:func:`.image.import_image`): its repository and
    tag, never pulled."""
    repository, tag = repository_and_tag(image)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def node_values(node: RealNode, image: Image, prometheus_url: str) -> dict[str, Any]:
    """The values the real node needs (module docstring); everything else is the chart's
    default or the caller's."""
    taint = REAL_NODE_TAINT
    # the control plane's kwok nodes would take (and fake) the chart's pods too
    on_node = {"kubernetes.io/hostname": node.name}
    return {
        "image": image_values(image),
        "prometheus": {"url": prometheus_url},
        "operator": {
            "nodeSelector": on_node,
            "tolerations": [{"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}],
        },
        "agent": {"kubepodsParent": node.cgroup_parent, "nodeSelector": on_node},
    }


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, maps merged key by key (as Helm merges ``-f`` files)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def _config(plane: ControlPlane, namespace: str) -> Any:
    import helm_python as helm

    return helm.Config(kubeconfig_path=plane.kubeconfig, namespace=namespace)


def install(plane: ControlPlane, values: dict[str, Any], *, release: str = RELEASE,
            namespace: str = NAMESPACE) -> Installed:  # fmt: skip
    """``helm install RELEASE charts/unthrottle -n NAMESPACE --create-namespace --wait``:
    returns once every pod of the chart is Ready (Helm's watcher), HelmError otherwise."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart, _config(plane, namespace) as config:
        done = config.install(chart, release, values, namespace=namespace,
                              create_namespace=True, wait="watcher",
                              timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    return Installed(release, namespace, values, str(_field(done, "manifest")))


def upgrade(plane: ControlPlane, installed: Installed, values: dict[str, Any]) -> Installed:
    """``helm upgrade --wait`` of the release with ``values`` (whole, not reused)."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart, _config(plane, installed.namespace) as config:
        done = config.upgrade(chart, installed.release, values, namespace=installed.namespace,
                              wait="watcher", timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    return Installed(installed.release, installed.namespace, values,
                     str(_field(done, "manifest")))  # fmt: skip


def uninstall(plane: ControlPlane, installed: Installed) -> None:
    """``helm uninstall --wait``, then until the release's pods are gone: Helm's watcher
    waits for the release's own objects only, and returned here in 0.3 s with both pods
    still terminating (the agent sets its bursts back as it stops)."""
    with _config(plane, installed.namespace) as config:
        config.uninstall(installed.release, wait="watcher", timeout=INSTALL_TIMEOUT_S,
                         ignore_not_found=True)  # fmt: skip
    _until_no_pods(plane, installed.release, installed.namespace)


def _until_no_pods(plane: ControlPlane, release: str, namespace: str) -> None:
    selector = urllib.parse.quote(f"app.kubernetes.io/instance={release}")
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    deadline = time.monotonic() + INSTALL_TIMEOUT_S
    while time.monotonic() < deadline:
        status, found = plane.request("GET", path)
        if status == 404 or (status == 200 and not found.get("items")):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the pods of release {release} still there {INSTALL_TIMEOUT_S} s "
                       "after helm uninstall")  # fmt: skip


@contextmanager
def installed(plane: ControlPlane, values: dict[str, Any], *, release: str = RELEASE,
              namespace: str = NAMESPACE) -> Iterator[Installed]:  # fmt: skip
    """The release for the block; uninstalled after it, also on errors."""
    done = None
    try:
        done = install(plane, values, release=release, namespace=namespace)
        yield done
    finally:
        with _config(plane, namespace) as config:
            config.uninstall(release, wait="watcher", timeout=INSTALL_TIMEOUT_S,
                             ignore_not_found=True)  # fmt: skip
        _until_no_pods(plane, release, namespace)


def _field(release: Any, name: str) -> Any:
    """A field of what the SDK returned (a mapping, or an object with attributes)."""
    if isinstance(release, dict):
        return release.get(name, release.get("release", {}).get(name, ""))
    return getattr(release, name, "")


def scrape_config(plane: ControlPlane, node: RealNode, token: Path) -> str:
    """Prometheus's scrape jobs as a user's Prometheus outside the cluster has them
    (docs/install.md, "Scraping"): the agent's and the operator's pods found through
    ``kubernetes_sd_configs`` (role pod) by the chart's labels and port names, the agent's
    labels honoured; the kubelets' cAdvisor found as nodes (role node: their InternalIP and
    kubelet port), over HTTPS with a token allowed ``nodes/metrics``."""
    sd = {"kubeconfig_file": str(plane.kubeconfig)}

    def pods(component: str, honor: bool) -> dict[str, Any]:
        return {
            "job_name": f"unthrottle-{component}",
            "honor_labels": honor,
            "kubernetes_sd_configs": [{"role": "pod", **sd}],
            "relabel_configs": [{
                "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                                  "__meta_kubernetes_pod_label_app_kubernetes_io_component",
                                  "__meta_kubernetes_pod_container_port_name"],
                "regex": f"unthrottle;{component};metrics", "action": "keep"}],
        }  # fmt: skip

    cadvisor = {
        "job_name": "kubelet-cadvisor",
        "scheme": "https",
        "metrics_path": "/metrics/cadvisor",
        "authorization": {"credentials_file": str(token)},
        "tls_config": {"ca_file": str(plane.pki.ca)},
        "kubernetes_sd_configs": [{"role": "node", **sd}],
    }
    jobs = [pods("agent", True), pods("operator", False), cadvisor]
    # JSON is YAML: one line per job keeps the file readable in a failure's logs
    return "scrape_configs:\n" + "".join(f"  - {json.dumps(job)}\n" for job in jobs)


def prometheus_token(admin: Admin, namespace: str, folder: Path) -> Path:
    """A ServiceAccount ``prometheus`` in ``namespace`` (which exists), allowed ``get
    nodes/metrics`` (what the kubelet's webhook authorization asks the API server for
    ``/metrics/cadvisor``), as a user's Prometheus has; its token's file. The ClusterRole
    and its binding are ``prometheus-<namespace>``."""
    rbac = "rbac.authorization.k8s.io/v1"
    name = f"prometheus-{namespace}"
    admin.create("v1/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": "prometheus",
                                                     "namespace": namespace}})  # fmt: skip
    admin.create(f"{rbac}/clusterroles", {
        "apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/metrics"],
                   "verbs": ["get"]}]})  # fmt: skip
    admin.create(f"{rbac}/clusterrolebindings", {
        "apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus",
                      "namespace": namespace}]})  # fmt: skip
    path = folder / "prometheus.token"
    path.write_text(admin.token(namespace, "prometheus"))
    path.chmod(0o600)
    return path


def prometheus_url(port: int) -> str:
    """Where the chart's pods reach a Prometheus on the host listening on ``port``."""
    return f"http://{NODE_ADDRESS}:{port}"


def kubelet_address(node: RealNode) -> str:
    """``HOST:PORT`` of the kubelet as Prometheus's node discovery gives it."""
    return f"{NODE_ADDRESS}:{urllib.parse.urlparse(node.endpoint).port}"
