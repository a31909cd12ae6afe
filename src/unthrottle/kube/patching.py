"""JSON Patches (RFC 6902) that change a Deployment's CPU limit, GOMAXPROCS and burst
annotation, and undo them, with the record of what was there before. Pure.

Every patch guards what it changes: it ``test``s the Deployment's ``resourceVersion`` as
it was read, and each managed container's name at its index, so a Deployment that changed
since it was read is never patched blindly (the API server refuses the whole patch: 422).
A ``test`` tests only such small ASCII values: the API server compares the bytes of its
own Go encoding of the object with the patch's value, and Go writes ``&``, ``<`` and
``>`` as ``\u0026``… and other text as raw UTF-8, where the client's JSON does neither
and the other, so testing a whole container, a command with ``&&`` or an accented
annotation would fail on a Deployment that did not change. The same patch writes the record
``unthrottle.io/last-applied`` on the Deployment, so a change and its record land
together or not at all; rollback and restarts work from the record alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from unthrottle.model.burst import (
    BURST_ANNOTATION,
    KOORDINATOR_ANNOTATION,
    BurstAnnotationError,
    BurstSpec,
    burst_specs,
)
from unthrottle.model.podlevel import POD_ROW, is_pod_row
from unthrottle.units import DEFAULT_PERIOD_US, format_cpu, parse_cpu, quota_of

RECORD_ANNOTATION = "unthrottle.io/last-applied"
RECORD_VERSION = 1


class RecordError(ValueError):
    """A record annotation that cannot be read (hand-edited, or from a newer version)."""


class PatchPlanError(ValueError):
    """A change that cannot be expressed on this Deployment (the message says why)."""


def pointer(*parts: object) -> str:
    """A JSON Pointer (RFC 6901) from path parts, each escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


@dataclass(frozen=True, slots=True)
class Settings:
    """What unthrottle changes on one container (CPU limit in millicores, burst in µs)."""

    cpu_limit: int | None
    burst_us: int
    gomaxprocs: int | None


@dataclass(frozen=True, slots=True)
class ContainerChange:
    """One container's change: before and after, and the throttling it answers."""

    name: str
    before: Settings
    after: Settings
    ratio_before: float | None
    expected_ratio: float | None
    gomaxprocs_ours: bool = False
    """GOMAXPROCS is ours to set: absent before, or set by an earlier record of ours."""
    env_absent: bool = False
    """The container had no ``env`` at all: a rollback removes the list we added."""
    period_us: int = DEFAULT_PERIOD_US
    """The container's CFS period (its node's kubelet setting): its quota is
    ``limit × period / 1000`` µs, and a burst is sized against that."""

    @property
    def quota_us(self) -> int:
        """The quota the new limit gives at the container's period, µs (0: no limit)."""
        return quota_of(self.after.cpu_limit or 0, self.period_us)


@dataclass(frozen=True, slots=True)
class Record:
    """``unthrottle.io/last-applied``: what a policy changed, when, and the verdict."""

    policy: str
    policy_uid: str
    policy_generation: int
    at: float
    """Unix time of the change."""
    containers: tuple[ContainerChange, ...]
    burst_key: str | None = None
    burst_before: str | None = None
    burst_after: str | None = None
    burst_map_absent: bool = False
    """The pod template had no annotations: a rollback removes the map we added."""
    generation: int | None = None
    """The Deployment's metadata.generation the change gives (its rollout is that one)."""
    rollout_done_at: float | None = None
    verdict: str | None = None
    """None while in verification; ``Applied`` or ``RolledBack`` after."""
    verdict_at: float | None = None
    verdict_reason: str | None = None
    ratio_after: dict[str, float | None] = field(default_factory=dict)
    method: str = "Rollout"
    """``Rollout`` (the pod template was patched) or ``InPlace`` (the running pods are
    resized through their ``resize`` subresource; the template is left as it was)."""
    replicaset: str | None = None
    """InPlace: the ReplicaSet whose pods are resized (and whose new pods the admission
    webhook gives the applied settings); a later rollout's ReplicaSet is left alone."""
    canary: str | None = None
    """InPlace: the pod resized first and verified alone."""
    canary_done_at: float | None = None
    """InPlace: when the kubelet reported the canary's resize done (verification starts)."""
    canary_verified_at: float | None = None
    """InPlace: when the canary passed; from then on the rest are resized, and new pods of
    ``replicaset`` get the applied settings at admission."""
    resized: tuple[str, ...] = ()
    """InPlace: the pods whose resize was sent (a rollback resizes these back)."""
    undo: str | None = None
    """InPlace: why the resized pods are being resized back (a rollback in progress: it
    takes a step per pod, so it is recorded before the first; the verdict RolledBack
    follows when every pod is back)."""
    resize_sent_at: dict[str, float] = field(default_factory=dict)
    """InPlace: when each pod's latest resize (forward or back) was sent, on the operator's
    clock; a resize still in progress or in Error past ``resize_timeout_s`` is given up."""
    template: str | None = None
    """The Deployment's pod template apart from what unthrottle changes (its fingerprint,
    :func:`template_fingerprint`): a RolledBack change is tried again when the team changed
    the template, not when the Deployment was only scaled (which raises its generation)."""

    def to_annotation(self) -> str:
        body = asdict(self)
        body["version"] = RECORD_VERSION
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_annotation(text: str) -> Record:
        try:
            body = json.loads(text)
            if body.pop("version", None) != RECORD_VERSION:
                raise RecordError(f"{RECORD_ANNOTATION}: not a version {RECORD_VERSION} record")
            changes = tuple(
                ContainerChange(
                    **{**c, "before": Settings(**c["before"]), "after": Settings(**c["after"])}
                )
                for c in body.pop("containers")
            )
            body["resized"] = tuple(body.get("resized") or ())
            return Record(containers=changes, **body)
        except RecordError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise RecordError(f"{RECORD_ANNOTATION}: cannot be read ({error})") from None

    def in_verification(self) -> bool:
        return self.verdict is None

    @property
    def in_place(self) -> bool:
        return self.method == "InPlace"

    def admits(self, replicaset: str) -> bool:
        """New pods of ``replicaset`` get this record's settings at admission: an InPlace
        change past its canary, not rolled back, on that ReplicaSet."""
        return (self.in_place and self.replicaset == replicaset
                and self.canary_verified_at is not None and self.undo is None
                and self.verdict in (None, "Applied"))  # fmt: skip


def record_text(deployment: dict[str, Any]) -> str | None:
    """The Deployment's record annotation as stored, unparsed (None: no record)."""
    return ((deployment.get("metadata") or {}).get("annotations") or {}).get(RECORD_ANNOTATION)


def record_of(deployment: dict[str, Any]) -> Record | None:
    """The Deployment's record, or None (RecordError when there is one we cannot read)."""
    text = record_text(deployment)
    return None if text is None else Record.from_annotation(text)


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((deployment.get("spec") or {}).get("template") or {}).get("spec", {})
                .get("containers") or [])  # fmt: skip


def _index(deployment: dict[str, Any], name: str) -> int:
    for i, c in enumerate(_containers(deployment)):
        if c.get("name") == name:
            return i
    raise PatchPlanError(f"the pod template has no container {name!r}")


def _rows(deployment: dict[str, Any], names: Iterable[str]
          ) -> tuple[dict[str, int], dict[str, tuple[str, dict[str, Any]]]]:  # fmt: skip
    """The containers' indexes (what :func:`_guard` tests), and each row's JSON pointer
    and object: a container's, or for the pod-level limit's row
    (:data:`~unthrottle.model.podlevel.POD_ROW`) the pod template's spec, whose
    ``resources`` it is."""
    names = list(names)
    indexes = {name: _index(deployment, name) for name in names if not is_pod_row(name)}
    containers = _containers(deployment)
    rows = {name: (pointer("spec", "template", "spec", "containers", i), containers[i])
            for name, i in indexes.items()}  # fmt: skip
    if any(is_pod_row(name) for name in names):
        spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
        rows[POD_ROW] = (pointer("spec", "template", "spec"), spec)
    return indexes, rows


def burst_text(burst_us: int) -> str:
    """A burst as our annotation writes it: ``20ms``, ``2500us``, ``0``."""
    if burst_us == 0:
        return "0"
    return f"{burst_us // 1000}ms" if burst_us % 1000 == 0 else f"{burst_us}us"


def _spec_text(spec: BurstSpec) -> str:
    if spec.percent is not None:
        return f"{spec.percent:g}%"
    return burst_text(spec.burst_us or 0)


def _burst_value(annotations: dict[str, str], changes: list[ContainerChange],
                 quota_us: dict[str, int]) -> tuple[str, str | None, str]:  # fmt: skip
    """(annotation key, value before, value after) for the template's burst annotation."""
    if KOORDINATOR_ANNOTATION in annotations and BURST_ANNOTATION not in annotations:
        before = annotations[KOORDINATOR_ANNOTATION]
        try:
            config = json.loads(before)
        except json.JSONDecodeError:
            config = {}
        if not isinstance(config, dict):
            config = {}
        # Koordinator gives every container one share of its quota: the largest asked for
        percent = max(
            100 * c.after.burst_us / quota_us[c.name] for c in changes if quota_us[c.name]
        )
        config.update({"policy": "auto", "cpuBurstPercent": round(percent)})
        return KOORDINATOR_ANNOTATION, before, json.dumps(config, sort_keys=True)
    ours = annotations.get(BURST_ANNOTATION)
    try:
        specs = burst_specs({BURST_ANNOTATION: ours}) if ours is not None else {}
    except BurstAnnotationError:
        specs = {}  # unreadable: the agent ignores it too; ours replaces it
    for c in changes:
        specs[c.name] = BurstSpec(burst_us=c.after.burst_us)
    after = ",".join(f"{name}={_spec_text(spec)}" for name, spec in sorted(specs.items()))
    return BURST_ANNOTATION, ours, after


def _set_env(container: dict[str, Any], base: str, value: int | None,
             ops: list[dict[str, Any]], *, drop_empty: bool = False) -> None:  # fmt: skip
    """Set (or, with None, remove) GOMAXPROCS in a container's env; ``drop_empty``: remove
    the env list too when that leaves it empty (it was absent before)."""
    env = container.get("env")
    index = next((i for i, e in enumerate(env or []) if e.get("name") == "GOMAXPROCS"), None)
    if value is None:
        if index is not None and drop_empty and len(env or []) == 1:
            ops.append({"op": "remove", "path": f"{base}/env"})
        elif index is not None:
            ops.append({"op": "remove", "path": f"{base}/env/{index}"})
        return
    entry = {"name": "GOMAXPROCS", "value": str(value)}
    if env is None:
        ops.append({"op": "add", "path": f"{base}/env", "value": [entry]})
    elif index is None:
        ops.append({"op": "add", "path": f"{base}/env/-", "value": entry})
    else:
        ops.append({"op": "replace", "path": f"{base}/env/{index}", "value": entry})


def _set_limit(container: dict[str, Any], base: str, millicores: int | None,
               ops: list[dict[str, Any]]) -> None:  # fmt: skip
    resources = container.get("resources")
    if millicores is None:
        if resources and (resources.get("limits") or {}).get("cpu") is not None:
            ops.append({"op": "remove", "path": f"{base}/resources/limits/cpu"})
        return
    quantity = format_cpu(millicores)
    if not resources:
        ops.append(
            {"op": "add", "path": f"{base}/resources", "value": {"limits": {"cpu": quantity}}}
        )
    elif not resources.get("limits"):
        ops.append({"op": "add", "path": f"{base}/resources/limits", "value": {"cpu": quantity}})
    else:
        ops.append({"op": "add", "path": f"{base}/resources/limits/cpu", "value": quantity})


def _version(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """Test the ``resourceVersion`` as read: any change since (spec, metadata or status)
    makes the API server refuse the patch whole (422). Digits only, so the server's Go
    encoding and ours agree byte for byte."""
    version = (deployment.get("metadata") or {}).get("resourceVersion")
    if version is None:  # never from an API server: a hand-made object
        return []
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]


def _guard(deployment: dict[str, Any], indexes: dict[str, int]) -> list[dict[str, Any]]:
    """Tests: the ``resourceVersion`` as read, and each container's name at its index
    (a DNS label: plain ASCII) so an index never points at another container."""
    ops = _version(deployment)
    for name, i in sorted(indexes.items(), key=lambda kv: kv[1]):
        base = pointer("spec", "template", "spec", "containers", i)
        ops.append({"op": "test", "path": f"{base}/name", "value": name})
    return ops


def _annotation_ops(meta: dict[str, Any] | None, base: str, key: str, value: str | None,
                    *, drop_empty: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Set (or remove, with None) one annotation under ``base`` (a metadata pointer);
    ``drop_empty``: remove the map too when that leaves it empty (it was absent before)."""
    annotations = (meta or {}).get("annotations")
    if value is None:
        if annotations and key in annotations:
            if drop_empty and len(annotations) == 1:
                return [{"op": "remove", "path": f"{base}/annotations"}]
            return [{"op": "remove", "path": f"{base}/annotations{pointer(key)}"}]
        return []
    if meta is None:
        return [{"op": "add", "path": base, "value": {"annotations": {key: value}}}]
    if annotations is None:
        return [{"op": "add", "path": f"{base}/annotations", "value": {key: value}}]
    return [{"op": "add", "path": f"{base}/annotations{pointer(key)}", "value": value}]


def _record_ops(deployment: dict[str, Any], record: Record) -> list[dict[str, Any]]:
    """Write the record (the caller's ``resourceVersion`` test keeps two writers from both
    winning; the record itself is never tested: its reasons hold non-ASCII text)."""
    meta = deployment.get("metadata") or {}
    return _annotation_ops(meta, "/metadata", RECORD_ANNOTATION, record.to_annotation())


def apply_patch(deployment: dict[str, Any], record: Record) -> list[dict[str, Any]]:
    """The patch that makes the record's ``after`` settings true, and writes the record."""
    changes = list(record.containers)
    indexes, rows = _rows(deployment, (c.name for c in changes))
    ops = _guard(deployment, indexes)
    for c in changes:
        base, row = rows[c.name]
        if c.after.cpu_limit != c.before.cpu_limit:
            _set_limit(row, base, c.after.cpu_limit, ops)
        if c.gomaxprocs_ours and c.after.gomaxprocs != c.before.gomaxprocs:
            _set_env(row, base, c.after.gomaxprocs, ops)
    if record.burst_key is not None:
        template_meta = deployment["spec"]["template"].get("metadata")
        ops += _annotation_ops(template_meta, "/spec/template/metadata", record.burst_key,
                               record.burst_after)  # fmt: skip
    return ops + _record_ops(deployment, record)


def plan(deployment: dict[str, Any], changes: list[ContainerChange], *, policy: str,
         policy_uid: str, policy_generation: int, now: float) -> Record:  # fmt: skip
    """The record of a change: the burst annotation's before and after resolved here."""
    meta = deployment.get("metadata") or {}
    template_meta = deployment["spec"]["template"].get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    key = before = after = None
    if any(c.after.burst_us != c.before.burst_us for c in changes):
        quota = {c.name: c.quota_us for c in changes}
        key, before, after = _burst_value(annotations, changes, quota)
    containers = {c.get("name"): c for c in _containers(deployment)}
    changes = [replace(c, env_absent=containers.get(c.name, {}).get("env") is None)
               for c in changes]  # fmt: skip
    return Record(
        policy=policy, policy_uid=policy_uid, policy_generation=policy_generation, at=now,
        containers=tuple(changes), burst_key=key, burst_before=before, burst_after=after,
        burst_map_absent=template_meta.get("annotations") is None,
        generation=int(meta.get("generation") or 0) + 1,
        template=template_fingerprint(deployment),
    )  # fmt: skip


def rollback_patch(deployment: dict[str, Any], record: Record, *, now: float,
                   reason: str) -> tuple[list[dict[str, Any]], Record]:  # fmt: skip
    """The patch that restores the record's ``before`` settings and marks it RolledBack.

    Only values still as the record left them are restored: a limit somebody changed
    since is theirs, and the rollback says so (PatchPlanError) rather than overwrite it."""
    indexes, rows = _rows(deployment, (c.name for c in record.containers))
    ops = _guard(deployment, indexes)
    for c in record.containers:
        base, container = rows[c.name]
        limit = ((container.get("resources") or {}).get("limits") or {}).get("cpu")
        if (parse_cpu(limit) if limit is not None else None) != c.after.cpu_limit:
            what = "the pod's" if is_pod_row(c.name) else f"container {c.name}'s"
            raise PatchPlanError(f"{what} CPU limit changed since unthrottle set "
                                 f"it ({limit}): left as it is")  # fmt: skip
        if c.after.cpu_limit != c.before.cpu_limit:
            _set_limit(container, base, c.before.cpu_limit, ops)
        if c.gomaxprocs_ours and c.after.gomaxprocs != c.before.gomaxprocs:
            _set_env(container, base, c.before.gomaxprocs, ops, drop_empty=c.env_absent)
    if record.burst_key is not None:
        template_meta = deployment["spec"]["template"].get("metadata")
        ops += _annotation_ops(template_meta, "/spec/template/metadata", record.burst_key,
                               record.burst_before, drop_empty=record.burst_map_absent)  # fmt: skip
    done = replace(record, verdict="RolledBack", verdict_at=now, verdict_reason=reason,
                   generation=int(deployment["metadata"].get("generation") or 0) + 1)  # fmt: skip
    return ops + _record_ops(deployment, done), done


def template_fingerprint(deployment: dict[str, Any]) -> str:
    """A hash of the Deployment's pod template without what unthrottle sets in it (each
    container's CPU limit and GOMAXPROCS, the burst annotations): the same before a change,
    after it and after its rollback, and different once the team edits the template."""
    template = copy.deepcopy((deployment.get("spec") or {}).get("template") or {})
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    for key in (BURST_ANNOTATION, KOORDINATOR_ANNOTATION):
        annotations.pop(key, None)
    spec = template.get("spec") or {}
    ((spec.get("resources") or {}).get("limits") or {}).pop("cpu", None)  # a pod-level limit
    for c in spec.get("containers") or []:
        ((c.get("resources") or {}).get("limits") or {}).pop("cpu", None)
        c["env"] = [e for e in c.get("env") or [] if e.get("name") != "GOMAXPROCS"]
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record_patch(deployment: dict[str, Any], record: Record) -> list[dict[str, Any]]:
    """A patch that only rewrites the record (rollout seen done, verdict Applied)."""
    return _version(deployment) + _record_ops(deployment, record)
