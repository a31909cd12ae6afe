"""The agent, and ``recommend``, on a real node: a kubelet v1.36 with containerd and runc
(cgroupfs driver, cgroup v1 here) made the cgroups, cAdvisor in that kubelet exports its
series, and a real Prometheus scrapes them (``/metrics/cadvisor`` over HTTPS, the admin's
client certificate, allowed ``nodes/metrics``).

- ``unthrottle agent`` (a process, as a DaemonSet runs it) names the kubelet's real
  containers, the pod-level cgroup as ``container=""``, and never the pause container;
- its counters are the containers' ``cpu.stat`` (read before and after a scrape: within
  the one 100 ms sample the agent may be behind);
- its series join cAdvisor's on ``namespace``, ``pod``, ``container`` in Prometheus;
- cAdvisor's ``container=""`` series of a pod are two cgroups, the pod's own (with the
  pod-level quota) and its pause container's, told apart only by ``id``;
- ``unthrottle recommend`` runs on cAdvisor's own series alone (their label set: ``id``,
  ``image``, ``name``; the pause container's ``container=""``) and sizes the one container
  of the pod's spec, from its throttling;
- a pod whose limit is the pod's (``spec.resources``), its container unlimited: the
  kubelet writes that quota on the pod cgroup and on the container's, and ``recommend``
  sizes the pod's row ``(pod)`` from cAdvisor's ``container=""`` series.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import requires_prometheus
from support.real_node import (
    _container_cgroup,
    _running,
)
from unthrottle.cgroups import Cgroup, Layout
from unthrottle_lab.children import stop
from unthrottle_lab.kube import ControlPlane, RealNode
from unthrottle_lab.prometheus import PrometheusServer, free_port

pytestmark = [pytest.mark.kernel, requires_prometheus]

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
STALE_S = 1.0
"""How much older than a reading of ``cpu.stat`` the agent's last sample may be: ten of its
100 ms samples, for a sampler that a loaded 2-core machine does not always run on time."""
COUNTERS = ("cfs_periods_total", "cfs_throttled_periods_total", "usage_seconds_total",
            "cfs_throttled_seconds_total")  # fmt: skip


@contextmanager
def agent(plane: ControlPlane, node: RealNode, log: Path) -> Iterator[int]:
    """``unthrottle agent`` on the node's cgroup root, naming through the API: its port."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([
            str(UNTHROTTLE), "agent", "--kubeconfig", str(plane.kubeconfig),
            "--node-name", node.name, "--kubepods-parent", node.cgroup_parent,
            "--listen", f"127.0.0.1:{port}", "--period", "100ms", "--discover-every", "500ms",
        ], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield port
    finally:
        stop(proc, timeout_s=15)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def series(text: str, metric: str, **labels: str) -> dict[tuple[str, ...], float]:
    """``metric``'s samples whose labels include ``labels``: (namespace, pod, container)
    → value."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        body, _, value = line[len(metric) + 1 :].rpartition("} ")
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body))
        if all(found.get(k) == v for k, v in labels.items()):
            key = (found.get("namespace", ""), found.get("pod", ""), found.get("container", ""))
            out[key] = float(value.split()[0])
    return out


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}), timeout=10) as reply:  # fmt: skip
        return list(json.loads(reply.read())["data"]["result"])


def cadvisor_scrape(node: RealNode) -> str:
    """Prometheus's job for the kubelet's cAdvisor: HTTPS, the cluster's CA, the admin's
    client certificate (the kubelet asks the API server: ``get nodes/metrics``)."""
    cert, key = node.plane.pki.admin
    target = urllib.parse.urlparse(node.endpoint).netloc
    return ("  - job_name: kubelet-cadvisor\n    scheme: https\n"
            "    metrics_path: /metrics/cadvisor\n"
            f"    tls_config: {{ca_file: '{node.plane.pki.ca}', cert_file: '{cert}', "
            f"key_file: '{key}'}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")  # fmt: skip


def test_the_agent_names_the_kubelets_containers_and_exports_their_cpu_stat(
    kube: Kube, real_node: RealNode, layout: Layout, control_plane: ControlPlane, tmp_path: Path
) -> None:
    pod = _running(kube, real_node, "counted")
    name, ns = pod["metadata"]["name"], kube.namespace
    own = _container_cgroup(real_node, layout, pod)
    whole = Cgroup(layout, own.path.rsplit("/", 1)[0])
    with agent(control_plane, real_node, tmp_path / "agent.log") as port:
        text = kube.until("the agent's series of the pod",
                          lambda: _try_scrape(port),
                          lambda t: (ns, name, "app") in series(
                              t, "unthrottle_cpu_cfs_periods_total", namespace=ns),
                          timeout_s=30)  # fmt: skip
        # the pod's containers as its spec names them, and the pod cgroup as "": the
        # pause container has a cgroup of its own, and no name in the spec, so no series
        named = set(series(text, "unthrottle_cpu_cfs_periods_total", namespace=ns))
        assert named == {(ns, name, "app"), (ns, name, "")}, named
        time.sleep(2)  # a throttled workload's counters keep moving
        for _ in range(3):
            before = own.read_stat(), whole.read_stat()
            text = scrape(port)
            after = own.read_stat(), whole.read_stat()
            for container, low, high in (("app", before[0], after[0]),
                                         ("", before[1], after[1])):  # fmt: skip
                got = {c: series(text, f"unthrottle_cpu_{c}", namespace=ns, pod=name,
                                 container=container)[(ns, name, container)]
                       for c in COUNTERS}  # fmt: skip
                # the agent's sample is never newer than the reading after the scrape, and
                # older than the one before by one 100 ms sample and a scheduling delay:
                # STALE_S at most, on this shared machine
                assert (low.nr_periods - 10 * STALE_S - 1 <= got["cfs_periods_total"]
                        <= high.nr_periods), got  # fmt: skip
                assert (low.nr_throttled - 10 * STALE_S - 1 <= got["cfs_throttled_periods_total"]
                        <= high.nr_throttled), got  # fmt: skip
                # usage: 500m at most; throttled time: summed over the node's 2 CPUs
                assert (low.usage_us / 1e6 - 0.5 * STALE_S <= got["usage_seconds_total"]
                        <= high.usage_us / 1e6), got  # fmt: skip
                assert (low.throttled_us / 1e6 - 2 * STALE_S <= got["cfs_throttled_seconds_total"]
                        <= high.throttled_us / 1e6), got  # fmt: skip
            assert before[0].nr_throttled > 0  # 500m for two 60 ms tasks at once: throttled
            time.sleep(1)


def _try_scrape(port: int) -> str:
    try:
        return scrape(port)
    except OSError:
        return ""


@pytest.fixture
def prometheus(tmp_path: Path) -> Path:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    return folder


def test_the_agents_series_join_cadvisors_on_namespace_pod_and_container(
    kube: Kube, real_node: RealNode, control_plane: ControlPlane, prometheus: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    pod = _running(kube, real_node, "joined")
    name, ns = pod["metadata"]["name"], kube.namespace
    with agent(control_plane, real_node, tmp_path / "agent.log") as port:
        scrape_jobs = ("scrape_configs:\n  - job_name: agent\n"
                       f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
                       + cadvisor_scrape(real_node))  # fmt: skip
        with PrometheusServer(prometheus, scrape=scrape_jobs) as prom:
            joined = (f'unthrottle_cpu_cfs_throttled_periods_total{{namespace="{ns}"}} '
                      "- on (namespace, pod, container) "
                      f'container_cpu_cfs_throttled_periods_total{{namespace="{ns}"}}')  # fmt: skip
            found = kube.until("the agent's series joined with cAdvisor's",
                               lambda: query(prom.url, joined),
                               lambda r: {x["metric"].get("container") for x in r} >= {"app"},
                               timeout_s=60)  # fmt: skip
            both = {(r["metric"]["pod"], r["metric"].get("container", "")): float(r["value"][1])
                    for r in found}  # fmt: skip
            assert (name, "app") in both, both
            # The same cpu.stat read by both: the agent every 100 ms, cAdvisor on its own
            # housekeeping (10-15 s apart), each scraped in its own second: the agent is
            # ahead by at most 30 s of periods (ten a second, every period throttled), and
            # behind by no more than 2 s of them.
            assert -20 <= both[(name, "app")] <= 30 * 10, both
            # cAdvisor's container="" series of the pod are two cgroups, told apart only by
            # id: the pod's own (whose quota throttles too) and the pause container's below
            # it, where the agent has one pod-level series
            uid = pod["metadata"]["uid"]
            pod_cgroup = f"/{real_node.cgroup_parent}/kubepods/burstable/pod{uid}"
            own = kube.until("cAdvisor's series of the pod's own cgroup",
                             lambda: query(prom.url, "container_cpu_cfs_throttled_periods_total"
                                                     f'{{id="{pod_cgroup}"}}'),
                             lambda r: len(r) == 1, timeout_s=60)  # fmt: skip
            labels = own[0]["metric"]
            assert (labels.get("namespace"), labels.get("pod"), labels.get("container", "")) == (
                ns, name, ""), labels  # fmt: skip
            pod_level = query(
                prom.url,
                f'container_cpu_usage_seconds_total{{namespace="{ns}",pod="{name}",container=""}}',
            )
            ids = {r["metric"]["id"] for r in pod_level}
            assert ids and all(i == pod_cgroup or i.startswith(pod_cgroup + "/") for i in ids), ids


def throttled_in_prometheus(kube: Kube, url: str, pod: dict[str, Any], container: str) -> None:
    """Wait for enough of cAdvisor's samples of the cgroup's throttling for increase() over
    a minute (two housekeepings)."""
    labels = (f'namespace="{pod["metadata"]["namespace"]}",pod="{pod["metadata"]["name"]}",'
              f'container="{container}"')  # fmt: skip
    kube.until(f"cAdvisor's throttling of {container or 'the pod cgroup'} in Prometheus",
               lambda: query(url, f"increase(container_cpu_cfs_throttled_periods_total"
                                  f"{{{labels}}}[1m])"),
               lambda r: bool(r) and float(r[0]["value"][1]) > 0, timeout_s=90)  # fmt: skip


def test_recommend_runs_on_the_kubelets_own_cadvisor_series(
    kube: Kube, real_node: RealNode, control_plane: ControlPlane, prometheus: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    pod = _running(kube, real_node, "sized")
    ns = kube.namespace
    with PrometheusServer(prometheus, scrape="scrape_configs:\n"
                          + cadvisor_scrape(real_node)) as prom:  # fmt: skip
        throttled_in_prometheus(kube, prom.url, pod, "app")
        labels = query(prom.url, f'container_cpu_usage_seconds_total{{namespace="{ns}"}}')
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
        done = subprocess.run([
            str(UNTHROTTLE), "recommend", "--prometheus", prom.url,
            "--kubeconfig", str(kubeconfig), "--namespace", ns, "--window", "5m",
            "--format", "json",
        ], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the real label set: the pod cgroup and the pause container are container=""
    assert {r["metric"].get("container", "") for r in labels} == {"app", ""}, labels
    assert {"id", "image", "name"} <= set(
        next(r["metric"] for r in labels if r["metric"].get("container") == "app")
    ), labels
    result = json.loads(done.stdout)
    (workload,) = [w for w in result["workloads"] if w["deployment"] == "sized"]
    (container,) = workload["containers"]
    assert container["name"] == "app", workload
    assert container["current"]["limit_millicores"] == 500, container["current"]
    assert container["throttle_ratio"] > 0.05, container
    assert container["recommendation"]["limit_millicores"] > 500, container


def test_a_pod_level_limit_is_the_pod_cgroups_quota_and_recommend_sizes_the_pod(
    kube: Kube, real_node: RealNode, layout: Layout, prometheus: Path, tmp_path: Path,
) -> None:  # fmt: skip
    pod = _running(kube, real_node, "pooled", cpu_limit=None, cpu_request="250m",
                   pod_cpu_limit="500m")  # fmt: skip
    ns = kube.namespace
    own = _container_cgroup(real_node, layout, pod)
    pod_cgroup = Cgroup(layout, own.path.rsplit("/", 1)[0])
    # the kubelet (PodLevelResources, on since 1.34) writes the pod's limit on the pod
    # cgroup, and on the container's, which has none of its own, the same
    assert pod_cgroup.read_bandwidth().quota_us == 50_000
    assert own.read_bandwidth().quota_us == 50_000
    with PrometheusServer(prometheus, scrape="scrape_configs:\n"
                          + cadvisor_scrape(real_node)) as prom:  # fmt: skip
        throttled_in_prometheus(kube, prom.url, pod, "")  # the pod cgroup's
        done = subprocess.run([
            str(UNTHROTTLE), "recommend", "--prometheus", prom.url,
            "--kubeconfig", str(kube.kubeconfig(tmp_path / "kubeconfig")), "--namespace", ns,
            "--window", "5m", "--format", "json",
        ], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (workload,) = [w for w in json.loads(done.stdout)["workloads"] if w["name"] == "pooled"]
    (row,) = workload["containers"]  # the pod's: "app" has no limit of its own
    assert row["name"] == "(pod)", workload
    assert row["current"]["limit_millicores"] == 500, row["current"]
    assert row["throttle_ratio"] > 0.05, row
    assert row["recommendation"]["limit_millicores"] > 500, row
