"""Apply in place against a rollout: how soon every pod runs under the new CPU quota, how many
pods restart, and what the operator asks of the API server (docs/benchmarks.md §13).

    .venv/bin/python bench/inplace.py [--repeats 3] [--quick] [--save bench/results/inplace.json]

The real control plane and the real node (``unthrottle_lab.kube``: kubelet, containerd,
runc; started once, ended by PID; one real node per machine, so run it under the heavy
lock), a fresh namespace per run with throttled Deployments (``tests/shop.py``) whose pods
run the workload image on the real node (an idle scenario: 2 % of a core each), a real
Prometheus with their history, and the operator's
:class:`~unthrottle.operator.reconcile.Reconciler` (``tests/support/apply.py``'s ``World``)
on a clock the script moves, talking to the API server through the recording proxy of
``tests/kube_faults.py``. The real kubelet admits, actuates and reports every resize, and
makes every new pod of a rollout.

The operator's cadence is its own: after each reconcile the script waits what the reconcile
asked (``Outcome.next_in_s``) in wall time when that is short (≤ 10 s: a resize waiting for
its kubelet), and moves the clock instead when it is long (``verifyFor``, the policy's
``interval``), after waiting for what runs in real time (a rollout) to finish.
Times "equivalent" add the clock's jumps to the wall time: what a user would wait.

End points of "the new quota is in the cgroup" of a pod:

- **InPlace**: the container's ``cpu.cfs_quota_us`` (``cpu.max``) read every 10 ms by this
  script: the first read at the new quota (the kubelet's runtime call wrote it);
- **Rollout**: a new pod's container gets its cgroup, at the new quota, when the kubelet
  creates it, before the pod runs; the end point is the pod ``Running`` and ``Ready`` on a
  watch (its container started, its process running).

Each pod requests 20m of CPU (the shop's 250m would not fit 20 pods and a rollout's surge
on a 2-CPU node); its limit is the shop's 500m, raised to 690m by the change.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from kube import Kube, api_requests, fresh_name  # noqa: E402
from kube_faults import FaultProxy  # noqa: E402
from shop import Workload, deployment, openmetrics  # noqa: E402
from support.apply import World  # noqa: E402
from unthrottle.cgroups import Cgroup, CgroupError, Layout, detect_layout  # noqa: E402
from unthrottle.kube.patching import Record, record_of  # noqa: E402
from unthrottle.units import parse_cpu  # noqa: E402
from unthrottle_lab.kube import (  # noqa: E402
    REAL_NODE_TAINT,
    ControlPlane,
    RealNode,
    ensure_built,
)
from unthrottle_lab.prometheus import PrometheusServer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "inplace.json"
HOUR = 3600
NOW = int(time.time()) // 60 * 60
T0 = NOW - 3 * HOUR
"""The clock at the first reconcile: the history ends here, the canary's own series start."""
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
PART_OF = {"app.kubernetes.io/part-of": "bench"}
VERIFY_FOR = "1m"  # the least a policy may say
HELPED = {"limit": 1.3}
"""The counters after the change: the bursts fit (so the canary and the rollout pass)."""
SLEEP_CAP_S = 10.0
"""A wait the operator asks for up to this long is slept; a longer one moves the clock."""
MAX_TICKS, MAX_WALL_S = 150, 900.0
Pods = dict[str, dict[str, Any]]
"""Pods by name."""


@dataclass(frozen=True)
class Scenario:
    deployments: int
    pods: int
    method: str
    max_concurrent: int

    @property
    def key(self) -> str:
        return f"{self.deployments}x{self.pods} {self.method} maxConcurrent={self.max_concurrent}"


SCENARIOS = [
    Scenario(3, 4, "Rollout", 4), Scenario(3, 4, "Rollout", 1),
    Scenario(3, 4, "InPlace", 1), Scenario(3, 4, "InPlace", 4),
    Scenario(1, 20, "Rollout", 1), Scenario(1, 20, "InPlace", 1), Scenario(1, 20, "InPlace", 4),
]  # fmt: skip


class BenchError(RuntimeError):
    """A run that did not reach a verdict for every Deployment."""


# -- what the script watches ------------------------------------------------------------------


class TimedProxy(FaultProxy):
    """The recording proxy, with the time each request arrived (monotonic)."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube)
        self.times: list[tuple[float, str, str]] = []

    async def _handle(self, request: Any) -> Any:
        self.times.append((time.monotonic(), request.method, request.path))
        return await super()._handle(request)


class CgroupWatch:
    """Each pod's container cgroup read every 10 ms from a thread: when its CFS quota first
    changed, and to what: (time, pod, uid, container, CPU limit in m, from the quota)."""

    EVERY_S = 0.01

    def __init__(self, layout: Layout, node: RealNode, pods: Pods) -> None:
        self.seen: list[tuple[float, str, str, str, int | None]] = []
        self._cgroups = {name: (p["metadata"]["uid"], _cgroup(layout, node, p))
                         for name, p in pods.items()}  # fmt: skip
        self._first = {name: cg.read_bandwidth().quota_us for name, (_, cg) in
                       self._cgroups.items()}  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="cgroup-watch", daemon=True)

    def __enter__(self) -> CgroupWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _read(self) -> None:
        last = dict(self._first)
        while not self._stop.wait(self.EVERY_S):
            for name, (uid, cgroup) in self._cgroups.items():
                try:
                    quota = cgroup.read_bandwidth().quota_us
                except (OSError, CgroupError):  # the pod is gone (a rollout replaced it)
                    continue
                if quota != last[name]:
                    last[name] = quota
                    period = cgroup.read_bandwidth().period_us
                    limit = None if quota is None else quota * 1000 // period
                    self.seen.append((time.monotonic(), name, uid, "app", limit))


def _cgroup(layout: Layout, node: RealNode, pod: dict[str, Any]) -> Cgroup:
    """The cgroup the kubelet made for the pod's container (cgroupfs driver)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    qos = pod["status"]["qosClass"].lower()
    tier = "" if qos == "guaranteed" else f"/{qos}"
    return Cgroup(layout, f"{node.cgroup_parent}/kubepods{tier}/"
                          f"pod{pod['metadata']['uid']}/{cid}")  # fmt: skip


@dataclass
class PodSeen:
    name: str
    app: str
    ready_at: float | None = None
    deleted_at: float | None = None


class PodWatch:
    """A watch of one namespace's pods from the admin (not through the proxy): when each pod
    first shows ``Running`` and ``Ready``, and when it is gone."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.pods: dict[str, PodSeen] = {}
        self._sock: socket.socket | None = None
        self._conn: http.client.HTTPSConnection | None = None
        self._thread = threading.Thread(target=self._read, name="pod-watch", daemon=True)

    def __enter__(self) -> PodWatch:
        status, listed = self.plane.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")
        assert status == 200, listed
        for pod in listed["items"]:
            self._saw("ADDED", pod, None)
        url = urlsplit(self.plane.server)
        tls = ssl.create_default_context(cafile=str(self.plane.pki.ca))
        tls.load_cert_chain(*map(str, self.plane.pki.admin))
        self._conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=tls)
        rv = listed["metadata"]["resourceVersion"]
        query = f"watch=1&resourceVersion={rv}&timeoutSeconds={int(MAX_WALL_S) + 600}"
        self._conn.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?{query}")
        self._sock = self._conn.sock
        self._response = self._conn.getresponse()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        if self._conn is not None:
            self._conn.close()

    def _read(self) -> None:
        try:
            for line in iter(self._response.readline, b""):
                if line.strip():
                    event = json.loads(line)
                    self._saw(event["type"], event["object"], time.monotonic())
        except (OSError, ValueError, http.client.HTTPException):
            return  # ended by __exit__

    def _saw(self, kind: str, pod: dict[str, Any], at: float | None) -> None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if "uid" not in meta:
            return
        seen = self.pods.setdefault(
            meta["uid"], PodSeen(meta["name"], (meta.get("labels") or {}).get("app", ""))
        )
        ready = status.get("phase") == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or [])  # fmt: skip
        if ready and seen.ready_at is None:
            seen.ready_at = at if at is not None else 0.0  # 0: ready before the watch
        if kind == "DELETED" and at is not None:
            seen.deleted_at = at


WRITES = ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION")


def writes(plane: ControlPlane) -> collections.Counter[str]:
    """Every client's writes the API server counted so far (``apiserver_request_total``), by
    verb and resource; the nodes' heartbeats (leases, node status) left out: they come with
    time (kwok's and the kubelet's, every few seconds), not with the change."""
    out: collections.Counter[str] = collections.Counter()
    for found, value in api_requests(plane):
        if found.get("verb") in WRITES and found.get("resource") not in ("leases", "nodes"):
            sub = f"/{found['subresource']}" if found.get("subresource") else ""
            out[f"{found['verb']} {found.get('resource')}{sub}"] += value
    return out


def machine() -> dict[str, Any]:
    """The machine now: load average, CPU counters, pytest processes (``…/pytest`` as the
    first or second word) and kube-apiservers (this benchmark's own among them)."""
    with open("/proc/stat") as stat:
        cpu = [int(x) for x in stat.readline().split()[1:]]
    mine = {str(os.getpid())}
    pytests = apiservers = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name in mine:
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pytests += any(a.endswith(b"pytest") for a in args[:2])
        apiservers += args[0].endswith(b"kube-apiserver")
    return {"t": time.monotonic(), "load": os.getloadavg(), "busy": sum(cpu) - sum(cpu[3:5]),
            "total": sum(cpu), "pytest_runs": pytests, "apiservers": apiservers}  # fmt: skip


def load_between(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    share = (b["busy"] - a["busy"]) / max(1, b["total"] - a["total"])
    return {"busy_cores": round(share * (os.cpu_count() or 1), 2),
            "load_1m": [round(a["load"][0], 2), round(b["load"][0], 2)],
            "other_pytest_runs": max(a["pytest_runs"], b["pytest_runs"]),
            "kube_apiservers": max(a["apiservers"], b["apiservers"])}  # fmt: skip


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Tick:
    began: float
    ended: float
    clock: float
    next_in_s: float
    fault: str | None
    states: dict[str, str] = field(default_factory=dict)
    """Each Deployment's state in the policy's status after the reconcile."""


class Drive:
    """Reconciles the policy at the operator's own cadence until every Deployment has a
    verdict; long waits move the clock (after what runs in real time has finished)."""

    def __init__(self, world: World, names: list[str]) -> None:
        self.world, self.names = world, names
        self.start = time.monotonic()
        self.skipped = 0.0
        self.skips: list[tuple[float, float]] = []  # (wall time, seconds the clock jumped)
        self.ticks: list[Tick] = []
        self.verdict_tick: dict[str, int] = {}
        self.histories: set[str] = set()  # Deployments whose new pods have their history

    def clock(self) -> float:
        return T0 + (time.monotonic() - self.start) + self.skipped

    def records(self) -> dict[str, Record | None]:
        return {n: record_of(self.world.deployment(n)) for n in self.names}

    def run(self) -> dict[str, Record | None]:
        while True:
            self.world.clock.now = at = self.clock()
            body = self.world.kube.get(POLICIES, self.world.stage, "bench")
            began = time.monotonic()
            outcome = self.world.reconciler.reconcile(body)
            ended = time.monotonic()
            status = self.world.status("bench").get("workloads") or []
            states = {w["deployment"]: w["state"] for w in status}
            self.ticks.append(Tick(began, ended, at, outcome.next_in_s, outcome.fault, states))
            records = self.records()
            for name, r in records.items():
                if r is not None and r.verdict and name not in self.verdict_tick:
                    self.verdict_tick[name] = len(self.ticks) - 1
            if len(self.verdict_tick) == len(self.names):
                return records
            if len(self.ticks) >= MAX_TICKS or time.monotonic() - self.start > MAX_WALL_S:
                raise BenchError(f"no verdict after {len(self.ticks)} reconciles: {records}")
            if outcome.next_in_s <= SLEEP_CAP_S:
                time.sleep(outcome.next_in_s)
                continue
            self.settle(records)
            jump = at + outcome.next_in_s - self.clock()
            if jump > 0:
                self.skips.append((time.monotonic(), jump))
                self.skipped += jump

    def settle(self, records: dict[str, Record | None]) -> None:
        """Before the clock jumps: rollouts done (and their new pods given history, which the
        verdict reads)."""
        news = []
        for name, r in records.items():
            if r is None or r.method != "Rollout" or r.verdict or name in self.histories:
                continue
            deployment = self.world.kube.rolled_out(self.world.stage, name, timeout_s=120)
            rs = self.world.kube.replicaset_of(deployment)
            for w in self.world.containers[name]:
                hashed = replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"])
                news.append(replace(hashed, names=made_up(hashed, "n"), **HELPED))
            self.histories.add(name)
        if news:
            self.world.add_history(openmetrics(news, NOW, span=NOW - (T0 + 1), step=15))

    def equiv(self, t: float) -> float:
        """Wall time ``t`` plus the clock's jumps before it."""
        return t + sum(s for when, s in self.skips if when <= t)

    def tick_of(self, t: float) -> Tick:
        return [k for k in self.ticks if k.began <= t][-1]


ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The characters the ReplicaSet controller draws a pod's 5-character suffix from."""


def made_up(w: Workload, tag: str) -> tuple[str, ...]:
    """Names of pods gone by now, as many as the Deployment has (``tag``: one character of
    the controller's alphabet, so the names are read as the ReplicaSet's)."""
    a = len(ALPHABET)
    return tuple(f"{w.replicaset}-{tag}{ALPHABET[i // a // a % a]}{ALPHABET[i // a % a]}"
                 f"{ALPHABET[i % a]}x" for i in range(w.pods))  # fmt: skip


def workloads(s: Scenario) -> list[Workload]:
    return [Workload("bench", f"app-{i}", 0.1, 0.10, 1.2, 0.5, s.pods, dict(PART_OF))
            for i in range(s.deployments)]  # fmt: skip


IDLE = """name: idle
workload: {kind: serial, task_cpu_ms: 2, workers: 1, tasks: 20, think_ms: 98}
runs: [{}]
"""
"""What the pods run: 2 % of a core each, so that the node stays quiet."""


def on_node(w: Workload, node: RealNode) -> dict[str, Any]:
    """The shop's Deployment of ``w`` as pods of the workload image on the real node."""
    obj = deployment(w)
    spec = obj["spec"]["template"]["spec"]
    spec.update(nodeSelector={"kubernetes.io/hostname": node.name},
                tolerations=[{**REAL_NODE_TAINT, "operator": "Equal"}],
                terminationGracePeriodSeconds=1, automountServiceAccountToken=False,
                enableServiceLinks=False,
                volumes=[{"name": "scenario", "configMap": {"name": "idle"}}])  # fmt: skip
    (c,) = spec["containers"]
    c.update(image=node.images["workload"].name, imagePullPolicy="Never",
             args=["workload", "/scenario/scenario.yaml"],
             volumeMounts=[{"name": "scenario", "mountPath": "/scenario"}])  # fmt: skip
    c["resources"]["requests"]["cpu"] = "20m"
    return obj


def deploy(kube: Kube, node: RealNode, workloads: list[Workload]) -> list[Workload]:
    """``shop.deploy`` onto the real node: a fresh namespace, its scenario ConfigMap, the
    Deployments rolled out (their pods Ready), each with its ReplicaSet's hash."""
    namespace = fresh_name("bench")
    kube.create_namespace(namespace)
    kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "idle", "namespace": namespace},
                                  "data": {"scenario.yaml": IDLE}})  # fmt: skip
    placed = [replace(w, namespace=namespace) for w in workloads]
    for w in placed:
        kube.create("apps/v1/deployments", on_node(w, node))
    out = []
    for w in placed:
        rs = kube.replicaset_of(kube.rolled_out(w.namespace, w.name, timeout_s=300))
        out.append(replace(w, template_hash=rs["metadata"]["labels"]["pod-template-hash"]))
    return out


def serving(kube: Kube, namespace: str) -> Pods:
    """The namespace's pods by name, once the kubelet reports each one's resources and
    container (its cgroup is then there to read)."""

    def listed() -> list[dict[str, Any]]:
        return kube.list("v1/pods", namespace)

    def reported(pods: list[dict[str, Any]]) -> bool:
        return all(s.get("resources") and s.get("containerID") for p in pods
                   for s in p["status"].get("containerStatuses") or [{}])  # fmt: skip

    return {p["metadata"]["name"]: p for p in kube.until("pods reported", listed, reported,
                                                         timeout_s=120)}  # fmt: skip


def gone(kube: Kube, namespace: str) -> None:
    """Delete the namespace and wait until it is gone: its pods' deletions would otherwise
    be counted among the next run's writes."""
    kube.delete("v1/namespaces", None, namespace)
    with contextlib.suppress(AssertionError):
        kube.until(f"namespace {namespace} gone",
                   lambda: kube.get("v1/namespaces", None, namespace), lambda n: n is None,
                   timeout_s=180)  # fmt: skip


def history(placed: list[Workload], pods: Pods, method: str) -> str:
    """The Deployments' throttled past up to T0; for InPlace also the canary's own counters
    from T0 on, 15 s apart (its verdict reads the last ``verifyFor``)."""
    out = openmetrics([replace(w, names=made_up(w, "h")) for w in placed], T0, span=2 * HOUR)
    if method == "InPlace":
        for w in placed:
            canary = sorted(n for n, p in pods.items() if p["metadata"]["labels"]["app"] == w.name)
            one = replace(w, names=(canary[0],), pods=1, **HELPED)
            out += openmetrics([one], NOW, span=NOW - (T0 + 1), step=15)
    return out


def run_once(plane: ControlPlane, node: RealNode, layout: Layout, kube: Kube, s: Scenario,
             folder: Path) -> dict[str, Any]:  # fmt: skip
    before_load = machine()
    placed = deploy(kube, node, workloads(s))
    namespace = placed[0].namespace
    try:
        pods = serving(kube, namespace)
        with (CgroupWatch(layout, node, pods) as actuations, TimedProxy(kube) as proxy,
              PodWatch(plane, namespace) as watch):  # fmt: skip
            prom = PrometheusServer(folder, openmetrics=history(placed, pods, s.method))
            world = World(kube, proxy, prom.__enter__(), folder, placed, namespace)
            try:
                world.policy("bench", "bench", apply={
                    "method": s.method, "maxConcurrent": s.max_concurrent,
                    "verifyFor": VERIFY_FOR})  # fmt: skip
                drive = Drive(world, [w.name for w in placed])
                written = writes(plane)
                records = drive.run()
                written = writes(plane) - written
            finally:  # the one running now (history added restarts it), and the first
                world.prom.__exit__(None, None, None)
                prom.__exit__(None, None, None)
            after = {
                p["metadata"]["name"]: p
                for p in kube.list("v1/pods", namespace)
                if not p["metadata"].get("deletionTimestamp")
            }  # old pods on their way out
            result = measure(s, drive, records, pods, after, proxy, watch, actuations)
            result["control_plane_writes"] = {"total": sum(written.values()),
                                              "by_kind": dict(sorted(written.items()))}  # fmt: skip
    finally:
        gone(kube, namespace)
    result["machine"] = load_between(before_load, machine())
    return result


# -- what a run shows -------------------------------------------------------------------------


def _limit(pod: dict[str, Any], where: str = "spec") -> int | None:
    if where == "spec":
        res = pod["spec"]["containers"][0].get("resources") or {}
    else:
        res = (pod["status"].get("containerStatuses") or [{}])[0].get("resources") or {}
    cpu = (res.get("limits") or {}).get("cpu")
    return None if cpu is None else parse_cpu(cpu)


def _kind(method: str, path: str) -> str:
    """``PATCH pods/resize``, ``GET deployments``, ``GET pods (list)`` …"""
    parts = path.strip("/").split("/")
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2 :]
    else:
        parts = parts[2:] if parts[0] == "api" else parts[3:]
    resource = parts[0] if parts else "?"
    sub = f"/{parts[2]}" if len(parts) > 2 else ""
    return f"{method} {resource}{sub}{'' if len(parts) > 1 else ' (list)'}"


def requests(proxy: TimedProxy) -> dict[str, Any]:
    by_method = collections.Counter(m for _, m, _ in proxy.times)
    by_kind = collections.Counter(_kind(m, p) for _, m, p in proxy.times)
    return {"total": len(proxy.times), "by_method": dict(sorted(by_method.items())),
            "by_kind": dict(sorted(by_kind.items()))}  # fmt: skip


def restarted(before: Pods, after: Pods) -> dict[str, int]:
    uids = {p["metadata"]["uid"]: p for p in after.values()}
    replaced = sum(p["metadata"]["uid"] not in uids for p in before.values())

    def count(pod: dict[str, Any]) -> int:
        return sum(int(c.get("restartCount") or 0) for c in pod["status"].get("containerStatuses")
                   or [])  # fmt: skip

    more = sum(count(uids[p["metadata"]["uid"]]) - count(p) for p in before.values()
               if p["metadata"]["uid"] in uids)  # fmt: skip
    return {"pods_replaced": replaced, "container_restarts": more}


def measure(s: Scenario, drive: Drive, records: dict[str, Record | None], before: Pods,
            after: Pods, proxy: TimedProxy, watch: PodWatch,
            actuations: CgroupWatch) -> dict[str, Any]:  # fmt: skip
    per: dict[str, dict[str, Any]] = {}
    for name, record in records.items():
        assert record is not None
        if s.method == "InPlace":
            per[name] = inplace_times(drive, name, record, before, proxy, actuations)
        else:
            per[name] = rollout_times(drive, name, record, before, proxy, watch)
        verdict = drive.ticks[drive.verdict_tick[name]]
        per[name]["verdict"] = record.verdict
        decided = drive.equiv(per[name]["_decision"])
        per[name]["applied_equiv_s"] = round(drive.equiv(verdict.ended) - decided, 3)
    wanted = {n: r.containers[0].after.cpu_limit for n, r in records.items() if r is not None}
    right = bool(after) and all(_limit(p) == wanted[p["metadata"]["labels"]["app"]]
                                for p in after.values())  # fmt: skip
    if s.method == "InPlace":
        right = right and all(_limit(p, "status") == _limit(p) for p in after.values())
    first = min(v.pop("_decision") for v in per.values())
    last = max(v.pop("_last") for v in per.values())
    return {
        "scenario": s.key, "deployments": per, "pods_at_new_limit": right,
        "every_pod_of_every_deployment_equiv_s": round(drive.equiv(last) - drive.equiv(first), 3),
        "reconciles": len(drive.ticks), "faults": [t.fault for t in drive.ticks if t.fault],
        "clock_jumped_s": round(drive.skipped, 1), "requests": requests(proxy),
        "ticks": [{"wall_s": round(t.began - drive.start, 2), "took_s": round(t.ended - t.began, 2),
                   "clock_s": round(t.clock - T0, 1), "next_in_s": round(t.next_in_s, 1),
                   "states": t.states} for t in drive.ticks],
        **restarted(before, after),
    }  # fmt: skip


def _common(drive: Drive, sent: float) -> dict[str, Any]:
    tick = drive.tick_of(sent)
    return {"_decision": tick.began,
            "decision_reconcile_s": round(tick.ended - tick.began, 3),
            "sent_s": round(sent - tick.began, 3)}  # fmt: skip


def inplace_times(drive: Drive, name: str, record: Record, before: Pods,
                  proxy: TimedProxy, actuations: CgroupWatch) -> dict[str, Any]:  # fmt: skip
    mine = {n for n, p in before.items() if p["metadata"]["labels"]["app"] == name}
    resizes = [(t, p.split("/")[-2]) for t, m, p in proxy.times
               if m == "PATCH" and p.endswith("/resize") and p.split("/")[-2] in mine]  # fmt: skip
    target = record.containers[0].after.cpu_limit
    done: dict[str, float] = {}
    for t, pod, _, _, limit in actuations.seen:
        if pod in mine and limit == target:
            done.setdefault(pod, t)
    out = _common(drive, resizes[0][0])
    decision = drive.tick_of(resizes[0][0]).began
    canary = record.canary or ""
    verdict = drive.tick_of(next(t for t, pod in resizes if pod != canary)).began
    rest = [t for pod, t in done.items() if pod != canary]
    out.update({
        "canary_s": round(done[canary] - decision, 3),
        "canary_after_sent_s": round(done[canary] - resizes[0][0], 3),
        "rest_from_verdict_s": round(max(rest) - verdict, 3),
        "every_pod_equiv_s": round(drive.equiv(max(done.values())) - drive.equiv(decision), 3),
        "pods_resized": len(done), "resize_requests": len(resizes), "_last": max(done.values()),
    })  # fmt: skip
    return out


def rollout_times(drive: Drive, name: str, record: Record, before: Pods,
                  proxy: TimedProxy, watch: PodWatch) -> dict[str, Any]:  # fmt: skip
    patches = [t for t, m, p in proxy.times if m == "PATCH" and p.endswith(f"/deployments/{name}")]
    olds = {p["metadata"]["uid"] for p in before.values() if p["metadata"]["labels"]["app"] == name}
    news = [p for uid, p in watch.pods.items() if p.app == name and uid not in olds]
    ready = sorted(p.ready_at for p in news if p.ready_at)
    gone = [p.deleted_at for uid, p in watch.pods.items() if uid in olds and p.deleted_at]
    out = _common(drive, patches[0])
    decision = drive.tick_of(patches[0]).began
    out.update({
        "first_new_pod_ready_s": round(ready[0] - decision, 3),
        "every_pod_equiv_s": round(drive.equiv(ready[-1]) - drive.equiv(decision), 3),
        "old_pods_gone_s": round(max(gone) - decision, 3) if len(gone) == len(olds) else None,
        "new_pods": len(news), "_last": ready[-1],
    })  # fmt: skip
    return out


# -- the runs and their summary ---------------------------------------------------------------


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}  # fmt: skip


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: each figure's median, min and max over runs (per Deployment: pooled)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(r["scenario"] for r in runs):
        mine = [r for r in runs if r["scenario"] == key and "error" not in r]
        deps = [d for r in mine for d in r["deployments"].values()]
        numbers = sorted({k for d in deps for k, v in d.items() if isinstance(v, int | float)})
        methods = sorted({m for r in mine for m in r["requests"]["by_method"]})
        out[key] = {
            "runs": len(mine), "failed": sum(r["scenario"] == key and "error" in r for r in runs),
            "per_deployment": {k: spread([d[k] for d in deps if d.get(k) is not None])
                               for k in numbers},
            "every_pod_of_every_deployment_equiv_s": spread(
                [r["every_pod_of_every_deployment_equiv_s"] for r in mine]),
            "pods_replaced": spread([r["pods_replaced"] for r in mine]),
            "container_restarts": spread([r["container_restarts"] for r in mine]),
            "reconciles": spread([r["reconciles"] for r in mine]),
            "requests_total": spread([r["requests"]["total"] for r in mine]),
            "control_plane_writes": spread([r["control_plane_writes"]["total"] for r in mine]),
            "requests_by_method": {m: spread([r["requests"]["by_method"].get(m, 0) for r in mine])
                                   for m in methods},
            "all_pods_at_new_limit": all(r["pods_at_new_limit"] for r in mine),
            "busy_cores": spread([r["machine"]["busy_cores"] for r in mine]),
        }  # fmt: skip
    return out


def code_state() -> dict[str, Any]:
    """The commit measured, and whether the operator's code differed from it (read only)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False)  # fmt: skip
        return done.stdout.strip()

    from unthrottle.operator import inplace

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "operator_files_changed": git("diff", "--name-only", "--", "operator").split(),
            "inplace_step_poll_s": getattr(inplace, "STEP_POLL_S", None)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run of each scenario")
    parser.add_argument("--only", help="run only the scenarios whose key contains this")
    parser.add_argument("--save", type=Path, default=RESULTS)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    chosen = [s for s in SCENARIOS if not args.only or args.only in s.key]
    started, runs = time.monotonic(), []
    at_start, code = machine(), code_state()  # the code imported now is the code measured
    layout = detect_layout()
    with (tempfile.TemporaryDirectory(prefix="unthrottle-inplace-") as top,
          ControlPlane(Path(top) / "control-plane", binaries=ensure_built()) as plane,
          RealNode(plane, Path(top) / "node") as node):  # fmt: skip
        plane.install_crds(ROOT / "crds" / "throttlepolicy.yaml")
        kube = Kube(plane)
        for rep in range(repeats):  # every scenario once per round: drifting load hits all
            for s in chosen:
                with tempfile.TemporaryDirectory(dir=top) as folder:
                    try:
                        result = run_once(plane, node, layout, kube, s, Path(folder))
                    except Exception as error:  # one bad run is a figure, not the end
                        traceback.print_exc()
                        result = {"scenario": s.key, "error": f"{type(error).__name__}: "
                                  f"{str(error)[:500]}"}  # fmt: skip
                result["repeat"] = rep
                runs.append(result)
                print(json.dumps(result), flush=True)
        version = plane.version
    out = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "control_plane": version,
           "code": {**code, "changed_during_run": code_state() != code},
           "verify_for": VERIFY_FOR, "repeats": repeats,
           "wall_s": round(time.monotonic() - started, 1),
           "machine": load_between(at_start, machine()),
           "summary": summary(runs), "runs": runs}  # fmt: skip
    print(json.dumps(out["summary"], indent=1))
    args.save.parent.mkdir(exist_ok=True)
    args.save.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
