"""Write the CPU burst that pod annotations ask for into the container and pod cgroups.

Kubernetes has no field for burst; the agent sets ``cpu.cfs_burst_us`` /
``cpu.max.burst`` itself, from ``unthrottle.io/cpu-burst`` or Koordinator's
``koordinator.sh/cpuBurst`` (:mod:`unthrottle.model.burst`):

- only the burst file is written; quota and period stay the kubelet's;
- never above the quota: a larger request is clamped, logged once, counted;
- the pod cgroup gets the sum of its containers' bursts, clamped to its own
  quota (it carries the sum of their limits and would throttle them otherwise);
- on every rediscovery: a restarted container (a new cgroup) gets it again,
  and a cgroup whose annotation went away is set back to 0;
- **node safety**: while the node's CPU usage is above ``threshold`` (default
  0.5 of all CPUs, as Koordinator's ``sharePoolThresholdPercent``), no burst
  is granted: every burst this agent set goes to 0 until usage falls below it.
  Bursting containers borrow idle CPU, and a busy node has none to lend;
- **scope** (:class:`BurstScope`): only pods in the allowed namespaces are
  written, never kube-system unless it is named; a pod that carries Koordinator's
  annotation is left to Koordinator's koordlet (which writes the same files)
  unless the agent is told that no koordlet runs;
- a kernel without burst support: reads still work, writes are skipped with a
  reason logged once;
- **on exit** (SIGTERM: ``helm uninstall``, a rollout of the DaemonSet) every burst this
  agent wrote goes back to 0, so the cgroups are as the kubelet made them: a burst left
  behind with no agent to lower it would make the kubelet's next resize to a quota under
  it fail (EINVAL) for ever. A rollout leaves the pods without burst for the seconds
  until the new agent's first discovery writes it again.

The agent writes nothing unless started with ``--burst`` (the chart's
``agent.burst.enabled``); then only these burst files, of these pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from unthrottle.agent.discovery import Found
from unthrottle.agent.naming import PodInfo
from unthrottle.cgroups import Cgroup, CgroupError, Layout
from unthrottle.model.burst import (
    BURST_ANNOTATION,
    KOORDINATOR_ANNOTATION,
    BurstAnnotationError,
    burst_specs,
    spec_for,
)

log = logging.getLogger("unthrottle.agent")
DEFAULT_NODE_THRESHOLD = 0.5
ALL_NAMESPACES = "*"
PROTECTED_NAMESPACE = "kube-system"


@dataclass(frozen=True, slots=True)
class BurstScope:
    """Whose cgroups the writer may write: the write path's allowlist."""

    namespaces: frozenset[str] = frozenset({ALL_NAMESPACES})
    """Namespaces whose pods may ask for burst; ``*`` is every namespace but kube-system,
    which is written only when named (its pods keep the node and the cluster running)."""
    koordinator: bool = False
    """Honour Koordinator's ``koordinator.sh/cpuBurst``. Off: a pod that carries it is
    Koordinator's, and none of its cgroups is written, even when it also carries ours,
    so that this agent and Koordinator's koordlet never write the same file. On only
    where no koordlet runs and pods already carry Koordinator's annotation."""

    def refusal(self, pod: PodInfo) -> str | None:
        """Why this pod's cgroups are not written, or None when they may be."""
        if not self.koordinator and KOORDINATOR_ANNOTATION in pod.annotations:
            return (
                f"it carries {KOORDINATOR_ANNOTATION}, which Koordinator's koordlet "
                "serves (--burst-koordinator honours it where none runs)"
            )
        named = pod.namespace in self.namespaces
        if named or (ALL_NAMESPACES in self.namespaces
                     and pod.namespace != PROTECTED_NAMESPACE):  # fmt: skip
            return None
        return (
            f"namespace {pod.namespace} is not among the agent's burst namespaces "
            f"({', '.join(sorted(self.namespaces))})"
        )


class NodeCpuSource(Protocol):
    """The node's CPU usage as a share of all its CPUs, since the last call."""

    def usage(self) -> float:
        """0–1."""
        ...


class ProcStat:
    """Node CPU usage from ``/proc/stat`` (busy / total jiffies between two calls)."""

    def __init__(self, path: Path = Path("/proc/stat")) -> None:
        self.path = path
        self._last = self._read()

    def _read(self) -> tuple[int, int]:
        fields = [int(x) for x in self.path.read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def usage(self) -> float:
        """Busy share since the previous call."""
        busy, total = self._read()
        last_busy, last_total = self._last
        self._last = (busy, total)
        return (busy - last_busy) / (total - last_total) if total > last_total else 0.0


@dataclass
class BurstWriter:
    """Keeps every annotated container's burst as asked, within the node's means."""

    layout: Layout
    node: NodeCpuSource
    threshold: float = DEFAULT_NODE_THRESHOLD
    scope: BurstScope = field(default_factory=BurstScope)
    granted: dict[str, int] = field(default_factory=dict)
    """Cgroup path → burst this agent wrote (what to undo)."""
    clamped_total: int = 0
    """Distinct clamps: a cgroup whose burst had to be cut to its quota (once per value)."""
    suspended: bool = False
    released: bool = False
    """Set by :meth:`release`: nothing is written after it."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _said: set[tuple[str, str, str]] = field(default_factory=set)
    """(what, about, detail) of every warning given once; ``about`` is a pod UID, a cgroup
    path, or "" for the node. Facts about pods and cgroups that are gone are forgotten."""

    def _once(self, what: str, about: str, detail: str, message: str, *args: object) -> bool:
        """Log a message the first time this fact comes up; True that first time."""
        key = (what, about, detail)
        if key in self._said:
            return False
        self._said.add(key)
        log.warning(message, *args)
        return True

    @property
    def remembered(self) -> int:
        """Warnings remembered so as not to repeat them (bounded by the live pods)."""
        return len(self._said)

    def _forget_gone(self, found: Iterable[Found], pods: Iterable[PodInfo]) -> None:
        """Drop what was said about pods and cgroups that are no longer there."""
        live = {p.uid for p in pods} | {f.path for f in found} | {""}
        self._said = {key for key in self._said if key[1] in live}

    def wanted(self, found: Iterable[Found], pods: Iterable[PodInfo]) -> dict[str, int]:
        """Cgroup path → burst µs that the annotations ask for (clamped to each quota)."""
        by_uid = {p.uid: p for p in pods}
        containers: dict[str, list[tuple[Found, int]]] = {}
        pod_paths: dict[str, Found] = {}
        for item in found:
            if item.identity is None:
                continue
            pod = by_uid.get(item.identity.pod_uid)
            if pod is None:
                continue
            if item.identity.container_id is None:
                pod_paths[pod.uid] = item
                continue
            refusal = self.scope.refusal(pod)
            if refusal is not None:
                if BURST_ANNOTATION in pod.annotations or KOORDINATOR_ANNOTATION in pod.annotations:
                    self._once("scope", pod.uid, "", "pod %s/%s asks for burst; not written: %s",
                               pod.namespace, pod.name, refusal)  # fmt: skip
                continue
            try:
                specs = burst_specs(pod.annotations)
            except BurstAnnotationError as err:
                self._once("bad", pod.uid, "", "pod %s/%s: %s", pod.namespace, pod.name, err)
                continue
            spec = spec_for(specs, item.container)
            if spec is None:
                continue
            try:
                quota = Cgroup(self.layout, item.path).read_bandwidth().quota_us
            except CgroupError:
                continue  # vanishing
            burst, clamped = spec.resolve(quota)
            # Counted (and logged) once per cgroup and clamped value, not at every rediscovery.
            if clamped and self._once("clamp", item.path, str(burst),
                                      "%s/%s %s: burst clamped to the quota (%d µs)",
                                      pod.namespace, pod.name, item.container, burst):  # fmt: skip
                self.clamped_total += 1
            containers.setdefault(pod.uid, []).append((item, burst))
        out = {}
        for uid, items in containers.items():
            for item, burst in items:
                out[item.path] = burst
            pod_item = pod_paths.get(uid)
            if pod_item is not None:
                try:
                    quota = Cgroup(self.layout, pod_item.path).read_bandwidth().quota_us
                except CgroupError:
                    continue
                total = sum(b for _, b in items)
                out[pod_item.path] = min(total, quota) if quota is not None else 0
        return out

    def metrics(self) -> str:
        """The writer's own metrics, in the exposition format."""
        return (
            "# HELP unthrottle_agent_burst_suspended 1 while node safety grants no burst.\n"
            "# TYPE unthrottle_agent_burst_suspended gauge\n"
            f"unthrottle_agent_burst_suspended {int(self.suspended)}\n"
            "# HELP unthrottle_agent_burst_clamped_total Bursts clamped to the quota.\n"
            "# TYPE unthrottle_agent_burst_clamped_total counter\n"
            f"unthrottle_agent_burst_clamped_total {self.clamped_total}\n"
        )

    def release(self) -> int:
        """Set every burst this agent wrote back to 0 (the agent is stopping) and write
        nothing after; returns how many cgroups were set back."""
        with self._lock:
            self.released = True
            undone = 0
            for path in sorted(self.granted):
                cgroup = Cgroup(self.layout, path)
                try:
                    if cgroup.exists() and cgroup.read_bandwidth().burst_us:
                        cgroup.write_burst(0)
                        undone += 1
                except CgroupError as err:
                    log.warning("cannot set burst back to 0: %s", err)
            self.granted.clear()
        if undone:
            log.info("stopping: the burst of %d cgroups set back to 0", undone)
        return undone

    def apply(self, found: list[Found], pods: list[PodInfo]) -> None:
        """Bring every cgroup's burst to what is wanted now (or to 0 while the node is busy)."""
        with self._lock:
            if not self.released:
                self._apply(found, pods)

    def _apply(self, found: list[Found], pods: list[PodInfo]) -> None:
        self._forget_gone(found, pods)
        wanted = self.wanted(found, pods)
        busy = self.node.usage() > self.threshold
        if busy != self.suspended:
            self.suspended = busy
            log.warning("node CPU usage %s %.0f %%: %s burst", "above" if busy else "below",
                        self.threshold * 100, "suspending" if busy else "resuming")  # fmt: skip
        if busy:
            wanted = {path: 0 for path in wanted}
        for path in set(self.granted) - set(wanted):
            wanted[path] = 0  # the annotation went away: undo what we set
        for path, burst in wanted.items():
            if self.granted.get(path) == burst and burst != 0:
                continue
            cgroup = Cgroup(self.layout, path)
            try:
                if not cgroup.exists():
                    self.granted.pop(path, None)
                    continue
                if cgroup.read_bandwidth().burst_us != burst:
                    cgroup.write_burst(burst)
            except CgroupError as err:
                self._once("write", "", err.reason, "cannot set burst: %s", err)
                continue
            if burst:
                self.granted[path] = burst
            else:
                self.granted.pop(path, None)
