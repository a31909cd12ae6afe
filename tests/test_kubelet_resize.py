"""The stand-in for the kubelet's part of in-place pod resize, against the real API server.

kwok makes pods Running but does nothing about a resize; :class:`ResizingKubelet` does what
kubelet v1.36 does (``pkg/kubelet/allocation``, ``status``, ``kuberuntime``). Each test rolls
out a one-replica Deployment with the real controllers and resizes its pod through the pod's
``resize`` subresource, as ``kubectl edit --subresource resize`` or the operator would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kube import JSON_PATCH, Kube, fresh_name
from unthrottle.devtools.kube import ResizingKubelet, fake_node
from unthrottle.devtools.kube.kubelet import Resize

Obj = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"
GUARANTEED = {"requests": {"cpu": "500m", "memory": "64Mi"},
              "limits": {"cpu": "500m", "memory": "64Mi"}}  # fmt: skip
BURSTABLE = {"requests": {"cpu": "250m", "memory": "64Mi"},
             "limits": {"cpu": "500m", "memory": "64Mi"}}  # fmt: skip


# -- helpers ----------------------------------------------------------------------------------


def deployment(kube: Kube, name: str, resources: Obj, *, node: str | None = None,
               resize_policy: list[Obj] | None = None) -> Obj:  # fmt: skip
    container: Obj = {"name": "app", "image": "registry.k8s.io/pause:3.10",
                      "resources": resources}  # fmt: skip
    if resize_policy is not None:
        container["resizePolicy"] = resize_policy
    spec: Obj = {"containers": [container]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": kube.namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }  # fmt: skip


def rolled_out_pod(kube: Kube, name: str, resources: Obj, **options: Any) -> Obj:
    """The pod of a new one-replica Deployment, once the real controllers rolled it out."""
    kube.create("apps/v1/deployments", deployment(kube, name, resources, **options))
    pods = kube.pods_of(kube.replicaset_of(kube.rolled_out(kube.namespace, name)))
    assert len(pods) == 1, pods
    return pods[0]


def read(kube: Kube, pod: Obj) -> Obj:
    found = kube.get("v1/pods", kube.namespace, pod["metadata"]["name"])
    assert found is not None, f"pod {pod['metadata']['name']} is gone"
    return found


def reported(kube: Kube, pod: Obj) -> Obj:
    """The pod once its containers' status reports their resources (what lets the API server
    accept a resize at all)."""
    return kube.until("resources in the container status", lambda: read(kube, pod),
                      lambda p: all("resources" in s for s in p["status"]["containerStatuses"]),
                      timeout_s=30)  # fmt: skip


def resize(kube: Kube, pod: Obj, resources: Obj, *, content_type: str = STRATEGIC,
           ) -> tuple[int, Any]:  # fmt: skip
    """PATCH the pod's ``resize`` subresource: container ``app`` asks for ``resources``."""
    if content_type == JSON_PATCH:
        body: Any = [{"op": "replace", "path": "/spec/containers/0/resources", "value": resources}]
    else:
        body = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
    path = f"/api/v1/namespaces/{kube.namespace}/pods/{pod['metadata']['name']}/resize"
    return kube.try_call("PATCH", path, body, content_type=content_type)


def resized(kube: Kube, pod: Obj, resources: Obj, **options: Any) -> Obj:
    status, body = resize(kube, pod, resources, **options)
    assert status == 200, body
    return dict(body)


def condition(pod: Obj, kind: str) -> Obj | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == kind), None)


def resize_conditions(pod: Obj) -> list[Obj]:
    return [c for c in pod["status"].get("conditions") or []
            if c["type"] in ("PodResizePending", "PodResizeInProgress")]  # fmt: skip


def container_status(pod: Obj) -> Obj:
    return dict(pod["status"]["containerStatuses"][0])


def finished(pod: Obj) -> bool:
    """Resize done as the upstream e2e suite decides it (podresize.WaitForPodResizeActuation):
    the kubelet observed the generation and no resize condition remains."""
    return (pod["status"].get("observedGeneration", 0) >= pod["metadata"]["generation"]
            and not resize_conditions(pod))  # fmt: skip


def until_condition(kube: Kube, pod: Obj, kind: str, reason: str | None) -> Obj:
    return kube.until(f"{kind} {reason}", lambda: read(kube, pod),
                      lambda p: (c := condition(p, kind)) is not None
                      and c.get("reason") == reason, timeout_s=30)  # fmt: skip


def until_finished(kube: Kube, pod: Obj) -> Obj:
    return kube.until("resize finished", lambda: read(kube, pod), finished, timeout_s=30)


class Calls:
    """What ``actuate`` was called with for the test's own pods (a stand-in acts on every pod
    of its nodes, pods of earlier tests' namespaces being deleted too); for those it raises
    while ``failing`` holds an error, and waits while ``hold`` is set."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.seen: list[tuple[str, str, Obj]] = []
        self.failing: Exception | None = None
        self.hold = threading.Event()
        self.entered = threading.Event()

    def __call__(self, pod: Obj, container: str, resources: Obj) -> None:
        if pod["metadata"]["namespace"] != self.namespace:
            return
        self.seen.append((pod["metadata"]["name"], container, resources))
        self.entered.set()
        while self.hold.is_set():
            threading.Event().wait(0.02)
        if self.failing is not None:
            raise self.failing


def ours(kube: Kube, stand_in: ResizingKubelet) -> list[Resize]:
    """What the stand-in did about the test's own pods."""
    return [r for r in stand_in.resizes() if r.namespace == kube.namespace]


@pytest.fixture
def calls(kube: Kube) -> Calls:
    return Calls(kube.namespace)


@pytest.fixture
def kubelet(kube: Kube, calls: Calls) -> Iterator[ResizingKubelet]:
    """The stand-in for every kwok node, recording its actuations in ``calls``."""
    with ResizingKubelet(kube.plane, actuate=calls) as stand_in:
        yield stand_in
    assert not stand_in_threads(), "the stand-in's thread outlived it"


@pytest.fixture
def standing_in(kube: Kube, calls: Calls) -> Iterator[Callable[..., ResizingKubelet]]:
    """Start the stand-in with other options (stopped after the test)."""
    started: list[ResizingKubelet] = []

    def start(**options: Any) -> ResizingKubelet:
        started.append(ResizingKubelet(kube.plane, actuate=calls, **options).start())
        return started[-1]

    yield start
    for stand_in in started:
        stand_in.stop()
    assert not stand_in_threads(), "the stand-in's thread outlived it"


def stand_in_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "resizing-kubelet"]


# -- what a running pod reports ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "allocated"),
    [(GUARANTEED, GUARANTEED["requests"]), (BURSTABLE, BURSTABLE["requests"]), ({}, None)],
    ids=["guaranteed", "burstable", "best-effort"],
)
def test_a_running_pod_reports_its_resources_and_keeps_them(
    kube: Kube, kubelet: ResizingKubelet, resources: Obj, allocated: Obj | None
) -> None:
    pod = reported(kube, rolled_out_pod(kube, "web", resources))
    status = container_status(pod)
    assert status["resources"] == resources
    assert status.get("allocatedResources") == allocated
    assert pod["status"]["observedGeneration"] == pod["metadata"]["generation"] == 1
    ready = condition(pod, "Ready")
    assert ready is not None and ready["observedGeneration"] == 1
    assert resize_conditions(pod) == []

    kubelet.sync()
    kubelet.sync()
    again = read(kube, pod)
    assert again["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"], (
        "the stand-in (or kwok) wrote the status again though nothing changed"
    )


# -- a resize that fits ------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [STRATEGIC, JSON_PATCH], ids=["strategic", "json-patch"])
def test_a_raised_cpu_limit_is_resized_in_place_and_reported_done(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls, content_type: str
) -> None:
    pod = reported(kube, rolled_out_pod(kube, "web", BURSTABLE))
    before = container_status(pod)
    wanted = {"requests": BURSTABLE["requests"], "limits": {"cpu": "1", "memory": "64Mi"}}

    answer = resized(kube, pod, wanted, content_type=content_type)
    assert answer["metadata"]["generation"] == 2
    done = until_finished(kube, pod)

    after = container_status(done)
    assert after["resources"] == wanted == done["spec"]["containers"][0]["resources"]
    assert after["allocatedResources"] == wanted["requests"]
    assert done["status"]["observedGeneration"] == 2
    assert done["metadata"]["uid"] == pod["metadata"]["uid"]
    assert (after["containerID"], after["restartCount"]) == (before["containerID"], 0)
    assert calls.seen == [(pod["metadata"]["name"], "app", wanted)]
    assert [(r.container, r.outcome, r.new, r.old) for r in ours(kube, kubelet)] == [
        ("app", "Done", wanted, BURSTABLE)
    ]


def test_while_it_actuates_the_pod_shows_the_resize_in_progress(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls
) -> None:
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED))
    wanted = {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    calls.hold.set()

    resized(kube, pod, wanted)
    assert calls.entered.wait(30), "actuate was not called"
    during = until_condition(kube, pod, "PodResizeInProgress", None)

    shown = condition(during, "PodResizeInProgress")
    assert shown is not None
    assert (shown["status"], shown.get("message"), shown["observedGeneration"]) == ("True", None, 2)
    assert container_status(during)["allocatedResources"] == wanted["requests"]
    assert container_status(during)["resources"] == GUARANTEED, "reported before actuation"
    assert during["status"]["allocatedResources"] == {"cpu": "1", "memory": "64Mi"}

    calls.hold.clear()
    assert container_status(until_finished(kube, pod))["resources"] == wanted


# -- what the API server refuses -----------------------------------------------------------------


def test_the_server_refuses_a_resize_that_would_change_the_qos_class(
    kube: Kube, kubelet: ResizingKubelet
) -> None:
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED))

    status, body = resize(kube, pod, {"limits": {"cpu": "1"}})

    assert status == 422, body
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        f'Pod "{pod["metadata"]["name"]}" is invalid: spec: Invalid value: "Guaranteed": '
        "Pod QOS Class may not change as a result of resizing"
    )
    assert read(kube, pod)["metadata"]["generation"] == 1


def test_the_server_refuses_a_resize_beyond_the_nodes_allocatable(
    kube: Kube, kubelet: ResizingKubelet
) -> None:
    """v1.36's PodResizeValidator admission plugin refuses it before any kubelet sees it: a
    kubelet never reports such a resize Infeasible (fixture nodes have 16 CPUs)."""
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED))

    status, body = resize(kube, pod, {"requests": {"cpu": "20", "memory": "64Mi"},
                                      "limits": {"cpu": "20", "memory": "64Mi"}})  # fmt: skip

    assert status == 403, body
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        f'pods "{pod["metadata"]["name"]}" is forbidden: node didn\'t have enough allocatable '
        "resources: cpu, requested: 20000, allocatable: 16000"
    )
    assert body["details"]["causes"] == [{"reason": "NodeCapacity"}]


def test_a_pod_on_a_node_it_does_not_stand_for_is_left_alone(
    kube: Kube, standing_in: Callable[..., ResizingKubelet], calls: Calls
) -> None:
    stand_in = standing_in(nodes=["kwok-node-1", "kwok-node-2"])
    pod = rolled_out_pod(kube, "web", BURSTABLE, node="kwok-node-0")
    stand_in.sync()

    untouched = read(kube, pod)
    assert "resources" not in container_status(untouched)
    assert "observedGeneration" not in untouched["status"]
    status, body = resize(kube, pod, {"limits": {"cpu": "1"}})
    assert status == 422, body
    assert "Pod running on node without support for resize" in body["message"]
    assert calls.seen == [] and ours(kube, stand_in) == []


# -- what the kubelet refuses or defers ----------------------------------------------------------


def test_a_static_cpu_manager_makes_a_guaranteed_pods_cpu_resize_infeasible(
    kube: Kube, standing_in: Callable[..., ResizingKubelet], calls: Calls
) -> None:
    stand_in = standing_in(cpu_manager_policy="static")
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED))
    wanted = {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}

    resized(kube, pod, wanted)
    refused = until_condition(kube, pod, "PodResizePending", "Infeasible")

    shown = condition(refused, "PodResizePending")
    assert shown is not None
    assert (shown["status"], shown["observedGeneration"]) == ("True", 2)
    assert shown["message"] == (
        'Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"'
    )
    assert refused["status"]["observedGeneration"] == 2
    assert container_status(refused)["resources"] == GUARANTEED
    assert condition(refused, "PodResizeInProgress") is None
    assert calls.seen == []
    assert [(r.outcome, r.new) for r in ours(kube, stand_in)] == [("Infeasible", wanted)]


@pytest.fixture
def small_node(kube: Kube) -> Iterator[str]:
    """An extra kwok node with 2 CPUs, deleted after the test."""
    name = fresh_name("kwok-small")
    kube.create("v1/nodes", fake_node(name, cpu="2"))
    yield name
    kube.delete("v1/nodes", None, name)


def test_a_resize_without_room_now_is_deferred_until_a_pod_leaves(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls, small_node: str
) -> None:
    filler = {"requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"}}
    rolled_out_pod(kube, "filler", filler, node=small_node)
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED, node=small_node))
    wanted = {"requests": {"cpu": "1500m", "memory": "64Mi"},
              "limits": {"cpu": "1500m", "memory": "64Mi"}}  # fmt: skip

    resized(kube, pod, wanted)
    waiting = until_condition(kube, pod, "PodResizePending", "Deferred")

    shown = condition(waiting, "PodResizePending")
    assert shown is not None
    assert shown["message"] == (
        "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
    )
    assert shown["observedGeneration"] == waiting["status"]["observedGeneration"] == 2
    assert container_status(waiting)["resources"] == GUARANTEED
    assert calls.seen == []

    kube.delete("apps/v1/deployments", kube.namespace, "filler")
    done = until_finished(kube, pod)

    assert container_status(done)["resources"] == wanted
    assert [r.outcome for r in ours(kube, kubelet)] == ["Deferred", "Done"]


def test_a_deferred_resize_taken_back_leaves_no_condition(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls, small_node: str
) -> None:
    rolled_out_pod(kube, "filler", {"requests": {"cpu": "1"}}, node=small_node)
    pod = reported(kube, rolled_out_pod(kube, "web", GUARANTEED, node=small_node))
    resized(kube, pod, {"requests": {"cpu": "1500m", "memory": "64Mi"},
                        "limits": {"cpu": "1500m", "memory": "64Mi"}})  # fmt: skip
    until_condition(kube, pod, "PodResizePending", "Deferred")

    resized(kube, pod, GUARANTEED)
    done = until_finished(kube, pod)

    assert done["status"]["observedGeneration"] == done["metadata"]["generation"] == 3
    assert container_status(done)["resources"] == GUARANTEED
    assert calls.seen == []
    assert [r.outcome for r in ours(kube, kubelet)] == ["Deferred"]


# -- actuation ---------------------------------------------------------------------------------


def test_a_failed_actuation_is_reported_as_an_error_and_retried(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls
) -> None:
    pod = reported(kube, rolled_out_pod(kube, "web", BURSTABLE))
    wanted = {"requests": BURSTABLE["requests"], "limits": {"cpu": "2", "memory": "64Mi"}}
    calls.failing = OSError("write /sys/fs/cgroup/cpu/cpu.cfs_quota_us: invalid argument")

    resized(kube, pod, wanted)
    failing = until_condition(kube, pod, "PodResizeInProgress", "Error")

    shown = condition(failing, "PodResizeInProgress")
    assert shown is not None
    assert shown["message"] == "write /sys/fs/cgroup/cpu/cpu.cfs_quota_us: invalid argument"
    assert (shown["status"], shown["observedGeneration"]) == ("True", 2)
    assert container_status(failing)["resources"] == BURSTABLE
    assert container_status(failing)["allocatedResources"] == wanted["requests"]

    calls.failing = None
    done = until_finished(kube, pod)
    assert container_status(done)["resources"] == wanted
    outcomes = [r.outcome for r in ours(kube, kubelet)]
    assert outcomes[0] == "Error" and outcomes[-1] == "Done", outcomes
    assert len(calls.seen) >= 2, "not retried"


def test_a_restart_container_policy_restarts_the_container_to_resize_it(
    kube: Kube, kubelet: ResizingKubelet, calls: Calls
) -> None:
    policy = [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]
    pod = reported(kube, rolled_out_pod(kube, "web", BURSTABLE, resize_policy=policy))
    before = container_status(pod)
    wanted = {"requests": BURSTABLE["requests"], "limits": {"cpu": "1", "memory": "64Mi"}}

    resized(kube, pod, wanted)
    done = until_finished(kube, pod)

    after = container_status(done)
    assert after["resources"] == wanted
    assert after["restartCount"] == 1
    assert after["containerID"] != before["containerID"]
    assert after["lastState"]["terminated"]["containerID"] == before["containerID"]
    assert "running" in after["state"]
    assert done["metadata"]["uid"] == pod["metadata"]["uid"]
    assert [r.outcome for r in ours(kube, kubelet)] == ["Restarted"]
    assert calls.seen == [(pod["metadata"]["name"], "app", wanted)]
