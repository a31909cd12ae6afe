"""In-place resize: what an InPlace record asks of each running pod, and how far the
kubelet got. Pure.

A CPU limit changes through the pod's ``resize`` subresource (Kubernetes 1.33+, GA in
1.35); the kubelet rewrites the cgroup without a restart (``resizePolicy`` ``NotRequired``,
the default) and reports the result in the pod's status:

- done: each container's ``status.containerStatuses[].resources`` match its spec, and
  neither ``PodResizePending`` nor ``PodResizeInProgress`` is left;
- ``PodResizePending`` with reason ``Deferred`` (the node has no room now) or
  ``Infeasible`` (it never will), the kubelet's message beside it;
- ``PodResizeInProgress`` with reason ``Error``: the kubelet failed to actuate it.

The QoS class never changes (the API server refuses a resize that would change it): a
Guaranteed pod's request moves with its limit; a Burstable pod keeps its request.

A pod-level limit (``spec.resources``, the row :data:`~unthrottle.model.podlevel.POD_ROW`)
is resized the same way, through the same subresource (``InPlacePodLevelResourcesVertical
Scaling``, beta and on since Kubernetes 1.36; a server without it refuses the resize, and
InPlace gives up as for any refusal). The kubelet reports it in ``status.resources``, read
back from the pod cgroup: the limit from its quota, exactly; the request from its CPU
shares, to a millicore or so (:data:`POD_SHARES_SLACK_M`).

The burst annotation (``unthrottle.io/cpu-burst``, written into the cgroup by the node
agent) and the quota (written by the kubelet) must keep ``burst ≤ quota`` at every
instant: the kernel refuses a quota below the burst (EINVAL), and a quota write keeps the
burst. So a change goes through an *interim* burst, each container's smaller of before
and after: it fits under both quotas. Interim burst, then the resize, then the final
burst; a rollback takes the same steps back (the interim is the same both ways).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from unthrottle.kube.deployments import REVISION_LABEL
from unthrottle.kube.patching import Record, burst_text
from unthrottle.model.burst import (
    BURST_ANNOTATION,
    BurstAnnotationError,
    BurstSpec,
    burst_specs,
)
from unthrottle.model.podlevel import POD_ROW, is_pod_row
from unthrottle.units import format_cpu, parse_cpu

Pod = dict[str, Any]
Resources = dict[str, dict[str, str | None]]
"""A container's ``resources`` as a resize sets them: ``{"limits": {"cpu": "900m"}}``."""
RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")
POD_SHARES_SLACK_M = 2
"""How far a pod-level CPU request the kubelet reports may be from the one asked, millicores:
it reads it back from the pod cgroup's shares (1,024 a core), rounding."""


class InPlaceError(ValueError):
    """A pod that cannot be resized to the record's settings (the message says why)."""


def owner_replicaset(pod: Pod) -> str | None:
    """The revision a pod belongs to, as an InPlace record names it (``Record.replicaset``):
    the name of the ReplicaSet that controls a Deployment's pod, or the
    ``controller-revision-hash`` of a pod a StatefulSet or a DaemonSet controls; None for
    another pod."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        if ref.get("kind") == "ReplicaSet":
            return str(ref.get("name"))
        if ref.get("kind") in ("StatefulSet", "DaemonSet"):
            revision = (meta.get("labels") or {}).get(REVISION_LABEL)
            return None if revision is None else str(revision)
    return None


def _cpu(resources: dict[str, Any] | None, kind: str) -> int | None:
    value = ((resources or {}).get(kind) or {}).get("cpu")
    return None if value is None else parse_cpu(str(value))


def _containers(pod: Pod) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in (pod.get("spec") or {}).get("containers") or []}


def _resources(pod: Pod, row: str) -> dict[str, Any] | None:
    """A row's resources in the pod's spec: a container's, or the pod's own (``POD_ROW``)."""
    if is_pod_row(row):
        return (pod.get("spec") or {}).get("resources")
    container = _containers(pod).get(row)
    return None if container is None else container.get("resources") or {}


def guaranteed(pod: Pod) -> bool:
    """The pod's QoS class is Guaranteed (as the API server computed it, when it did)."""
    qos = (pod.get("status") or {}).get("qosClass")
    if qos is not None:
        return bool(qos == "Guaranteed")
    spec = pod.get("spec") or {}
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for kind in ("cpu", "memory"):
            limit = (res.get("limits") or {}).get(kind)
            request = (res.get("requests") or {}).get(kind, limit)
            if limit is None or request != limit:
                return False
    return True


def _would_be_guaranteed(pod: Pod, want: dict[str, Resources]) -> bool:
    """Every container (init ones too) would have CPU and memory limits equal to requests
    once ``want`` is applied: the QoS class would become Guaranteed. A pod with pod-level
    resources is classed by those alone (Kubernetes 1.34+). (The API server stores
    quantities canonical, so equal memory amounts read the same.)"""
    spec = pod.get("spec") or {}
    if spec.get("resources"):
        return _guaranteed(spec["resources"], want.get(POD_ROW))
    return all(_guaranteed(c.get("resources"), want.get(c.get("name", "")))
               for c in [*(spec.get("containers") or []),
                         *(spec.get("initContainers") or [])])  # fmt: skip


def _guaranteed(resources: dict[str, Any] | None, want: Resources | None) -> bool:
    """CPU and memory limits equal to their requests, once ``want`` is applied."""
    res = resources or {}
    limits = {**(res.get("limits") or {}), **(want or {}).get("limits", {})}
    requests = res.get("requests") or {}
    for kind in ("cpu", "memory"):
        limit, request = limits.get(kind), requests.get(kind, limits.get(kind))
        if limit is None or request is None:
            return False
        if (parse_cpu(str(limit)) != parse_cpu(str(request))) if kind == "cpu" \
                else str(limit) != str(request):  # fmt: skip
            return False
    return True


def targets(pod: Pod, record: Record, *, undo: bool = False) -> dict[str, Resources]:
    """Each recorded container's CPU resources after the change (``undo``: before it):
    the limit, and on a Guaranteed pod the request with it (its QoS class stays).

    A Burstable pod whose new limit would equal its request, with every other resource
    already so, would become Guaranteed, which the API server refuses in place ("Pod QOS
    Class may not change as a result of resizing"): its limit is then 1m above the
    request, the smallest limit that keeps the class (0.1 ms more quota per period).
    A pod-level limit (``POD_ROW``) the same, in the pod's ``spec.resources``."""
    keep_guaranteed = guaranteed(pod)
    out: dict[str, Resources] = {}
    for c in record.containers:
        current = _resources(pod, c.name)
        if current is None:
            what = "pod-level resources" if is_pod_row(c.name) else f"container {c.name!r}"
            raise InPlaceError(f"pod {pod['metadata']['name']} has no {what}")
        limit = c.before.cpu_limit if undo else c.after.cpu_limit
        if limit is None:
            raise InPlaceError(f"{_what(c.name)} had no CPU limit: a resize cannot remove "
                               "one (the API server refuses it); a rollout can")  # fmt: skip
        quantity = format_cpu(limit)
        res: Resources = {"limits": {"cpu": quantity}}
        if keep_guaranteed:
            res["requests"] = {"cpu": quantity}
        else:
            request = _cpu(current, "requests")
            if request is not None and request > limit:
                raise InPlaceError(f"{_what(c.name)} of pod {pod['metadata'].get('name')} "
                                   f"requests {format_cpu(request)}, more than the limit "
                                   f"{quantity}: left as it is")  # fmt: skip
        out[c.name] = res
    if not keep_guaranteed and out and _would_be_guaranteed(pod, out):
        for c in record.containers:
            request = _cpu(_resources(pod, c.name), "requests")
            limits = out[c.name]["limits"]
            if request is not None and parse_cpu(str(limits["cpu"])) == request:
                limits["cpu"] = format_cpu(request + 1)
    return out


def _what(row: str) -> str:
    return "the pod-level limit" if is_pod_row(row) else f"container {row}"


def _matches(resources: dict[str, Any] | None, want: Resources, request_slack_m: int = 0) -> bool:
    for kind in want:
        have, asked = _cpu(resources, kind), _cpu(want, kind)
        slack = request_slack_m if kind == "requests" else 0
        if have is None or asked is None:
            if have != asked:
                return False
        elif abs(have - asked) > slack:
            return False
    return True


def resize_body(pod: Pod, want: dict[str, Resources]) -> dict[str, Any] | None:
    """The strategic merge patch for the pod's ``resize`` subresource (None: the spec
    already asks for ``want``): the containers that change, and the pod's own
    ``resources`` when its pod-level limit does."""
    spec: dict[str, Any] = {}
    changed = [{"name": name, "resources": res} for name, res in want.items()
               if not is_pod_row(name) and not _matches(_resources(pod, name), res)]  # fmt: skip
    if changed:
        spec["containers"] = changed
    own = want.get(POD_ROW)
    if own is not None and not _matches(_resources(pod, POD_ROW), own):
        spec["resources"] = own
    return {"spec": spec} if spec else None


@dataclass(frozen=True, slots=True)
class ResizeState:
    """How far the kubelet got with a pod's resize."""

    state: Literal["done", "asked", "resizing", "deferred", "infeasible", "error"]
    """``asked``: the spec does not ask for it yet; ``resizing``: asked, not reported."""
    message: str = ""


def resize_state(pod: Pod, want: dict[str, Resources]) -> ResizeState:
    """Where ``pod`` stands against ``want``, from its spec, its status and its conditions."""
    if resize_body(pod, want) is not None:
        return ResizeState("asked")
    status = pod.get("status") or {}
    generation = (pod.get("metadata") or {}).get("generation")
    seen = status.get("observedGeneration")
    if generation is not None and seen is not None and seen < generation:
        return ResizeState("resizing", "its kubelet has not seen the resize yet")
    for cond in status.get("conditions") or []:
        if cond.get("type") not in RESIZE_CONDITIONS or cond.get("status") != "True":
            continue
        observed = cond.get("observedGeneration")
        if generation is not None and observed is not None and observed < generation:
            return ResizeState("resizing", "its kubelet has not answered the resize yet")
        reason, message = cond.get("reason") or "", cond.get("message") or ""
        if cond["type"] == "PodResizePending" and reason in ("Deferred", "Infeasible"):
            return ResizeState("deferred" if reason == "Deferred" else "infeasible",
                               message or reason)  # fmt: skip
        if cond["type"] == "PodResizeInProgress" and reason == "Error":
            return ResizeState("error", message or reason)
        return ResizeState("resizing", message)
    reported = {s.get("name"): s.get("resources") for s in status.get("containerStatuses") or []}
    reported[POD_ROW] = status.get("resources")  # the pod-level limit, from the pod cgroup
    if all(_matches(reported.get(name), res, POD_SHARES_SLACK_M if is_pod_row(name) else 0)
           for name, res in want.items()):  # fmt: skip
        return ResizeState("done")
    if not any(reported.get(name) for name in want) and not _was_resized(pod):
        # A node whose kubelet reports no resources (one without in-place resize: the API
        # server refuses a resize of its pods; a virtual kubelet, kwok) never will: a pod
        # its spec never left is where it was asked to be. Waiting would never end.
        return ResizeState("done")
    return ResizeState("resizing", "the kubelet has not reported the new resources yet")


def _was_resized(pod: Pod) -> bool:
    """The pod's spec was changed since its creation (its ``generation`` moved past 1): a
    resize went through the API server."""
    generation = (pod.get("metadata") or {}).get("generation")
    return generation is not None and int(generation) > 1


def restarted_by_policy(pod: Pod, record: Record) -> list[str]:
    """The recorded containers whose ``resizePolicy`` restarts them on a CPU resize
    (``RestartContainer``): the kubelet restarts them to resize them."""
    containers = _containers(pod)
    return [c.name for c in record.containers
            if any(p.get("resourceName") == "cpu" and p.get("restartPolicy") == "RestartContainer"
                   for p in containers.get(c.name, {}).get("resizePolicy") or [])]  # fmt: skip


# -- burst ----------------------------------------------------------------------------------


def interim_burst(record: Record, *, undo: bool = False) -> str | None:
    """The burst annotation to hold while the quota changes: each container's smaller of
    its burst before and after, so that it fits under both quotas (None: the burst the pod
    starts from already does, or the record changes no burst of ours).

    A change starts from the burst before; its rollback (``undo``) from the burst after.
    So the rollback of a change that *raised* the burst lowers it first: the kernel would
    refuse the old, lower quota under the raised burst (EINVAL), and the kubelet would
    retry that write for ever (``PodResizeInProgress`` reason ``Error``)."""
    if record.burst_key != BURST_ANNOTATION:
        return None  # Koordinator's agent sizes its burst from the quota itself
    start = record.burst_after if undo else record.burst_before
    try:
        specs = burst_specs({BURST_ANNOTATION: start}) if start else {}
    except BurstAnnotationError:
        specs = {}
    lowered = False
    for c in record.containers:
        low = min(c.before.burst_us, c.after.burst_us)
        if low < (c.after.burst_us if undo else c.before.burst_us):
            specs[c.name], lowered = BurstSpec(burst_us=low), True
    if not lowered:
        return None
    return ",".join(f"{name}={_text(spec)}" for name, spec in sorted(specs.items()))


def _text(spec: BurstSpec) -> str:
    return f"{spec.percent:g}%" if spec.percent is not None else burst_text(spec.burst_us or 0)


def interim_bursts_us(record: Record) -> dict[str, int]:
    """Per container, the burst the interim annotation gives, µs."""
    return {c.name: min(c.before.burst_us, c.after.burst_us) for c in record.containers}


def burst_annotation(pod: Pod, key: str) -> str | None:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(key)


def annotation_patch(key: str, value: str | None) -> dict[str, Any]:
    """A merge patch that sets (None: removes) one annotation of a pod."""
    return {"metadata": {"annotations": {key: value}}}


# -- admission ------------------------------------------------------------------------------


def admission_patch(pod: Pod, record: Record) -> dict[str, Any] | None:
    """For a pod being created by the record's ReplicaSet: a merge patch that gives it the
    applied settings (its containers with the new CPU resources, and the burst annotation),
    or None when the record does not cover it. GOMAXPROCS is an env var, which only a
    rollout changes: it is left alone."""
    replicaset = owner_replicaset(pod)
    if replicaset is None or not record.admits(replicaset):
        return None
    want = targets(pod, record)
    spec = pod.get("spec") or {}
    containers = copy.deepcopy(spec.get("containers") or [])
    for c in containers:
        for kind, values in want.get(c["name"], {}).items():
            c.setdefault("resources", {}).setdefault(kind, {}).update(values)
    patch: dict[str, Any] = {"spec": {"containers": containers}}
    if POD_ROW in want:  # the pod-level limit (a merge patch replaces no sibling key)
        own = copy.deepcopy(spec.get("resources") or {})
        for kind, values in want[POD_ROW].items():
            own.setdefault(kind, {}).update(values)
        patch["spec"]["resources"] = own
    if record.burst_key is not None:
        patch["metadata"] = {"annotations": {record.burst_key: record.burst_after}}
    return patch
