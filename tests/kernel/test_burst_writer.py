"""The burst writer on real cgroups: what the kernel reports is what the annotations ask,
never above the quota, undone when asked, and held back while the node is busy (root only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from helpers import CgroupTree, kubepods_levels
from unthrottle.agent.burst import BurstScope, BurstWriter
from unthrottle.agent.discovery import Found, discover_kubepods
from unthrottle.agent.naming import PodInfo, name_cgroups
from unthrottle.cgroups import Cgroup, Layout

pytestmark = pytest.mark.kernel
UID = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f"
API, ENVOY, API2 = "a" * 64, "b" * 64, "c" * 64


@dataclass
class NodeCpu:
    """A node whose CPU usage the test sets (behind the writer's narrow interface)."""

    share: float = 0.1

    def usage(self) -> float:
        return self.share


class Node(CgroupTree):
    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.root = f"unthrottle-test-burst-{os.getpid()}"
        *parents, self.pod = kubepods_levels(self.root, UID)
        for path in parents:
            self.make(path)
        self.make(self.pod, 60_000)

    def container(self, cid: str, quota: int) -> Cgroup:
        return self.make(f"{self.pod}/{cid}", quota)

    def found(self, pods: list[PodInfo]) -> list[Found]:
        return name_cgroups(discover_kubepods(self.layout, self.root), pods)

    def burst(self, path: str) -> int:
        return Cgroup(self.layout, path).read_bandwidth().burst_us


@pytest.fixture
def node(layout: Layout) -> Iterator[Node]:
    n = Node(layout)
    try:
        yield n
    finally:
        n.cleanup()


def pods(annotations: dict[str, str], containers: dict[str, str]) -> list[PodInfo]:
    return [PodInfo("shop", "api-1", UID, containers, annotations)]


def test_annotated_bursts_reach_the_kernel_clamped_to_each_quota(node: Node) -> None:
    api, envoy = node.container(API, 30_000), node.container(ENVOY, 20_000)
    writer = BurstWriter(node.layout, NodeCpu())
    current = pods({"unthrottle.io/cpu-burst": "api=40ms,envoy=5ms"},
                   {API: "api", ENVOY: "envoy"})  # fmt: skip
    writer.apply(node.found(current), current)
    assert node.burst(api.path) == 30_000  # asked 40 ms, clamped to the 30 ms quota, no EINVAL
    assert node.burst(envoy.path) == 5_000
    assert node.burst(node.pod) == 35_000  # the containers' sum, within the pod's 60 ms quota
    assert writer.clamped_total == 1
    assert "unthrottle_agent_burst_clamped_total 1" in writer.metrics()


def test_koordinators_percentages_are_honoured_where_told_no_koordlet_runs(node: Node) -> None:
    api, envoy = node.container(API, 30_000), node.container(ENVOY, 20_000)
    writer = BurstWriter(node.layout, NodeCpu(), scope=BurstScope(koordinator=True))
    current = pods({"koordinator.sh/cpuBurst": '{"policy": "auto", "cpuBurstPercent": 50}'},
                   {API: "api", ENVOY: "envoy"})  # fmt: skip
    writer.apply(node.found(current), current)
    assert (node.burst(api.path), node.burst(envoy.path), node.burst(node.pod)) == (
        15_000, 10_000, 25_000)  # fmt: skip


def test_removing_the_annotation_takes_the_burst_back(node: Node) -> None:
    api = node.container(API, 30_000)
    writer = BurstWriter(node.layout, NodeCpu())
    asked = pods({"unthrottle.io/cpu-burst": "10ms"}, {API: "api"})
    writer.apply(node.found(asked), asked)
    assert node.burst(api.path) == 10_000
    plain = pods({}, {API: "api"})
    writer.apply(node.found(plain), plain)
    assert node.burst(api.path) == 0 and node.burst(node.pod) == 0
    assert writer.granted == {}


def test_a_stopping_agent_sets_every_burst_it_wrote_back_and_writes_no_more(node: Node) -> None:
    api, envoy = node.container(API, 30_000), node.container(ENVOY, 20_000)
    writer = BurstWriter(node.layout, NodeCpu())
    asked = pods({"unthrottle.io/cpu-burst": "api=10ms"}, {API: "api", ENVOY: "envoy"})
    envoy.write_burst(7_000)  # somebody else's burst: not ours to undo
    writer.apply(node.found(asked), asked)
    assert (node.burst(api.path), node.burst(node.pod)) == (10_000, 10_000)
    assert writer.release() == 2  # the container's and the pod's
    assert (node.burst(api.path), node.burst(node.pod), node.burst(envoy.path)) == (0, 0, 7_000)
    writer.apply(node.found(asked), asked)  # a discovery still running at exit
    assert node.burst(api.path) == 0


def test_a_restarted_container_gets_its_burst_again(node: Node) -> None:
    first = node.container(API, 30_000)
    writer = BurstWriter(node.layout, NodeCpu())
    asked = pods({"unthrottle.io/cpu-burst": "10ms"}, {API: "api"})
    writer.apply(node.found(asked), asked)
    node.remove(first)  # the container restarts: a new ID, a new cgroup
    second = node.container(API2, 30_000)
    again = pods({"unthrottle.io/cpu-burst": "10ms"}, {API2: "api"})
    writer.apply(node.found(again), again)
    assert node.burst(second.path) == 10_000
    assert first.path not in writer.granted


def test_a_busy_node_grants_no_burst_until_it_calms_down(node: Node) -> None:
    api = node.container(API, 30_000)
    cpu = NodeCpu(share=0.9)
    writer = BurstWriter(node.layout, cpu, threshold=0.5)
    asked = pods({"unthrottle.io/cpu-burst": "10ms"}, {API: "api"})
    writer.apply(node.found(asked), asked)
    assert node.burst(api.path) == 0 and writer.suspended
    assert "unthrottle_agent_burst_suspended 1" in writer.metrics()
    cpu.share = 0.2
    writer.apply(node.found(asked), asked)
    assert node.burst(api.path) == 10_000 and not writer.suspended
    cpu.share = 0.95
    writer.apply(node.found(asked), asked)
    assert node.burst(api.path) == 0


def test_a_bad_annotation_changes_nothing_and_is_logged_once(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    api = node.container(API, 30_000)
    writer = BurstWriter(node.layout, NodeCpu())
    bad = pods({"unthrottle.io/cpu-burst": "lots"}, {API: "api"})
    for _ in range(3):
        writer.apply(node.found(bad), bad)
    assert node.burst(api.path) == 0
    assert sum("cpu-burst" in r.getMessage() for r in caplog.records) == 1


def test_what_was_said_about_pods_and_containers_that_are_gone_is_forgotten(node: Node) -> None:
    writer = BurstWriter(node.layout, NodeCpu())
    previous = None
    for round_ in range(12):  # a container restarts again and again, its burst clamped
        cid = f"{round_:02d}" + "e" * 62
        container = node.container(cid, 30_000)
        if previous is not None:
            node.remove(previous)
        previous = container
        current = pods({"unthrottle.io/cpu-burst": "40ms"}, {cid: "api"})
        writer.apply(node.found(current), current)
        assert node.burst(container.path) == 30_000
    assert writer.clamped_total == 12
    assert writer.remembered == 1  # the live container's clamp, not every one it ever had
    bad = pods({"unthrottle.io/cpu-burst": "lots"}, {cid: "api"})
    writer.apply(node.found(bad), bad)
    assert writer.remembered == 2  # and the bad annotation of the pod, still there
    writer.apply(node.found([]), [])  # the pod is gone
    assert writer.remembered == 0


KOORDINATOR = {"koordinator.sh/cpuBurst": '{"policy": "auto", "cpuBurstPercent": 50}'}


@pytest.mark.parametrize(
    ("annotations", "scope", "why"),
    [
        ({"unthrottle.io/cpu-burst": "10ms"}, BurstScope(frozenset({"pay"})),
         "namespace shop is not among the agent's burst namespaces (pay)"),
        (KOORDINATOR, BurstScope(), "it carries koordinator.sh/cpuBurst"),
        ({**KOORDINATOR, "unthrottle.io/cpu-burst": "10ms"}, BurstScope(),
         "it carries koordinator.sh/cpuBurst"),
    ],
    ids=["namespace-not-allowed", "koordinators-pod", "koordinators-pod-with-ours-too"],
)  # fmt: skip
def test_a_pod_outside_the_scope_is_never_written_and_is_named_once(
    node: Node, caplog: pytest.LogCaptureFixture, annotations: dict[str, str],
    scope: BurstScope, why: str,
) -> None:  # fmt: skip
    """The write path's allowlist: another namespace's pod, or a pod that Koordinator's
    koordlet serves, keeps the burst it has (here 3 ms, as another writer left it)."""
    api = node.container(API, 30_000)
    Cgroup(node.layout, api.path).write_burst(3_000)
    writer = BurstWriter(node.layout, NodeCpu(), scope=scope)
    current = pods(annotations, {API: "api"})
    for _ in range(3):
        writer.apply(node.found(current), current)
    assert node.burst(api.path) == 3_000 and node.burst(node.pod) == 0
    assert writer.granted == {}
    said = [r.getMessage() for r in caplog.records if "api-1" in r.getMessage()]
    assert len(said) == 1 and why in said[0], said


@pytest.mark.parametrize(
    ("namespace", "scope", "written"),
    [
        ("shop", BurstScope(frozenset({"shop", "pay"})), True),
        ("shop", BurstScope(frozenset({"*"})), True),
        ("kube-system", BurstScope(frozenset({"*"})), False),
        ("kube-system", BurstScope(frozenset({"*", "kube-system"})), True),
    ],
    ids=["named", "every-namespace", "star-leaves-kube-system-out", "kube-system-named"],
)  # fmt: skip
def test_the_allowlist_names_namespaces_and_star_never_covers_kube_system(
    node: Node, namespace: str, scope: BurstScope, written: bool
) -> None:
    api = node.container(API, 30_000)
    writer = BurstWriter(node.layout, NodeCpu(), scope=scope)
    current = [PodInfo(namespace, "api-1", UID, {API: "api"},
                       {"unthrottle.io/cpu-burst": "10ms"})]  # fmt: skip
    writer.apply(node.found(current), current)
    assert node.burst(api.path) == (10_000 if written else 0)
