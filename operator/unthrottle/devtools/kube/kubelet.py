"""The kubelet's part of in-place pod resize (KEP-1287), played for kwok's fake nodes.

kwok makes pods Running but does not act on resizes, and the API server refuses any resize of
a running container whose status has no ``resources`` ("Pod running on node without support
for resize"). :class:`ResizingKubelet` does what kubelet v1.36 does, as read in
``k8s.io/kubernetes@v1.36.3/pkg/kubelet`` (``allocation/``, ``lifecycle/predicate.go``,
``status/status_manager.go``, ``kubelet_pods.go``, ``kuberuntime/kuberuntime_manager.go``):

- every running pod on its nodes reports ``containerStatuses[].resources`` and
  ``allocatedResources``, the pod's ``allocatedResources``, ``status.observedGeneration`` and
  each kubelet-owned condition's ``observedGeneration``;
- a change of ``spec.containers[].resources`` (the ``resize`` subresource) is admitted against
  the node's allocatable minus the other pods' allocations: if it does not fit,
  ``PodResizePending`` reason ``Deferred``, message ``Node didn't have enough resource: cpu,
  requested: 3000, used: 1500, capacity: 2000`` (millicores; bytes for memory), retried every
  pass; if it fits, ``PodResizeInProgress`` (no reason) until actuated, then no resize
  condition and the status resources equal the spec. A failed actuation is
  ``PodResizeInProgress`` reason ``Error`` with the error's text, retried;
- with ``cpu_manager_policy="static"`` a Guaranteed pod's CPU resize is ``PodResizePending``
  reason ``Infeasible`` (requests beyond the node's allocatable never reach a v1.36 kubelet:
  the API server's ``PodResizeValidator`` refuses them with 403);
- a resource whose ``resizePolicy`` is ``RestartContainer`` is resized by restarting the
  container (``restartCount`` + 1, a new ``containerID``, ``lastState.terminated``).

Status is written only through ``/status``, guarded by the ``resourceVersion`` read (a conflict
is re-read and retried). kwok's ``pod-ready`` stage matches only Pending pods, so it does not
undo it. One stand-in per node; no events are recorded.
"""

from __future__ import annotations

import copy
import hashlib
import http.client
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from unthrottle.devtools.kube.cluster import FAKE_NODE_ANNOTATION, ControlPlane

__all__ = ["KubeletError", "Resize", "ResizingKubelet"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Actuate = Callable[[Obj, str, Obj], None]

PENDING, IN_PROGRESS = "PodResizePending", "PodResizeInProgress"
# conditions the kubelet writes with the pod's generation (kubelet_pods.go)
KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "Ready", "ContainersReady",
                      "PodReadyToStartContainers")  # fmt: skip
STATIC_CPU_INFEASIBLE = (
    'Resize is infeasible for Guaranteed Pods alongside CPU Manager policy "static"'
)
NODES_EVERY = 10  # passes between two lists of the nodes (their allocatable, new fake nodes)
RESTART_EXIT_CODE = 143  # the stand-in's choice: a container that ends on the kubelet's SIGTERM


class KubeletError(RuntimeError):
    """A pass of the stand-in failed (the cause is chained)."""


@dataclass(frozen=True)
class Resize:
    """One thing the stand-in did about a container's resize, in order."""

    namespace: str
    pod: str
    uid: str
    container: str
    old: Obj  # the container's resources before (as in the spec: requests, limits)
    new: Obj  # the resources asked for
    outcome: str  # "Done", "Restarted", "Deferred", "Infeasible" or "Error"
    message: str
    generation: int


# -- quantities -------------------------------------------------------------------------------

_SUFFIX: dict[str, Decimal] = {
    **{s: Decimal(2) ** (10 * i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("", 0), ("k", 3),
                                         ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def quantity(text: str | int | float) -> Decimal:
    """A Kubernetes quantity's value: ``"500m"`` → 0.5, ``"64Mi"`` → 67108864."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, suffix = match.groups()
    return Decimal(number + (exponent or "")) * _SUFFIX[suffix or ""]


def _amount(name: str, value: Decimal) -> int:
    """An amount as the kubelet compares it: millicores for cpu, else units, rounded up."""
    scaled = value * 1000 if name == "cpu" else value
    return int(scaled.to_integral_value(rounding=ROUND_CEILING))


def _text(name: str, value: Decimal) -> str:
    if name == "cpu":
        milli = _amount("cpu", value)
        return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    whole = int(value.to_integral_value(rounding=ROUND_CEILING))
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if whole and whole % int(_SUFFIX[suffix]) == 0:
            return f"{whole // int(_SUFFIX[suffix])}{suffix}"
    return str(whole)


def _values(resources: Obj | None) -> dict[str, dict[str, Decimal]]:
    """Requirements by value (``"1"`` and ``"1000m"`` are equal), without empty parts."""
    out: dict[str, dict[str, Decimal]] = {}
    for part in ("requests", "limits"):
        found = {k: quantity(v) for k, v in ((resources or {}).get(part) or {}).items()}
        if found:
            out[part] = found
    return out


def _add(total: dict[str, Decimal], more: dict[str, Decimal]) -> dict[str, Decimal]:
    return {k: total.get(k, Decimal(0)) + more.get(k, Decimal(0)) for k in total.keys() | more}


def pod_requests(pod: Obj, containers: dict[str, Obj] | None = None) -> dict[str, Decimal]:
    """The pod's requests as the scheduler and kubelet count them (resourcehelper.PodRequests):
    the containers' sum (``containers`` overrides their resources, e.g. with an allocation),
    sidecars added, the largest init container if larger, pod-level requests, overhead."""
    spec = pod["spec"]
    own = containers or {}
    total: dict[str, Decimal] = {}
    for c in spec["containers"]:
        total = _add(total, _values(own.get(c["name"], c.get("resources"))).get("requests", {}))
    sidecars: dict[str, Decimal] = {}
    init: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or []:
        asks = _values(c.get("resources")).get("requests", {})
        if c.get("restartPolicy") == "Always":
            total, sidecars = _add(total, asks), _add(sidecars, asks)
            asks = sidecars
        else:
            asks = _add(asks, sidecars)
        init = {
            k: max(init.get(k, Decimal(0)), asks.get(k, Decimal(0))) for k in init.keys() | asks
        }
    total = {k: max(total.get(k, Decimal(0)), init.get(k, Decimal(0)))
             for k in total.keys() | init}  # fmt: skip
    total.update(_values(spec.get("resources")).get("requests", {}))
    return _add(total, {k: quantity(v) for k, v in (spec.get("overhead") or {}).items()})


# -- what the kubelet decides -----------------------------------------------------------------


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(kind: str, reason: str, message: str, generation: int,
               previous: Obj | None) -> Obj:  # fmt: skip
    """A resize condition as status_manager.updatedPodResizeCondition makes it: the transition
    time kept while the reason stays. The probe time is kept too while nothing else changes,
    so a decision retried every pass writes nothing."""
    if previous is not None and (previous.get("reason", ""), previous.get("message", ""),
                                 previous.get("observedGeneration")) == (reason, message,
                                                                         generation):  # fmt: skip
        return previous
    now = _now()
    same = previous is not None and previous.get("reason", "") == reason
    out: Obj = {"type": kind, "status": "True", "lastProbeTime": now,
                "lastTransitionTime": previous["lastTransitionTime"] if same and previous
                else now, "observedGeneration": generation}  # fmt: skip
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def _guaranteed(pod: Obj, containers: dict[str, Obj]) -> bool:
    for c in pod["spec"]["containers"]:
        values = _values(containers.get(c["name"], c.get("resources")))
        requests, limits = values.get("requests", {}), values.get("limits", {})
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                return False
    return True


def admit(pod: Obj, desired: dict[str, Obj], allocated: dict[str, Obj], node: Obj,
          others: list[tuple[Obj, dict[str, Obj] | None]], *,
          cpu_manager_policy: str = "none") -> tuple[str, str] | None:  # fmt: skip
    """None if the kubelet would allocate ``desired``; else the PodResizePending reason and
    message (allocation.podResizesAdmitHandler, then lifecycle.predicateAdmitHandler, whose
    failures status_manager reports as Deferred). ``others``: the node's other active pods,
    each with its allocation if known."""
    cpu_changed = any(
        _values(desired[n]).get("requests", {}).get("cpu") != _values(allocated.get(n)).get(
            "requests", {}).get("cpu") for n in desired
    )  # fmt: skip
    if cpu_manager_policy == "static" and cpu_changed and _guaranteed(pod, desired):
        return "Infeasible", STATIC_CPU_INFEASIBLE
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict[str, Decimal] = {}
    for other, allocation in others:
        used = _add(used, pod_requests(other, allocation))
    pods = int(quantity(allocatable.get("pods", "110")))
    if len(others) + 1 > pods:
        return "Deferred", (f"Node didn't have enough resource: pods, requested: 1, used: "
                            f"{len(others)}, capacity: {pods}")  # fmt: skip
    asks = pod_requests(pod, desired)
    for name in ("cpu", "memory", "ephemeral-storage"):
        want = _amount(name, asks.get(name, Decimal(0)))
        have = _amount(name, quantity(allocatable.get(name, "0")))
        taken = _amount(name, used.get(name, Decimal(0)))
        if want > 0 and want > have - taken:
            return "Deferred", (f"Node didn't have enough resource: {name}, requested: {want}, "
                                f"used: {taken}, capacity: {have}")  # fmt: skip
    return None


def _restart_needed(container: Obj, old: Obj | None, new: Obj) -> bool:
    """kuberuntime computePodResizeAction: a changed resource whose policy says restart."""
    before, after = _values(old), _values(new)
    policies = {p["resourceName"]: p.get("restartPolicy") for p in container.get("resizePolicy")
                or []}  # fmt: skip
    for name in ("cpu", "memory"):
        changed = any(before.get(part, {}).get(name) != after.get(part, {}).get(name)
                      for part in ("requests", "limits"))  # fmt: skip
        if changed and policies.get(name) == "RestartContainer":
            return True
    return False


# -- what it keeps per pod --------------------------------------------------------------------


@dataclass
class _Pod:
    allocated: dict[str, Obj]  # container → resources the kubelet admitted
    actual: dict[str, Obj]  # container → resources actuated (what status reports)
    observed: int  # the generation whose spec was last acted on
    pending: Obj | None = None
    in_progress: Obj | None = None
    restarted: dict[str, Obj] = field(default_factory=dict)  # container → status fields
    said: set[tuple[Any, ...]] = field(default_factory=set)  # outcomes already recorded
    seen: str = ""  # the pod's resourceVersion after the last sync

    def actuated(self) -> bool:
        return all(_values(self.actual.get(n)) == _values(r) for n, r in self.allocated.items())

    def idle(self, pod: Obj) -> bool:
        """Nothing to do until the pod changes: nothing pending, in progress or to actuate,
        and the pod as this stand-in left it (a pass then costs no copy of it)."""
        return (self.seen == pod["metadata"]["resourceVersion"] and self.pending is None
                and self.in_progress is None and self.actuated())  # fmt: skip


def _desired(pod: Obj) -> dict[str, Obj]:
    return {c["name"]: copy.deepcopy(c.get("resources") or {}) for c in pod["spec"]["containers"]}


def _seed(pod: Obj) -> _Pod:
    """A pod seen for the first time: allocated as its spec (admission), or, if a stand-in
    before this one reported it, as that report (the kubelet's checkpoint after a restart)."""
    desired = _desired(pod)
    reported = {s["name"]: s["resources"] for s in pod["status"].get("containerStatuses") or []
                if s.get("resources") is not None and s["name"] in desired}  # fmt: skip
    start = {name: copy.deepcopy(reported.get(name, res)) for name, res in desired.items()}
    state = _Pod(allocated=start, actual=copy.deepcopy(start),
                 observed=int(pod["status"].get("observedGeneration") or 0))  # fmt: skip
    for c in pod["status"].get("conditions") or []:
        if c.get("type") == PENDING:
            state.pending = c
        elif c.get("type") == IN_PROGRESS:
            state.in_progress = c
    return state


def render_status(pod: Obj, state: _Pod) -> Obj:
    """The pod's status as the kubelet would write it for ``state`` (kwok's fields kept)."""
    status: Obj = copy.deepcopy(pod["status"])
    generation = max(state.observed, int(status.get("observedGeneration") or 0))
    status["observedGeneration"] = generation
    conditions = [c for c in status.get("conditions") or [] if c["type"] not in
                  (PENDING, IN_PROGRESS)]  # fmt: skip
    for c in conditions:
        if c["type"] in KUBELET_CONDITIONS:
            c["observedGeneration"] = generation
    conditions += [c for c in (state.pending, state.in_progress) if c is not None]
    status["conditions"] = conditions
    for cs in status.get("containerStatuses") or []:
        name = cs["name"]
        if name not in state.allocated:
            continue
        cs.update(copy.deepcopy(state.restarted.get(name, {})))
        cs["resources"] = copy.deepcopy(state.actual[name])
        requests = state.allocated[name].get("requests")
        if requests:
            cs["allocatedResources"] = copy.deepcopy(requests)
        else:
            cs.pop("allocatedResources", None)
    total = pod_requests(pod, state.allocated)
    if total:
        status["allocatedResources"] = {k: _text(k, v) for k, v in sorted(total.items())}
    return status


def _comparable(status: Obj) -> Obj:
    """The status with its quantities as values: the server writes them back canonical
    (``"100000000"`` → ``"100M"``), which must not read as a change."""
    out = copy.deepcopy(status)
    if "allocatedResources" in out:
        out["allocatedResources"] = _values({"requests": out["allocatedResources"]})
    for cs in out.get("containerStatuses") or []:
        if "resources" in cs:
            cs["resources"] = _values(cs["resources"])
        if "allocatedResources" in cs:
            cs["allocatedResources"] = _values({"requests": cs["allocatedResources"]})
    return out


def _restarted_fields(pod: Obj, status: Obj) -> Obj:
    """A container's status fields after the kubelet restarted it for a resize."""
    count = int(status.get("restartCount") or 0) + 1
    digest = hashlib.sha256(f"{pod['metadata']['uid']}/{status['name']}/{count}".encode())
    now = _now()
    started = ((status.get("state") or {}).get("running") or {}).get("startedAt", now)
    return {
        "restartCount": count, "containerID": f"containerd://{digest.hexdigest()}",
        "state": {"running": {"startedAt": now}},
        "lastState": {"terminated": {"containerID": status.get("containerID"),
                                     "exitCode": RESTART_EXIT_CODE, "reason": "Error",
                                     "startedAt": started, "finishedAt": now}},
    }  # fmt: skip


# -- the API server ---------------------------------------------------------------------------


class _Api:
    """The admin's calls over one kept-alive HTTPS connection (a poll every 100 ms would
    otherwise pay a TLS handshake per request)."""

    def __init__(self, plane: ControlPlane) -> None:
        url = urlsplit(plane.server)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 443
        self._tls = ssl.create_default_context(cafile=str(plane.pki.ca))
        self._tls.load_cert_chain(*map(str, plane.pki.admin))
        self._conn: http.client.HTTPSConnection | None = None
        # the API server names the field manager after the agent: "kubelet", as the real one
        agent = f"kubelet/{plane.version} (linux/amd64) unthrottle"
        self._headers = {"Content-Type": "application/json", "User-Agent": agent}

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPSConnection(self._host, self._port,
                                                         context=self._tls, timeout=10)  # fmt: skip
            try:
                self._conn.request(method, path, body=data, headers=self._headers)
                reply = self._conn.getresponse()
                raw = reply.read()
                return reply.status, json.loads(raw) if raw.strip() else None
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# -- the stand-in -----------------------------------------------------------------------------


class ResizingKubelet:
    """The kubelet's resize handling for kwok's fake nodes, in a background thread.

    ``nodes``: the fake nodes it stands for (None: every node kwok manages).
    ``actuate(pod, container, new_resources)`` runs before a resize is reported done (the demo
    writes the CPU quota into a real cgroup); if it raises, the resize is reported as the
    kubelet reports a failed actuation and retried on the next pass.
    ``interval_s``: seconds between passes (each pass lists the nodes and pods once).
    ``cpu_manager_policy``: ``"static"`` makes Guaranteed pods' CPU resizes Infeasible, as the
    kubelet's CPU manager does without the alpha InPlacePodVerticalScalingExclusiveCPUs gate.
    """

    def __init__(self, plane: ControlPlane, *, nodes: Iterable[str] | None = None,
                 actuate: Actuate | None = None, interval_s: float = 0.1,
                 cpu_manager_policy: str = "none") -> None:  # fmt: skip
        self.nodes = None if nodes is None else frozenset(nodes)
        self.interval_s = interval_s
        self.cpu_manager_policy = cpu_manager_policy
        self._actuate = actuate
        self._api = _Api(plane)
        self._pods: dict[str, _Pod] = {}
        self._nodes: dict[str, Obj] = {}
        self._seen_nodes: set[str] = set()
        self._done: list[Resize] = []
        self._lock = threading.Condition()
        self._passes = 0
        self._failure: tuple[int, BaseException] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the public surface ------------------------------------------------------------------

    def start(self) -> ResizingKubelet:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="resizing-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread (it finishes its pass) and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._api.close()

    def __enter__(self) -> ResizingKubelet:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def resizes(self) -> list[Resize]:
        """What it did so far, in order."""
        with self._lock:
            return list(self._done)

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until a whole pass has run after this call (KubeletError if it failed)."""
        with self._lock:
            target = self._passes + 2  # the pass under way may have read before the call
            if not self._lock.wait_for(lambda: self._passes >= target, timeout=timeout_s):
                raise KubeletError(f"no pass of the stand-in within {timeout_s:.0f} s")
            if self._failure is not None and self._failure[0] >= target:
                raise KubeletError(f"a pass failed: {self._failure[1]}") from self._failure[1]

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._pass()
            except Exception as error:  # the next pass retries; sync() reports it
                log.warning("resizing kubelet: pass failed: %s", error, exc_info=True)
                with self._lock:
                    self._failure = (self._passes + 1, error)
            with self._lock:
                self._passes += 1
                self._lock.notify_all()
            self._stop.wait(self.interval_s)

    def _list(self, path: str) -> list[Obj]:
        # resourceVersion=0: from the API server's watch cache, as an informer reads; a stale
        # read only delays (every write is guarded by the resourceVersion it read)
        status, body = self._api.call("GET", path + "?resourceVersion=0")
        if status != 200:
            raise KubeletError(f"GET {path}: HTTP {status}: {body}")
        return list(body["items"])

    def _known_nodes(self, pods: list[Obj]) -> dict[str, Obj]:
        """The nodes it stands for, listed again every NODES_EVERY passes or when a pod is on a
        node not seen yet (nodes change rarely; pods every pass)."""
        unknown = {p["spec"].get("nodeName") for p in pods} - self._seen_nodes - {None}
        if unknown or self._passes % NODES_EVERY == 0 or not self._nodes:
            key, value = FAKE_NODE_ANNOTATION
            listed = self._list("/api/v1/nodes")
            self._seen_nodes = {n["metadata"]["name"] for n in listed}
            self._nodes = {
                n["metadata"]["name"]: n for n in listed
                if (n["metadata"].get("annotations") or {}).get(key) == value
                and (self.nodes is None or n["metadata"]["name"] in self.nodes)
            }  # fmt: skip
        return self._nodes

    def _pass(self) -> None:
        listed = self._list("/api/v1/pods")
        nodes = self._known_nodes(listed)
        pods = [p for p in listed
                if p["spec"].get("nodeName") in nodes
                and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]  # fmt: skip
        present = {p["metadata"]["uid"] for p in pods}
        self._pods = {uid: s for uid, s in self._pods.items() if uid in present}
        for pod in pods:
            state = self._pods.get(pod["metadata"]["uid"])
            if self._runs(pod) and (state is None or not state.idle(pod)):
                others = [(o, self._allocation(o)) for o in pods
                          if o["spec"]["nodeName"] == pod["spec"]["nodeName"]
                          and o["metadata"]["uid"] != pod["metadata"]["uid"]]  # fmt: skip
                self._sync_pod(pod, nodes[pod["spec"]["nodeName"]], others)

    @staticmethod
    def _runs(pod: Obj) -> bool:
        """kwok has made it Running and Ready, and it is not being deleted."""
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])  # fmt: skip
        return (status.get("phase") == "Running" and ready and bool(status.get("containerStatuses"))
                and not pod["metadata"].get("deletionTimestamp"))  # fmt: skip

    def _allocation(self, pod: Obj) -> dict[str, Obj] | None:
        state = self._pods.get(pod["metadata"]["uid"])
        return None if state is None else state.allocated

    def _sync_pod(self, pod: Obj, node: Obj, others: list[tuple[Obj, dict[str, Obj] | None]],
                  ) -> None:  # fmt: skip
        uid = pod["metadata"]["uid"]
        state = self._pods.setdefault(uid, _seed(pod))
        generation = int(pod["metadata"].get("generation") or 1)
        self._allocate(pod, state, generation, node, others)
        state.observed = generation
        if not state.actuated():
            if state.in_progress is None:  # kubelet.go: IsPodResizeInProgress
                state.in_progress = _condition(IN_PROGRESS, "", "", generation, None)
            pod = self._write(pod, state) or pod
            self._actuate_all(pod, state)
        if state.actuated():
            state.in_progress = None
        state.seen = (self._write(pod, state) or pod)["metadata"]["resourceVersion"]

    def _allocate(self, pod: Obj, state: _Pod, generation: int, node: Obj,
                  others: list[tuple[Obj, dict[str, Obj] | None]]) -> None:  # fmt: skip
        """allocation_manager.handlePodResourcesResize."""
        desired = _desired(pod)
        if all(_values(desired[n]) == _values(state.allocated.get(n)) for n in desired):
            state.pending = None  # nothing asked, or a pending resize was reverted
            return
        refused = admit(pod, desired, state.allocated, node, others,
                        cpu_manager_policy=self.cpu_manager_policy)  # fmt: skip
        if refused is None:
            state.allocated, state.pending = desired, None
            state.in_progress = _condition(IN_PROGRESS, "", "", generation, None)
            return
        reason, message = refused
        state.pending = _condition(PENDING, reason, message, generation, state.pending)
        for name in desired:
            if _values(desired[name]) != _values(state.allocated.get(name)):
                self._record(pod, state, name, desired[name], reason, message, generation)

    def _actuate_all(self, pod: Obj, state: _Pod) -> None:
        """kuberuntime doPodResizeAction: each changed container in turn, the first error
        ending the pass (PodResizeInProgress keeps its generation, takes reason Error)."""
        statuses = {s["name"]: s for s in pod["status"].get("containerStatuses") or []}
        for c in pod["spec"]["containers"]:
            name, new = c["name"], state.allocated[c["name"]]
            if _values(state.actual.get(name)) == _values(new):
                continue
            try:
                if self._actuate is not None:
                    self._actuate(pod, name, copy.deepcopy(new))
            except Exception as error:  # any failure is the runtime's error
                assert state.in_progress is not None
                message = str(error) or type(error).__name__
                state.in_progress = _condition(IN_PROGRESS, "Error", message,
                                               state.in_progress["observedGeneration"],
                                               state.in_progress)  # fmt: skip
                self._record(pod, state, name, new, "Error", message, state.observed)
                return
            outcome = "Done"
            if _restart_needed(c, state.actual.get(name), new) and name in statuses:
                state.restarted[name] = _restarted_fields(
                    pod, {**statuses[name], **state.restarted.get(name, {})}
                )
                outcome = "Restarted"
            self._record(pod, state, name, new, outcome, "", state.observed)
            state.actual[name] = copy.deepcopy(new)

    def _record(self, pod: Obj, state: _Pod, container: str, new: Obj, outcome: str,
                message: str, generation: int) -> None:  # fmt: skip
        key = (container, outcome, message, generation, json.dumps(new, sort_keys=True))
        if outcome not in ("Done", "Restarted") and key in state.said:
            return
        state.said.add(key)
        meta = pod["metadata"]
        with self._lock:
            self._done.append(Resize(
                namespace=meta["namespace"], pod=meta["name"], uid=meta["uid"],
                container=container, old=copy.deepcopy(state.actual.get(container) or {}),
                new=copy.deepcopy(new), outcome=outcome, message=message,
                generation=generation,
            ))  # fmt: skip

    def _write(self, pod: Obj, state: _Pod, *, attempts: int = 4) -> Obj | None:
        """PUT the rendered status if it differs, guarded by the resourceVersion read; on a
        conflict (kwok or anyone else wrote meanwhile) re-read and render again. The pod as
        written, or None if nothing was written."""
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        for _ in range(attempts):
            status = render_status(pod, state)
            if _comparable(status) == _comparable(pod["status"]):
                return None
            code, body = self._api.call("PUT", path + "/status", {**pod, "status": status})
            if code == 200:
                return dict(body)
            if code == 404:
                return None
            if code != 409:
                raise KubeletError(f"PUT {path}/status: HTTP {code}: {body}")
            code, body = self._api.call("GET", path)
            if code != 200 or body["metadata"]["uid"] != meta["uid"]:
                return None
            pod = body
        raise KubeletError(f"PUT {path}/status: still conflicting after {attempts} attempts")
