"""A kubelet CFS period other than 100 ms (``--cpu-cfs-quota-period``).

Where the node agent's series exist, each container is sized at the period its gauge
``unthrottle_cpu_cfs_period_seconds`` reports (a node's setting, so it may differ per
node: then the largest, with a warning); where only cAdvisor's counters exist, at
``--cfs-period`` (``recommend``) or the operator's own setting. Every recommendation says
which period it used and where it came from, and Apply writes bursts and quotas at it.

A real Prometheus serves the history, the real Kubernetes API server the Deployments (each
in a fresh namespace: ``fast`` below stands for ``fast-1a2b3c``); the workloads have the
same per-window demand and differ only in their nodes' period.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name
from prom import PrometheusServer, requires_prometheus
from shop import THROTTLED, Workload, deployment, openmetrics, rehash
from unthrottle.evidence.aggregates import _FORMAT as FORMAT
from unthrottle.evidence.aggregates import CheckpointError, WindowAggregates, sealed, unsealed
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.kube.deployments import KubeDeployments
from unthrottle.kube.objects import KubeObjects
from unthrottle.kube.patching import RECORD_ANNOTATION, ContainerChange, Record, plan
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.policy import parse_spec
from unthrottle.operator.apply import changes_for
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings
from unthrottle.recommend import Recommendation, Runtime
from unthrottle.scan import (
    ContainerResult,
    ProblemKind,
    ScanRequest,
    ScanResult,
    WorkloadResult,
    scan,
)
from unthrottle.scan.readers import IncrementalReader
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
HOUR = 3600

FAST = replace(THROTTLED, namespace="fast", cfs_periods=(0.05,))
"""checkout's demand (bursts to 1.2 cores in one window in ten, under 500m) on nodes whose
kubelets run a 50 ms period; its template asks for a burst of half the quota."""
SLOW = replace(THROTTLED, namespace="slow", cfs_periods=(0.1,))
"""The same demand at the default 100 ms, as the agent reports it."""
MIXED = replace(THROTTLED, namespace="mixed", pods=2, cfs_periods=(0.05, 0.1))
"""The same demand, one pod on a 50 ms node and one on a 100 ms node."""
STAGED = replace(FAST, namespace="stage")
"""FAST again, for Apply to patch."""
COARSE = Workload("coarse", "batch", 0.5, 0.0, 0.0, 1.0, 1)
"""cAdvisor only (series written by :func:`coarse_counters`), on 50 ms nodes, under 1 CPU."""
HALF_QUOTA = {"unthrottle.io/cpu-burst": "50%"}


def coarse_counters(coarse: Workload, end: int, span: int = 2 * HOUR) -> str:
    """A 50 ms node's cAdvisor counters for COARSE: 20 periods a second, 6 % of them
    throttled, 0.99 core used in each active period; no agent series at all."""
    (pod,) = coarse.pod_names()
    labels = f'namespace="{coarse.namespace}",pod="{pod}",container="app"'
    lines = []
    for metric, rate in (
        ("usage_seconds", 0.99),
        ("cfs_periods", 20.0),
        ("cfs_throttled_periods", 1.2),
        ("cfs_throttled_seconds", 0.03),
    ):
        lines += [f"container_cpu_{metric}_total{{{labels}}} {rate * (t - end + span):.10g} {t}"
                  for t in range(end - span, end + 1, 60)]  # fmt: skip
    return "\n".join(lines) + "\n"


def limits(w: Workload, end: int, span: int = 2 * HOUR) -> str:
    """kube-state-metrics' CPU limit of each pod (read in the same query as the periods)."""
    return "".join(
        f'kube_pod_container_resource_limits{{namespace="{w.namespace}",pod="{pod}",'
        f'container="{w.container}",resource="cpu",unit="core"}} {w.limit} {t}\n'
        for pod in w.pod_names()
        for t in range(end - span, end + 1, 60)
    )


def place(kube: Kube, w: Workload, template_annotations: dict[str, str]) -> Workload:
    """``w``'s Deployment, with these pod template annotations, created in a fresh namespace
    named after its own (its rollout is waited for by :func:`rehash`)."""
    w = replace(w, namespace=fresh_name(w.namespace))
    kube.create_namespace(w.namespace)
    obj = deployment(w)
    obj["spec"]["template"]["metadata"]["annotations"] = dict(template_annotations)
    kube.create("apps/v1/deployments", obj)
    return w


@dataclass
class World:
    kube: Kube
    source: PrometheusSource
    api: Any
    kubeconfig: Path
    end: int
    """Where the history ends: when the fixture was built, so that ``recommend``, which
    reads at the real time, still sees the agent's period gauge within Prometheus's 5
    minute lookback however late in a long suite this module runs."""
    ns: dict[str, str]
    """``fast``, ``slow``, ``mixed``, ``stage``, ``coarse`` → the namespace each landed in."""

    def store(self) -> KubeWorkloadStore:
        from kubernetes import client

        return KubeWorkloadStore(client.CoreV1Api(self.api), client.AppsV1Api(self.api))

    def scan(self, namespace: str, **changes: Any) -> ScanResult:
        request = ScanRequest(window_s=HOUR, now=self.end, namespaces=(self.ns[namespace],),
                              **changes)  # fmt: skip
        return scan(request, self.source, self.store())

    def reconciler(self, *, apply: bool = False, **settings: Any) -> Reconciler:
        config = replace(OperatorSettings(self.source.config), **settings)
        objects = KubeObjects(self.api)
        return Reconciler(config, metrics=self.source, workloads=self.store(), objects=objects,
                          evidence=IncrementalReader(self.source, objects),
                          deployments=KubeDeployments(self.api) if apply else None,
                          clock=lambda: self.end)  # fmt: skip

    def policy(self, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
        return self.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                           "kind": "ThrottlePolicy",
                                           "metadata": {"namespace": self.ns[namespace],
                                                        "name": name},
                                           "spec": {"window": "1h", **spec}})  # fmt: skip


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[World]:  # fmt: skip
    folder = tmp_path_factory.mktemp("period")
    kube = Kube(control_plane)
    made = [place(kube, w, HALF_QUOTA) for w in (FAST, SLOW, STAGED)]
    made += [place(kube, w, {}) for w in (MIXED, COARSE)]
    fast, slow, staged, mixed, coarse = (rehash(kube, w) for w in made)
    end = int(time.time()) // 60 * 60
    history = openmetrics([fast, slow, mixed, staged], end, span=2 * HOUR)
    history += coarse_counters(coarse, end) + limits(mixed, end)
    ns = {"fast": fast.namespace, "slow": slow.namespace, "mixed": mixed.namespace,
          "stage": staged.namespace, "coarse": coarse.namespace}  # fmt: skip
    with PrometheusServer(folder, openmetrics=history) as prom:
        kubeconfig = kube.kubeconfig(folder / "kubeconfig")
        yield World(kube, PrometheusSource(PrometheusConfig(prom.url, retries=0)),
                    kube.api_client(kubeconfig), kubeconfig, end, ns)  # fmt: skip
    for namespace in ns.values():
        kube.delete("v1/namespaces", None, namespace)


def only(result: ScanResult) -> ContainerResult:
    (workload,) = result.workloads
    (container,) = workload.containers
    return container


# --- where the node agent reports the period ------------------------------------------------


def test_at_a_50_ms_period_the_burst_is_sized_to_the_50_ms_quota(world: World) -> None:
    fast, slow = only(world.scan("fast")), only(world.scan("slow"))
    assert (fast.period_us, slow.period_us) == (50_000, 100_000)
    rec, at_100 = fast.recommendation, slow.recommendation
    assert rec is not None and at_100 is not None and rec.limit_millicores is not None
    assert rec.period_us == 50_000 and rec.quota_us == rec.limit_millicores * 50
    assert 0 < rec.burst_us <= rec.quota_us
    # the same demand per window: the same limit, but half the quota to burst from
    assert rec.limit_millicores == at_100.limit_millicores
    assert abs(2 * rec.burst_us - at_100.burst_us) <= 2_000
    # the 100 ms recommendation would be refused by the kernel on a 50 ms node
    assert at_100.burst_us > rec.quota_us
    assert rec.reasons[0] == "CFS period 50 ms, from the node agent"
    assert at_100.reasons[0] == "CFS period 100 ms, from the node agent"
    assert fast.to_json()["period_us"] == 50_000
    assert not world.scan("fast").problems


def test_a_burst_annotation_is_read_against_the_quota_at_the_nodes_period(world: World) -> None:
    # "50%" of 500m: 25 ms of a 50 ms period's 25 ms quota is 12.5 ms, not 100 ms's 25 ms
    assert only(world.scan("fast")).burst_us == 12_500
    assert only(world.scan("slow")).burst_us == 25_000


def test_pods_on_nodes_with_different_periods_are_sized_at_the_largest_and_said_so(
    world: World,
) -> None:
    result = world.scan("mixed")
    container = only(result)
    assert container.period_us == 100_000
    assert container.recommendation is not None
    assert container.recommendation.reasons[0] == (
        "CFS period 100 ms, the largest the node agent reports for its pods (50 ms, 100 ms)"
    )
    (problem,) = result.problems
    assert problem.kind == ProblemKind.MIXED_PERIODS
    assert f"{world.ns['mixed']}/checkout (50 ms, 100 ms)" in problem.message
    assert "largest" in problem.message


def test_the_period_rides_in_the_limits_query_so_the_batch_is_no_bigger(world: World) -> None:
    mixed = [world.ns["mixed"]]
    owners = world.store().pod_owners(mixed)
    before = world.source.queries
    found = fetch(world.source, mixed, HOUR, at=world.end, owners=owners)
    assert world.source.queries - before == 9  # with owners from the API, as ever
    assert [(i.agent_periods_us, i.limit_millicores) for i in found.values()] == [
        ({50_000, 100_000}, 500)]  # fmt: skip
    before = world.source.queries  # the operator's range queries: a period at every step
    slots = fetch_slots(
        world.source, mixed, world.end - HOUR, world.end, slot_s=1200, owners=owners
    )
    assert world.source.queries - before == 9
    assert [[i.agent_periods_us for i in s.evidence.values()] for s in slots] == [
        [{50_000, 100_000}]] * 3  # fmt: skip


# --- where only the counters are: the option -------------------------------------------------


def test_counters_alone_are_read_at_the_period_the_option_gives(world: World) -> None:
    at_50 = only(world.scan("coarse", cfs_period_us=50_000, cfs_period_from="--cfs-period"))
    default = only(world.scan("coarse"))
    assert at_50.evidence == "counters" and at_50.period_us == 50_000
    assert at_50.recommendation is not None and default.recommendation is not None
    # 0.99 core used per 50 ms period, + 10 % headroom: 1090m; read as 100 ms periods the
    # same counters say 0.495 core, and only the throttling's step (×1.06) is left
    assert at_50.recommendation.limit_millicores == 1090
    assert default.recommendation.limit_millicores == 1060
    assert at_50.recommendation.reasons[0] == (
        "CFS period 50 ms, from --cfs-period (no agent series)"
    )


def recommend(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(UNTHROTTLE), "recommend", "--prometheus", world.source.config.url,
                           "--kubeconfig", str(world.kubeconfig), "--window", "1h",
                           "--format", "json", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_recommend_says_the_period_and_where_it_came_from(world: World) -> None:
    out = recommend(world, "--namespace", world.ns["coarse"], "--cfs-period", "50ms")
    assert out.returncode == 0, out.stderr
    assert "at a CFS period of 50 ms (--cfs-period)" in out.stderr
    (c,) = json.loads(out.stdout)["workloads"][0]["containers"]
    assert c["period_us"] == 50_000 and c["recommendation"]["limit_millicores"] == 1090
    assert (
        c["recommendation"]["reasons"][0] == "CFS period 50 ms, from --cfs-period (no agent series)"
    )
    out = recommend(world, "--namespace", world.ns["fast"], "--cfs-period", "1s")  # the agent wins
    assert out.returncode == 0, out.stderr
    (c,) = json.loads(out.stdout)["workloads"][0]["containers"]
    assert c["period_us"] == 50_000
    assert c["recommendation"]["reasons"][0] == "CFS period 50 ms, from the node agent"


# --- the operator ------------------------------------------------------------------------------


def _report(world: World, namespace: str, name: str) -> dict[str, Any]:
    found = world.kube.get("v1/configmaps", world.ns[namespace], f"{name}-report")
    assert found is not None
    return dict(json.loads(found["data"]["report.json"]))


def test_the_operator_reads_counters_at_its_own_setting_and_the_agents_period_as_it_slides(
    world: World,
) -> None:
    reconciler = world.reconciler(cfs_period_us=50_000)
    reconciler.clock = lambda: world.end - 1200
    for namespace in ("coarse", "fast"):
        body = world.policy(namespace, "p")
        assert reconciler.reconcile(body).fault is None
    (c,) = _report(world, "coarse", "p")["workloads"][0]["containers"]
    assert c["period_us"] == 50_000 and c["recommendation"]["limit_millicores"] == 1090
    assert c["recommendation"]["reasons"][0] == (
        "CFS period 50 ms, from the operator's --cfs-period (no agent series)"
    )
    # later reconciles read only what is new (range queries), and keep the agent's period
    reconciler.clock = lambda: world.end
    body = world.kube.get(POLICIES, world.ns["fast"], "p")
    assert body is not None and reconciler.reconcile(body).fault is None
    assert "head" in [r.kind for r in reconciler.evidence.reads]  # type: ignore[attr-defined]
    (c,) = _report(world, "fast", "p")["workloads"][0]["containers"]
    assert c["period_us"] == 50_000
    assert c["recommendation"]["reasons"][0] == "CFS period 50 ms, from the node agent"


def test_apply_writes_a_burst_within_the_50_ms_quota_and_records_the_period(
    world: World,
) -> None:
    body = world.policy("stage", "apply", mode="Apply")
    assert world.reconciler(apply=True).reconcile(body).fault is None
    deploy = world.kube.get("apps/v1/deployments", world.ns["stage"], "checkout")
    assert deploy is not None
    record = Record.from_annotation(deploy["metadata"]["annotations"][RECORD_ANNOTATION])
    (change,) = record.containers
    assert change.period_us == 50_000 and change.after.cpu_limit is not None
    quota = change.after.cpu_limit * 50  # µs: what the kubelet writes at 50 ms
    assert 0 < change.after.burst_us <= quota == change.quota_us
    assert change.before.burst_us == 12_500  # "50%" of the old 25 ms quota
    written = deploy["spec"]["template"]["metadata"]["annotations"]["unthrottle.io/cpu-burst"]
    assert written == f"*=50%,app={change.after.burst_us // 1000}ms"  # the others' share kept


# --- the pieces, without servers ---------------------------------------------------------------


def _change(*, limit: int, burst_us: int, period_us: int) -> list[ContainerChange]:
    """Apply's change for checkout at today's 500m, recommended ``limit`` and burst at
    ``period_us`` (a recommendation made by hand: the engine never gives these)."""
    rec = Recommendation(limit_millicores=limit, burst_us=burst_us, period_us=period_us,
                         gomaxprocs=None, jvm_processors=None, expected_throttle_ratio=0.01,
                         current_throttle_ratio=0.1, confidence=1.0)  # fmt: skip
    container = ContainerResult("app", 500, 10, 0, None, Runtime.UNKNOWN, "period", 1, 0.1,
                                None, rec, period_us=period_us)  # fmt: skip
    workload = WorkloadResult("stage", "checkout", (container,))
    return changes_for(workload, deployment(STAGED), parse_spec({"mode": "Apply"}), None)


@pytest.mark.parametrize(
    ("limit", "burst_us", "period_us", "expected"),
    [
        (600, 45_000, 50_000, (600, 30_000)),
        (600, 45_000, 100_000, (600, 45_000)),
        (10, 0, 50_000, None),
        (10, 0, 100_000, (10, 0)),
    ],
    ids=["a 45 ms burst clamped to 600m's 30 ms quota at 50 ms", "kept at 100 ms",
         "10m is a 0.5 ms quota at 50 ms: no patch", "10m is the 1 ms minimum at 100 ms"],
)  # fmt: skip
def test_apply_holds_the_kernels_rules_at_the_containers_period(
    limit: int, burst_us: int, period_us: int, expected: tuple[int, int] | None
) -> None:
    changes = _change(limit=limit, burst_us=burst_us, period_us=period_us)
    assert [(c.after.cpu_limit, c.after.burst_us) for c in changes] == (
        [expected] if expected else [])  # fmt: skip
    assert all(c.period_us == period_us for c in changes)


def test_a_koordinator_share_is_of_the_quota_at_the_containers_period() -> None:
    raw = deployment(STAGED)
    raw["spec"]["template"]["metadata"]["annotations"] = {
        "koordinator.sh/cpuBurst": json.dumps({"policy": "none"})}  # fmt: skip
    (change,) = _change(limit=600, burst_us=15_000, period_us=50_000)
    record = plan(raw, [change], policy="p", policy_uid="u", policy_generation=1, now=0.0)
    assert record.burst_after is not None
    assert json.loads(record.burst_after)["cpuBurstPercent"] == 50  # 15 ms of 30 ms


T0 = 1_700_000_000
KEY = WorkloadKey("fast", "checkout", "app")


def _slot(start: int, periods: set[int], active: float = 600.0) -> Slot:
    item = ContainerEvidence(KEY, pods={"p"}, periods=active, limit_millicores=500,
                             agent_periods_us=periods)  # fmt: skip
    return Slot(start, start + 300, {KEY: item})


def test_the_operator_keeps_the_latest_period_through_slots_and_restarts() -> None:
    agg = WindowAggregates(3600, 600)
    agg.fold(_slot(T0, {100_000}))
    token = agg.version
    agg.fold(_slot(T0 + 300, {50_000}, active=0.0))  # idle, and moved to a 50 ms node
    assert KEY in agg.changed_since(token)  # the period alone: the engine runs again
    agg.fold(_slot(T0 + 600, set()))  # no gauge in this span: the last one stands
    assert agg.evidence(T0 + 900)[KEY].agent_periods_us == {50_000}
    back = WindowAggregates.from_bytes(agg.to_bytes())
    assert back == agg and back.evidence(T0 + 900)[KEY].agent_periods_us == {50_000}


def test_a_checkpoint_written_before_periods_were_kept_reads_back_without_them() -> None:
    agg = WindowAggregates(3600, 600)
    agg.fold(_slot(T0, {50_000}))
    body = zlib.decompress(unsealed(agg.to_bytes(), b"UNTHRAGG", FORMAT, "aggregates"))
    (length,) = struct.unpack_from(">I", body)
    head = json.loads(body[4 : 4 + length])
    del head["periods"]
    text = json.dumps(head, separators=(",", ":")).encode()
    old = struct.pack(">I", len(text)) + text + body[4 + length :]
    back = WindowAggregates.from_bytes(sealed(b"UNTHRAGG", FORMAT, zlib.compress(old)))
    assert back.evidence(T0 + 300)[KEY].agent_periods_us == set()


@pytest.mark.parametrize("old", [1, 2], ids=["before the wait column", "before the pod's"])
def test_a_checkpoint_from_before_a_column_is_refused_so_the_window_is_read_again(old: int) -> None:
    agg = WindowAggregates(3600, 600)
    agg.fold(_slot(T0, {50_000}))
    body = unsealed(agg.to_bytes(), b"UNTHRAGG", FORMAT, "aggregates")
    with pytest.raises(CheckpointError, match=f"checkpoint format {old}; this operator reads 3"):
        WindowAggregates.from_bytes(sealed(b"UNTHRAGG", old, body))
