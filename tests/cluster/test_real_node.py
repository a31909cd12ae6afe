"""The real node: a scenario runs as a pod that a real kubelet, containerd and runc made, in
the kubelet's own cgroups, and what unthrottle reads off a node — the cgroups the agent
finds, their counters, cAdvisor's series, an in-place resize's quota — comes from them.

One node for the session (``real_node`` in conftest), tainted so that only these pods
land on it; each test a namespace and a Deployment of the workload image.
"""

from __future__ import annotations

import re
import ssl
import time
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from support.real_node import (
    STRATEGIC,
    _container_cgroup,
    _running,
    _scrape,
)
from unthrottle.agent.discovery import discover_kubepods
from unthrottle.cgroups import Cgroup, Layout
from unthrottle_lab.kube import RealNode

pytestmark = pytest.mark.kernel


def test_a_scenario_runs_as_a_pod_throttled_in_the_kubelets_cgroups(
    kube: Kube, real_node: RealNode, layout: Layout
) -> None:
    pod = _running(kube, real_node, "batch")
    container = _container_cgroup(real_node, layout, pod)
    assert container.cpu_dir.is_dir(), f"no cgroup {container.cpu_dir}"
    assert container.read_bandwidth().quota_us == 50_000  # 500m, on the 100 ms period
    # The pod cgroup has a quota of its own, the sum of its containers' limits.
    pod_cgroup = Cgroup(layout, container.path.rsplit("/", 1)[0])
    assert pod_cgroup.read_bandwidth().quota_us == 50_000
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                for pid in (container.cpu_dir / "cgroup.procs").read_text().split()]  # fmt: skip
    assert any(b"lab workload" in c for c in commands), commands
    before = container.read_stat()
    time.sleep(3)
    after = container.read_stat()
    # Two 60 ms tasks at once under a 50 ms quota: most busy periods throttle.
    assert after.nr_throttled - before.nr_throttled >= 5, (before, after)
    assert after.usage_us - before.usage_us <= 3 * 50_000 * 10 + 100_000  # no more than 0.5 CPU


def test_the_agent_names_the_kubelets_pods_and_containers(
    kube: Kube, real_node: RealNode, layout: Layout
) -> None:
    pod = _running(kube, real_node, "named")
    found = discover_kubepods(layout, real_node.cgroup_parent)
    uid = pod["metadata"]["uid"]
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    mine = {ident.container_id: ident for _, ident in found if ident.pod_uid == uid}
    assert None in mine, "the pod-level cgroup"
    assert cid in mine and mine[cid].qos == "burstable", mine
    # The pause container has a cgroup too, and is no container of the pod's spec.
    assert len(mine) == 3, sorted(map(str, mine))


def test_cadvisor_exports_the_throttling_with_the_pods_labels_to_allowed_callers(
    kube: Kube, real_node: RealNode, control_plane: Any
) -> None:
    pod = _running(kube, real_node, "scraped")
    name, ns = pod["metadata"]["name"], kube.namespace

    def series(text: str, container: str) -> float:
        pattern = (rf'^container_cpu_cfs_throttled_periods_total\{{[^}}]*container="{container}"'
                   rf'[^}}]*namespace="{ns}"[^}}]*pod="{name}"[^}}]*\}} (\S+)')  # fmt: skip
        found = re.search(pattern, text, re.M)
        return float(found.group(1)) if found else -1.0

    text = kube.until("cAdvisor's throttled periods for the container and the pod",
                      lambda: _scrape(real_node)[1],
                      lambda t: series(t, "app") > 0 and series(t, "") >= 0,
                      timeout_s=60)  # fmt: skip
    assert series(text, "app") > 0
    # No certificate: the kubelet refuses (webhook authentication, anonymous off).
    anonymous = ssl.create_default_context(cafile=str(control_plane.pki.ca))
    assert _scrape(real_node, anonymous)[0] == 401


def test_an_in_place_resize_is_written_into_both_quotas_by_the_kubelet(
    kube: Kube, real_node: RealNode, layout: Layout
) -> None:
    pod = _running(kube, real_node, "resized")
    container = _container_cgroup(real_node, layout, pod)
    pod_cgroup = Cgroup(layout, container.path.rsplit("/", 1)[0])
    name = pod["metadata"]["name"]
    kube.patch("v1/pods", kube.namespace, name, {"spec": {"containers": [
        {"name": "app", "resources": {"limits": {"cpu": "1"}}}]}}, sub="resize",
        content_type=STRATEGIC)  # fmt: skip
    kube.until("the new quota in the container's cgroup",
               lambda: (container.read_bandwidth().quota_us,
                        pod_cgroup.read_bandwidth().quota_us),
               lambda q: q == (100_000, 100_000), timeout_s=60)  # fmt: skip
    after = kube.until(
        "the resize reported done",
        lambda: kube.get("v1/pods", kube.namespace, name),
        lambda p: p["status"]["containerStatuses"][0]["resources"]["limits"]["cpu"] == "1"
        and not [c for c in p["status"].get("conditions") or []
                 if c["type"] in {"PodResizePending", "PodResizeInProgress"}],
        timeout_s=60,
    )  # fmt: skip
    assert after is not None and after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_a_quota_below_the_burst_is_refused_by_the_runtime_and_reported(
    kube: Kube, real_node: RealNode, layout: Layout
) -> None:
    """What the stand-in kubelet hid: the kernel refuses a quota below the burst, and the
    real kubelet says so as PodResizeInProgress reason Error (and retries)."""
    pod = _running(kube, real_node, "burst")
    container = _container_cgroup(real_node, layout, pod)
    (container.cpu_dir / "cpu.cfs_burst_us").write_text("40000\n")  # as the agent would
    name = pod["metadata"]["name"]
    kube.patch("v1/pods", kube.namespace, name, {"spec": {"containers": [
        {"name": "app", "resources": {"limits": {"cpu": "300m"}}}]}}, sub="resize",
        content_type=STRATEGIC)  # fmt: skip

    def error(p: dict[str, Any] | None) -> bool:
        assert p is not None
        return any(c["type"] == "PodResizeInProgress" and c.get("reason") == "Error"
                   for c in p["status"].get("conditions") or [])  # fmt: skip

    found = kube.until("the resize's Error", lambda: kube.get("v1/pods", kube.namespace, name),
                       error, timeout_s=60)  # fmt: skip
    assert found is not None
    message = next(c.get("message", "") for c in found["status"]["conditions"]
                   if c["type"] == "PodResizeInProgress")  # fmt: skip
    assert "cfs_quota_us" in message or "invalid argument" in message, message
    assert container.read_bandwidth().quota_us == 50_000  # the old quota stays


def test_a_second_node_is_refused_and_leaves_the_running_one_alone(
    real_node: RealNode, control_plane: Any, tmp_path: Path
) -> None:
    from unthrottle_lab.kube import StartError

    with pytest.raises(StartError, match="another real node runs on this machine"):
        RealNode(control_plane, tmp_path / "second").start()
    assert (real_node.cgroup_root / "kubepods").is_dir()
    assert not real_node.exited()
    assert "container_cpu_usage_seconds_total" in real_node.scrape("/metrics/cadvisor")
