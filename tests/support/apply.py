"""What test_apply.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import contextlib
import copy
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kube import JSON_PATCH, Kube
from kube_faults import FaultProxy
from prom import PrometheusServer
from shop import Workload, deploy, openmetrics, rehash
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.patching import RECORD_ANNOTATION, Record
from unthrottle.kube.pods import KubePods
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane

ROOT = Path(__file__).resolve().parents[1]
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
VPAS = "autoscaling.k8s.io/v1/verticalpodautoscalers"
HOUR = 3600
NOW = int(time.time()) // 60 * 60
T0 = NOW - 3 * HOUR
"""When the policy first reconciles (the test's clock): history before, series after."""

# Deployments in "stage", each throttled 10 % of periods under 500m before T0
BETTER = Workload("stage", "better", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "a"})
WORSE = Workload("stage", "worse", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "b"})
FAILS = Workload("stage", "fails", 0.1, 0.10, 1.2, 0.5, 2, {"app.kubernetes.io/part-of": "c"})
OTHER_NS = Workload(
    "elsewhere", "better", 0.1, 0.10, 1.2, 0.5, 1, {"app.kubernetes.io/part-of": "a"}
)
BEFORE = [BETTER, WORSE, FAILS, OTHER_NS]
# after the rollout (the new ReplicaSet's pods): better is not throttled any more, worse is more
HELPED = {"app": {"limit": 1.3}}
HURT = {"app": {"share": 0.4, "limit": 0.66}}

# a Deployment as users write them (tests/realistic.py): an app, a sidecar, an init container,
# shell `&&`, URLs with query strings, non-ASCII env and annotations; both containers throttled
REAL_APP = Workload("real", "checkout", 0.1, 0.10, 1.2, 0.5, 2, container="app")
REAL_SIDECAR = Workload("real", "checkout", 0.02, 0.10, 0.3, 0.1, 2, container="sidecar")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Metrics = Any
"""A PrometheusServer, or a VictoriaMetricsServer (tests/victoria.py): ``url``, ``with``."""


def restarted(prom: PrometheusServer, history: str) -> PrometheusServer:
    """``prom`` serving more history: Prometheus reads backfilled blocks when it starts, so
    it is stopped, promtool writes the new blocks into its TSDB, and it starts again on the
    same port (unless a test had stopped it: then it stays stopped, with the blocks)."""
    running = prom.proc is not None and prom.proc.poll() is None
    prom.__exit__(None, None, None)
    again = PrometheusServer(prom.folder, openmetrics=history, tsdb=prom.tsdb)
    again.port, again.url = prom.port, prom.url
    return again.__enter__() if running else again


class World:
    """The control plane, the recording proxy the reconciler talks through, the metrics
    server and a reconciler on the test's clock. ``stage`` is the policies' namespace;
    ``containers`` each Deployment's containers as its current ReplicaSet runs them."""

    def __init__(self, kube: Kube, proxy: FaultProxy, prom: Metrics, folder: Path,
                 placed: list[Workload], stage: str) -> None:  # fmt: skip
        self.kube, self.proxy, self.prom, self.stage = kube, proxy, prom, stage
        self.elsewhere = ""
        """A namespace whose Deployments no policy here may touch (the shop's)."""
        self.containers: dict[str, list[Workload]] = {}
        for w in placed:
            if w.namespace == stage:
                self.containers.setdefault(w.name, []).append(w)
        self.clock = Clock(T0)
        self.api = kube.api_client(proxy.kubeconfig(folder / "kubeconfig"))
        self.source = PrometheusSource(PrometheusConfig(prom.url, retries=0))
        from kubernetes import client

        self.reconciler = Reconciler(
            OperatorSettings(self.source.config), metrics=self.source,
            workloads=KubeWorkloadStore(client.CoreV1Api(self.api), client.AppsV1Api(self.api)),
            objects=KubeObjects(self.api), deployments=KubeDeployments(self.api),
            pods=KubePods(self.api), clock=self.clock,
        )  # fmt: skip

    def policy(self, name: str, part_of: str, **spec: Any) -> None:
        spec = {"mode": "Apply", "window": "2h",
                "selector": {"matchLabels": {"app.kubernetes.io/part-of": part_of}},
                "apply": {"verifyFor": "15m", "cooldown": "30m", **spec.pop("apply", {})},
                **spec}  # fmt: skip
        self.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                    "kind": "ThrottlePolicy",
                                    "metadata": {"namespace": self.stage, "name": name},
                                    "spec": spec})  # fmt: skip

    def reconcile(self, name: str) -> dict[str, Any]:
        body = self.kube.get(POLICIES, self.stage, name)
        assert body is not None
        outcome = self.reconciler.reconcile(body)
        assert outcome.fault is None, self.status(name)
        return self.status(name)

    def status(self, name: str) -> dict[str, Any]:
        return (self.kube.get(POLICIES, self.stage, name) or {}).get("status") or {}

    def deployment(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, namespace or self.stage, name)
        assert found is not None
        return found

    def edit(self, name: str, patch: Any, *, json_patch: bool = False) -> None:
        """Somebody (not unthrottle) edits a Deployment: a merge patch, or a JSON Patch;
        then the controller rolls the edit out, as it would long before a reconcile (a
        Deployment mid-rollout has its status rewritten at every pod it replaces, and a
        patch guarded by the resourceVersion read a moment before may meet one of them)."""
        kind = {"content_type": JSON_PATCH} if json_patch else {}
        self.kube.patch(DEPLOYMENTS, self.stage, name, patch, **kind)
        self.kube.rolled_out(self.stage, name)

    def roll_out(self, name: str, *, since: int = T0 + 120, **changes: dict[str, Any]) -> None:
        """Wait for the real controller's rollout of ``name``; then serve its new pods'
        history from ``since`` on, each container changed by ``changes[container]``."""
        olds = self.containers[name]
        news = [rehash(self.kube, w, **changes.get(w.container, {})) for w in olds]
        self.containers[name] = news
        self.add_history(openmetrics(news, NOW, span=NOW - since))

    def add_history(self, history: str) -> None:
        if isinstance(self.prom, PrometheusServer):
            self.prom = restarted(self.prom, history)
        else:  # VictoriaMetrics takes history through its import API while it runs
            self.prom.load(history)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1/events", self.stage)
                if e.get("involvedObject", {}).get("name") == name]  # fmt: skip


@contextlib.contextmanager
def running(folder: Path, kube: Kube, placed: list[Workload], stage: str,
            backend: Any) -> Iterator[World]:  # fmt: skip
    """A World over Deployments already on the control plane (``placed``, whose
    namespaces are deleted after), with their history up to T0 in ``backend``."""
    history = openmetrics(placed, T0, span=2 * HOUR)
    try:
        with FaultProxy(kube) as proxy, backend(folder, openmetrics=history) as prom:
            world = World(kube, proxy, prom, folder, placed, stage)
            try:
                yield world
            finally:
                world.prom.__exit__(None, None, None)  # the one running now
    finally:
        for namespace in {w.namespace for w in placed}:
            kube.delete("v1/namespaces", None, namespace)


@contextlib.contextmanager
def shop_world(folder: Path, plane: ControlPlane, backend: Any) -> Iterator[World]:
    """BEFORE's Deployments in two fresh namespaces (``stage`` and ``elsewhere``)."""
    kube = Kube(plane)
    placed = deploy(kube, BEFORE)
    with running(folder, kube, placed, placed[0].namespace, backend) as world:
        world.elsewhere = placed[-1].namespace
        yield world


def _state(status: dict[str, Any], deployment: str) -> tuple[str, str]:
    w = next(w for w in status["workloads"] if w["deployment"] == deployment)
    return w["state"], w["message"] or ""


def _limit(deployment: dict[str, Any], container: int = 0) -> int:
    spec = deployment["spec"]["template"]["spec"]
    return parse_cpu(spec["containers"][container]["resources"]["limits"]["cpu"])


def _limits(deployment: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: parse_cpu(c["resources"]["limits"]["cpu"])
            for c in deployment["spec"]["template"]["spec"]["containers"]}  # fmt: skip


def _hash(replicaset: dict[str, Any]) -> str:
    return str(replicaset["metadata"]["labels"]["pod-template-hash"])


def _record(deployment: dict[str, Any]) -> Record:
    return Record.from_annotation(deployment["metadata"]["annotations"][RECORD_ANNOTATION])


def _without(d: dict[str, Any], *paths: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(d)
    for path in paths:
        node = out
        for part in path[:-1]:
            node = node[part] if not isinstance(node, list) else node[int(part)]
        node.pop(path[-1], None)
    return out


def test_a_change_that_helped_is_applied_after_verification_and_cooldown_holds(
    world: World,
) -> None:
    world.policy("a", "a")
    world.reconcile("a")
    patched = _limit(world.deployment("better"))
    world.roll_out("better", **HELPED)
    world.clock.now = T0 + 300
    assert "verifying until" in _state(world.reconcile("a"), "better")[1]
    world.clock.now = T0 + 25 * 60  # verifyFor (15m) after the rollout was seen done
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Applied" and re.search(r"app 10 % → [01] % of periods throttled", message)
    record = _record(world.deployment("better"))
    assert record.verdict == "Applied" and record.ratio_after["app"] < 0.02
    # within the cooldown nothing is patched again, whatever is recommended
    world.proxy.clear_requests()
    world.clock.now = T0 + 28 * 60
    state, message = _state(world.reconcile("a"), "better")
    assert state == "Applied" and "cooldown until" in message
    assert world.proxy.requests("PATCH", "/deployments/") == []
    assert _limit(world.deployment("better")) == patched


def test_a_regression_after_verification_is_rolled_back_to_the_recorded_values(
    world: World,
) -> None:
    original = world.deployment("worse")
    first = _hash(world.kube.replicaset_of(original))
    world.policy("b", "b")
    world.reconcile("b")
    assert _limit(world.deployment("worse")) > 500
    world.roll_out("worse", **HURT)
    world.clock.now = T0 + 300
    world.reconcile("b")
    world.clock.now = T0 + 25 * 60
    state, message = _state(world.reconcile("b"), "worse")
    assert state == "RolledBack" and "got worse" in message, message
    rolled = world.deployment("worse")
    assert _limit(rolled) == 500
    assert rolled["spec"]["template"] == original["spec"]["template"]  # byte for byte
    record = _record(rolled)
    assert record.verdict == "RolledBack"
    assert any(
        e["reason"] == "RolledBack" and e["type"] == "Warning" for e in world.events("worse")
    )
    # the real controller goes back to the original ReplicaSet
    assert _hash(world.kube.replicaset_of(world.kube.rolled_out(world.stage, "worse"))) == first
    # not tried again until the policy or the Deployment changes
    world.proxy.clear_requests()
    world.clock.now = T0 + 90 * 60
    assert _state(world.reconcile("b"), "worse")[0] == "RolledBack"
    assert world.proxy.requests("PATCH", "/deployments/") == []


def test_prometheus_away_mid_verify_gives_no_verdict_and_no_patch(world: World) -> None:
    world.policy("b", "b")
    world.reconcile("b")
    world.roll_out("worse", **HURT)
    world.clock.now = T0 + 300
    world.reconcile("b")
    patched = world.deployment("worse")
    world.prom.__exit__(None, None, None)
    world.clock.now = T0 + 25 * 60
    body = world.kube.get(POLICIES, world.stage, "b")
    assert body is not None
    world.proxy.clear_requests()
    assert world.reconciler.reconcile(body).fault == "PrometheusUnavailable"
    assert world.proxy.requests("PATCH", "/deployments/") == []
    now = world.deployment("worse")
    assert now["spec"] == patched["spec"]  # no verdict, no rollback
    assert now["metadata"]["generation"] == patched["metadata"]["generation"]
    assert now["metadata"]["annotations"] == patched["metadata"]["annotations"]
    assert _record(now).verdict is None
    port = world.prom.port
    world.prom.port, world.prom.url = port, f"http://127.0.0.1:{port}"
    world.prom.__enter__()
    assert _state(world.reconcile("b"), "worse")[0] == "RolledBack"  # back: the verdict


# -- what the old emulator never showed: real Deployments, scale to zero, two policies -------
