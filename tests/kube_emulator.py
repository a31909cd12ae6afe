"""A Kubernetes API emulator good enough for a real Kopf operator and the real client.

kmock's ``KubernetesEmulator`` gives discovery, request recording and an HTTP port; this
subclass replaces its object handling with the semantics an operator meets on a real API
server: ``uid``, ``creationTimestamp``, a cluster-wide ``resourceVersion`` (409 when
stale), ``generation`` (bumped by spec changes only), ``generateName``, PUT, JSON / merge /
strategic-merge patches by Content-Type (a failed JSON Patch ``test`` is 422 and applies
nothing), a separate ``/status`` subresource, ``dryRun=All``, label and field selectors,
pagination, watches that start after their ``resourceVersion`` (or with the current objects
when none is given), ``timeoutSeconds``, finalizers and namespaces.

``KubeEmulator`` runs it on a real port in a thread of its own, so synchronous code (the
``kubernetes`` client) and other processes (``kopf run``) can use it; its helpers are
thread-safe and let a test play the controllers (``complete_rollout``) or break the server
(``fail_next``). What no emulator can catch (CRD schema validation and pruning, defaulting
beyond a Deployment's top level, admission, RBAC, garbage collection) belongs to the
real-cluster suite.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import copy
import datetime
import json
import random
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import apps, rendering

Obj = dict[str, Any]
T = TypeVar("T")

# ----------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class ResourceSpec:
    """One served resource, as discovery shows it and as the server treats it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    shortnames: tuple[str, ...] = ()
    custom: bool = False  # a custom resource: no strategic merge patch (415), as on a real server

    @property
    def key(self) -> str:
        """``v1/pods``, ``apps/v1/deployments``: the notation the helpers take."""
        return f"{self.api_version}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def ref(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)

    @property
    def qualified(self) -> str:
        """As real error messages name it: ``deployments.apps``, ``pods``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


def _core(plural: str, kind: str, **kw: Any) -> ResourceSpec:
    return ResourceSpec("", "v1", plural, kind, **kw)


STATUS = ("status",)
DEFAULT_RESOURCES: tuple[ResourceSpec, ...] = (
    _core("pods", "Pod", subresources=STATUS, shortnames=("po",)),
    _core("events", "Event", shortnames=("ev",)),
    _core("configmaps", "ConfigMap", shortnames=("cm",)),
    _core("secrets", "Secret"),
    _core("namespaces", "Namespace", namespaced=False, subresources=STATUS, shortnames=("ns",)),
    _core("nodes", "Node", namespaced=False, subresources=STATUS, shortnames=("no",)),
    ResourceSpec("apps", "v1", "deployments", "Deployment", subresources=STATUS,
                 shortnames=("deploy",)),
    ResourceSpec("apps", "v1", "replicasets", "ReplicaSet", subresources=STATUS,
                 shortnames=("rs",)),
    ResourceSpec("events.k8s.io", "v1", "events", "Event", shortnames=("ev",)),
    ResourceSpec("unthrottle.io", "v1alpha1", "throttlepolicies", "ThrottlePolicy",
                 subresources=STATUS, shortnames=("tpol",), custom=True),
)  # fmt: skip
VPA = ResourceSpec("autoscaling.k8s.io", "v1", "verticalpodautoscalers", "VerticalPodAutoscaler",
                   subresources=STATUS, shortnames=("vpa",), custom=True)  # fmt: skip
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

# Field selectors a real server accepts beyond metadata.name / metadata.namespace.
FIELD_LABELS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset({"spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                             "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                             "status.podIP", "status.nominatedNodeName"}),
    ("", "events"): frozenset({"involvedObject.kind", "involvedObject.namespace",
                               "involvedObject.name", "involvedObject.uid",
                               "involvedObject.apiVersion", "involvedObject.resourceVersion",
                               "involvedObject.fieldPath", "reason", "reportingComponent",
                               "source", "type"}),
    ("events.k8s.io", "events"): frozenset({"regarding.kind", "regarding.namespace",
                                            "regarding.name", "regarding.uid", "reason",
                                            "reportingController", "type"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("apps", "replicasets"): frozenset({"status.replicas"}),
}  # fmt: skip

# ----------------------------------------------------------------------------- errors


class KubeError(Exception):
    """An API error, answered as a Kubernetes ``Status`` with its code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def body(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}  # fmt: skip
        if self.details:
            body["details"] = self.details
        return body


def _details(spec: ResourceSpec, name: str | None) -> Obj:
    details: Obj = {"name": name or "", "kind": spec.plural}
    if spec.group:
        details["group"] = spec.group
    return details


def not_found(spec: ResourceSpec, name: str | None) -> KubeError:
    return KubeError(404, "NotFound", f'{spec.qualified} "{name}" not found', _details(spec, name))


def conflict(spec: ResourceSpec, name: str | None, why: str = "") -> KubeError:
    why = why or (
        "the object has been modified; please apply your changes to the latest "
        "version and try again"
    )
    return KubeError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {spec.qualified} "{name}": {why}',
        _details(spec, name),
    )


def invalid(spec: ResourceSpec, name: str | None, why: str) -> KubeError:
    details = _details(spec, name) | {"kind": spec.kind, "causes": [{"message": why}]}
    message = f'{spec.kind}{"." + spec.group if spec.group else ""} "{name}" is invalid: {why}'
    return KubeError(422, "Invalid", message, details)


def bad_request(message: str) -> KubeError:
    return KubeError(400, "BadRequest", message)


REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
           405: "MethodNotAllowed", 409: "Conflict", 410: "Gone", 415: "UnsupportedMediaType",
           422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip

# ----------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# The lists a strategic merge patch merges by a key (Kubernetes' patchMergeKey tags), and
# the primitive lists it merges as sets. Any other list is replaced, as on a real server.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "env": "name", "volumes": "name", "imagePullSecrets": "name",
              "volumeMounts": "mountPath", "volumeDevices": "devicePath", "conditions": "type",
              "ownerReferences": "uid", "hostAliases": "ip"}  # fmt: skip
SET_LISTS = frozenset({"finalizers"})
_DELETE = object()


def _merge_key(key: str, *lists: Any) -> str | None:
    if key == "ports":  # containerPort in a pod's containers, port in a Service
        items = [i for li in lists if isinstance(li, list) for i in li if isinstance(i, dict)]
        return "containerPort" if any("containerPort" in i for i in items) else "port"
    return MERGE_KEYS.get(key)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch as the API server applies one to built-in resources.

    Dicts merge; ``null`` removes; lists named in ``MERGE_KEYS`` merge item by item on their
    key (``$patch: delete`` removes an item); ``finalizers`` merge as a set; the directives
    ``$patch: replace|delete``, ``$deleteFromPrimitiveList/…``, ``$retainKeys`` and
    ``$setElementOrder/…`` are understood (element order is not enforced).
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return strategic_merge_patch({}, {k: v for k, v in patch.items() if k != "$patch"})
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/"):
            continue
        if key == "$retainKeys":
            result = {k: v for k, v in result.items() if k in value or k in patch}
        elif key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(key: str, target: Any, patch: list[Any]) -> list[Any]:
    target = target if isinstance(target, list) else []
    if key in SET_LISTS:
        return list(target) + [x for x in patch if x not in target]
    mkey = _merge_key(key, target, patch)
    if mkey is None or not all(isinstance(i, dict) for i in patch):
        return [strategic_merge_patch({}, i) if isinstance(i, dict) else i for i in patch]
    if {"$patch": "replace"} in patch:
        return [strategic_merge_patch({}, i) for i in patch if i != {"$patch": "replace"}]
    result = list(target)
    for item in patch:
        if mkey not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {mkey}")
        at = next((n for n, old in enumerate(result) if old.get(mkey) == item[mkey]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append(strategic_merge_patch({}, item))
        else:
            result[at] = strategic_merge_patch(result[at], item)
    return result


def json_patch(spec: ResourceSpec, name: str, target: Obj, ops: Any) -> Obj:
    """RFC 6902, all or nothing: a failed ``test`` (or a bad path) is 422, as on a real server."""
    if not isinstance(ops, list):
        raise bad_request("a JSON Patch must be a list of operations")
    try:
        result = jsonpatch.JsonPatch(ops).apply(target)
    except jsonpatch.InvalidJsonPatch as e:
        raise bad_request(f"invalid JSON Patch: {e}") from e
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
        raise invalid(spec, name, f"the JSON Patch could not be applied: {e}") from e
    if not isinstance(result, dict):
        raise invalid(spec, name, "the JSON Patch replaced the whole object")
    return result


# ----------------------------------------------------------------------------- selectors

_KEY = r"[^\s,=!()]+"
_REQUIREMENT = re.compile(
    rf"\s*(?:!\s*(?P<absent>{_KEY})"
    rf"|(?P<skey>{_KEY})\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)"
    rf"|(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>[^\s,=!()]*)"
    rf"|(?P<exists>{_KEY}))\s*(?:,|$)"
)


@dataclass(frozen=True)
class LabelSelector:
    """``a=b``, ``a==b``, ``a!=b``, ``a in (b,c)``, ``a notin (b)``, ``a``, ``!a``, comma-joined."""

    requirements: tuple[tuple[str, str, frozenset[str]], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        found: list[tuple[str, str, frozenset[str]]] = []
        pos, text = 0, (text or "").strip()
        while pos < len(text):
            m = _REQUIREMENT.match(text, pos)
            if not m or m.end() == pos:
                raise bad_request(f"unable to parse requirement: {text[pos:]!r}")
            pos = m.end()
            if m["absent"]:
                found.append((m["absent"], "!", frozenset()))
            elif m["skey"]:
                values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
                found.append((m["skey"], m["setop"], values))
            elif m["key"]:
                found.append((m["key"], "!=" if m["op"] == "!=" else "=", frozenset([m["value"]])))
            else:
                found.append((m["exists"], "exists", frozenset()))
        return cls(tuple(found))

    def matches(self, labels: dict[str, str]) -> bool:
        for key, op, values in self.requirements:
            value = labels.get(key)
            ok = {
                "exists": value is not None,
                "!": value is None,
                "=": value in values,
                "in": value in values,
                "!=": value not in values,
                "notin": value not in values,
            }[op]
            if not ok:
                return False
        return True


@dataclass(frozen=True)
class FieldSelector:
    """``metadata.name=x``, ``metadata.namespace!=y`` and a resource's own field labels."""

    requirements: tuple[tuple[str, bool, str], ...] = ()

    @classmethod
    def parse(cls, text: str | None, spec: ResourceSpec) -> FieldSelector:
        allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(
            (spec.group, spec.plural), frozenset()
        )
        found = []
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            m = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", part)
            if not m:
                raise bad_request(f"invalid field selector: {part!r}")
            if m[1] not in allowed:
                raise bad_request(f'field label not supported: "{m[1]}"')
            found.append((m[1], m[2] != "!=", m[3]))
        return cls(tuple(found))

    def matches(self, obj: Obj) -> bool:
        for path, equal, value in self.requirements:
            node: Any = obj
            for part in ("source.component" if path == "source" else path).split("."):
                node = node.get(part) if isinstance(node, dict) else None
            text = (
                "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
            )
            if (text == value) != equal:
                return False
        return True


# ----------------------------------------------------------------------------- validation

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as the API server's generateName suffixes


def _valid_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(prefix)))) and (
        len(name) <= 63 and bool(_QUALIFIED.fullmatch(name))
    )


def validate_metadata(spec: ResourceSpec, meta: Obj) -> None:
    """What a real server refuses in metadata: non-string maps (400), bad names or labels (422)."""
    name = meta.get("name", "")
    for field_name in ("labels", "annotations"):
        values = meta.get(field_name) or {}
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise bad_request(
                f"json: cannot unmarshal metadata.{field_name}: values must be strings"
            )
        for key, value in values.items():
            if not _valid_key(key):
                raise invalid(spec, name, f"metadata.{field_name}: Invalid value: {key!r}")
            if field_name == "labels" and (len(value) > 63 or not _LABEL_VALUE.fullmatch(value)):
                raise invalid(spec, name, f"metadata.labels: Invalid value: {value!r}")
    pattern = _DNS_LABEL if spec.plural == "namespaces" else _DNS_SUBDOMAIN.pattern
    if len(name) > 253 or not re.fullmatch(pattern, name):
        raise invalid(
            spec,
            name,
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 "
            "subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _typed(spec: ResourceSpec, obj: Obj) -> Obj:
    """The object with its apiVersion and kind, first, as a real server shows them."""
    rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    return {"apiVersion": spec.api_version, "kind": spec.kind, **rest}


def _body_of(obj: Obj) -> Obj:
    """What ``generation`` follows: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _tidy(meta: Obj) -> None:
    """Empty maps and lists are omitted by a real server (``omitempty``)."""
    for key in ("finalizers", "labels", "annotations", "ownerReferences"):
        if key in meta and not meta[key]:
            del meta[key]


def _defaults(spec: ResourceSpec, obj: Obj) -> None:
    """The defaults a real server applies that operators commonly read."""
    if spec.key == "apps/v1/deployments":
        s = obj.setdefault("spec", {})
        s.setdefault("replicas", 1)
        s.setdefault("revisionHistoryLimit", 10)
        s.setdefault("progressDeadlineSeconds", 600)
        s.setdefault(
            "strategy",
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
            },
        )
    elif spec.key == "v1/namespaces":
        name = obj["metadata"]["name"]
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})


# ----------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class ParsedPath:
    group: str
    version: str | None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> ParsedPath | None:
    """Split an API path; ``/api/v1/namespaces[/NAME[/status]]`` is the namespaces resource."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) == 2 and parts[0] == "apis":
        return ParsedPath(parts[1], None)
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    return ParsedPath(
        group,
        version,
        rest[0] if rest else None,
        namespace,
        rest[1] if len(rest) > 1 else None,
        "/".join(rest[2:]) or None,
    )


# ----------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class SeenRequest:
    """A request the emulator received."""

    method: str
    path: str
    query: dict[str, str]
    body: Any  # the decoded JSON, or the text, or None
    content_type: str


@dataclass
class Fault:
    """The next ``count`` requests matching ``method`` and ``path`` (a regex, searched) fail."""

    method: str | None
    path: str
    status: int | None = 500
    count: int = 1
    delay: float = 0.0
    disconnect: bool = False

    def matches(self, method: str, path: str) -> bool:
        wanted = self.method is None or self.method.upper() == method.upper()
        return self.count > 0 and wanted and re.search(self.path, path) is not None


@dataclass(frozen=True)
class _Change:
    rv: int
    key: str
    type: str  # ADDED, MODIFIED, DELETED
    old: Obj | None
    new: Obj | None


@dataclass(eq=False)
class _Watcher:
    spec: ResourceSpec
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)

    def _selects(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        return (self.namespace is None or meta.get("namespace") == self.namespace) and (
            self.labels.matches(meta.get("labels") or {}) and self.fields.matches(obj)
        )

    def event(self, change: _Change) -> Obj | None:
        """The event this watcher sees; objects leaving its selector are DELETED to it."""
        if change.key != self.spec.key:
            return None
        was, now = self._selects(change.old), self._selects(change.new)
        if was and now:
            return {"type": change.type, "object": change.new}
        if now:
            return {"type": "ADDED", "object": change.new}
        if was:
            return {"type": "DELETED", "object": change.new or change.old}
        return None


@attrs.define(kw_only=True)
class KubeApi(kmock.KubernetesEmulator):
    """The emulator itself, for one event loop. ``KubeEmulator`` runs it in a thread."""

    vpa: bool = False
    extra_resources: tuple[ResourceSpec, ...] = ()
    auto_namespaces: bool = True  # a namespace springs into being with its first object
    namespaces: tuple[str, ...] = ("default", "kube-system")
    _specs: dict[tuple[str, str, str], ResourceSpec] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1000, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _changes: list[_Change] = attrs.field(factory=list, init=False)
    _watchers: set[_Watcher] = attrs.field(factory=set, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)
    internal_errors: list[str] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for spec in (*DEFAULT_RESOURCES, *((VPA,) if self.vpa else ()), *self.extra_resources):
            self.register(spec)
        for name in self.namespaces:
            self.put_object(self.spec("v1/namespaces"), {"metadata": {"name": name}})

    def register(self, spec: ResourceSpec) -> None:
        """Serve one more resource (discovery included)."""
        self._specs[spec.group, spec.version, spec.plural] = spec
        self.resources[spec.ref] = kmock.ResourceInfo(
            kind=spec.kind,
            singular=spec.kind.lower(),
            namespaced=spec.namespaced,
            verbs=set(VERBS),
            shortnames=set(spec.shortnames),
            subresources=set(spec.subresources),
        )

    def spec(self, resource: str) -> ResourceSpec:
        """The served resource for ``v1/pods``, ``apps/v1/deployments`` and the like."""
        ref = kmock.resource(resource)
        found = self._specs.get((ref.group or "", ref.version or "", ref.plural or ""))
        if found is None:
            raise KeyError(f"{resource!r} is not served; register() it")
        return found

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    # --- HTTP entry: kmock's parser crashes on /api/v1/namespaces, so requests are parsed here.

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw.read()
        try:
            request = self._parse(raw, body)
            self._requests.append(request)
            return await self._handle(request)
        except KubeError as e:
            return aiohttp.web.json_response(e.body(), status=e.code)
        except kmock.KubernetesError as e:  # from kmock's discovery: unknown groups and paths
            error = KubeError(e.status, REASONS.get(e.status, "InternalError"),
                              "the server could not find the requested resource")  # fmt: skip
            return aiohttp.web.json_response(error.body(), status=e.status)
        except Exception as e:  # an emulator bug: say so loudly, at the test's end too
            text = "".join(traceback.format_exception(e))
            self.internal_errors.append(text)
            print(f"kube emulator: {raw.method} {raw.path_qs}:\n{text}", file=sys.stderr)
            return aiohttp.web.json_response(
                KubeError(500, "InternalError", repr(e)).body(), status=500
            )

    def _parse(self, raw: aiohttp.web.BaseRequest, body: bytes) -> rendering.Request:
        text = body.decode("utf-8", "replace")
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = None
        parsed = parse_path(raw.path)
        resource, action = None, None
        if parsed is not None:
            resource = kmock.resource(
                group=parsed.group, version=parsed.version, plural=parsed.plural
            )
            action = self._action(parsed, raw.method, raw.query.get("watch"))
        return rendering.Request(
            id=len(self._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=resource,
            namespace=parsed.namespace if parsed else None,
            name=parsed.name if parsed else None,
            subresource=parsed.subresource if parsed else None,
        )

    @staticmethod
    def _action(parsed: ParsedPath, method: str, watch: str | None) -> kmock.action | None:
        if parsed.plural is None:
            return None
        if method == "GET":
            return (
                kmock.action.WATCH
                if watch in ("true", "1")
                else (kmock.action.FETCH if parsed.name else kmock.action.LIST)
            )
        if parsed.name is None:
            return kmock.action.CREATE if method == "POST" else None
        return {
            "PATCH": kmock.action.UPDATE,
            "PUT": kmock.action.UPDATE,
            "DELETE": kmock.action.DELETE,
        }.get(method)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        assert request._raw_request is not None
        fault = next(
            (f for f in self.faults if f.matches(request.method.value, request.url.path)), None
        )
        if fault is not None:
            fault.count -= 1
            await asyncio.sleep(fault.delay)
            if fault.disconnect:
                transport = request._raw_request.transport
                if transport is not None:
                    transport.close()
                return aiohttp.web.Response(status=500)
            if fault.status is not None:
                error = KubeError(
                    fault.status,
                    REASONS.get(fault.status, "InternalError"),
                    f"injected by the test: {fault.status}",
                )
                return aiohttp.web.json_response(error.body(), status=fault.status)
        if request.resource is None or request.resource.plural is None:
            # discovery, /version, and any kmock reactions the test added (kmock DSL)
            return await apps.RawHandler._handle(self, request)
        spec = self._specs.get(
            (request.resource.group or "", request.resource.version or "", request.resource.plural)
        )
        if spec is None or (request.namespace is not None and not spec.namespaced):
            raise KubeError(404, "NotFound", "the server could not find the requested resource")
        if request.action == kmock.action.WATCH:
            return await self._watch(request, spec)
        status, body = self._serve(request, spec)
        return aiohttp.web.json_response(body, status=status)

    # --- one request, synchronously (every change happens without an await: atomically)

    def _serve(self, request: rendering.Request, spec: ResourceSpec) -> tuple[int, Obj]:
        method, ns, name, sub = request.method.value, request.namespace, request.name, None
        if request.subresource is not None:
            if request.subresource not in spec.subresources or name is None:
                raise KubeError(404, "NotFound", "the server could not find the requested resource")
            sub = request.subresource
        query = request.params
        dry_run = self._dry_run(query, request.data if method == "DELETE" else None)
        if name is None:
            if method == "GET":
                return 200, self._list(spec, ns, query)
            if method == "POST":
                if spec.namespaced and ns is None:
                    raise KubeError(405, "MethodNotAllowed", "POST is not allowed on this path")
                return 201, self.create_object(spec, ns, self._json_body(request), dry_run=dry_run)
            if method == "DELETE":
                return 200, self._delete_collection(spec, ns, query, dry_run=dry_run)
        elif method == "GET":
            return 200, self._fetch(spec, ns, name)
        elif method == "PUT":
            body = self._json_body(request)
            if body.get("metadata", {}).get("name") not in (None, name):
                raise bad_request("the name of the object does not match the name on the URL")
            return 200, self.update_object(
                spec, ns, name, lambda _: body, subresource=sub, dry_run=dry_run
            )
        elif method == "PATCH":
            return 200, self._patch(request, spec, ns, name, sub, dry_run)
        elif method == "DELETE":
            options = request.data if isinstance(request.data, dict) else {}
            return 200, self.delete_object(spec, ns, name, options, dry_run=dry_run)
        raise KubeError(405, "MethodNotAllowed", f"{method} is not allowed on this path")

    @staticmethod
    def _dry_run(query: Any, options: Any) -> bool:
        values = [query["dryRun"]] if "dryRun" in query else []
        if isinstance(options, dict):
            values += options.get("dryRun") or []
        if any(v != "All" for v in values):
            raise bad_request(f"Invalid dryRun value: {values}; only 'All' is supported")
        return bool(values)

    @staticmethod
    def _json_body(request: rendering.Request) -> Obj:
        ctype = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype not in ("application/json", ""):
            raise KubeError(415, "UnsupportedMediaType", f"unsupported media type {ctype!r}")
        if not isinstance(request.data, dict):
            raise bad_request("the request body must be a JSON object")
        return request.data

    def _patch(
        self,
        request: rendering.Request,
        spec: ResourceSpec,
        ns: str | None,
        name: str,
        sub: str | None,
        dry_run: bool,
    ) -> Obj:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        patch = request.data
        if ctype == "application/json-patch+json":
            return self.update_object(
                spec,
                ns,
                name,
                lambda cur: json_patch(spec, name, cur, patch),
                subresource=sub,
                dry_run=dry_run,
            )
        if ctype == "application/merge-patch+json" or (
            ctype == "application/strategic-merge-patch+json" and not spec.custom
        ):
            if not isinstance(patch, dict):
                raise bad_request("a merge patch must be a JSON object")
            fn = merge_patch if ctype == "application/merge-patch+json" else strategic_merge_patch
            return self.update_object(
                spec, ns, name, lambda cur: fn(cur, patch), subresource=sub, dry_run=dry_run
            )
        accepted = "application/json-patch+json, application/merge-patch+json" + (
            "" if spec.custom else ", application/strategic-merge-patch+json"
        )
        raise KubeError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown "
            f"format ({ctype or 'none'}); accepted media types include: {accepted}"
            " (server-side apply is not emulated)",
        )

    # --- the store (kmock's ObjectsArray keeps every version: emulator.objects[...].history)

    def _key(self, spec: ResourceSpec, ns: str | None, name: str) -> tuple[Any, str | None, str]:
        return (spec.ref, ns if spec.namespaced else None, name)

    def current(self, spec: ResourceSpec, ns: str | None, name: str) -> Obj | None:
        key = self._key(spec, ns, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def objects_of(self, spec: ResourceSpec, ns: str | None = None) -> Iterator[Obj]:
        """Current objects of a resource, by namespace and name (deep copies)."""
        found = []
        for (ref, obj_ns, name), obj in self._objects.items():
            if ref == spec.ref and not obj.deleted and (ns is None or obj_ns == ns):
                found.append(((obj_ns or "", name), obj.raw))
        for _, raw in sorted(found, key=lambda pair: pair[0]):
            yield copy.deepcopy(raw)

    def _commit(self, spec: ResourceSpec, old: Obj | None, new: Obj) -> Obj:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        meta = new["metadata"]
        key = self._key(spec, meta.get("namespace"), meta["name"])
        if key in self._objects:
            self._objects[key].history.append(copy.deepcopy(new))
        else:
            self._objects[key] = copy.deepcopy(new)
        self._emit(_Change(self._rv, spec.key, "MODIFIED" if old else "ADDED", old, new))
        return copy.deepcopy(new)

    def _remove(self, spec: ResourceSpec, obj: Obj, answer: Obj | None = None) -> Obj:
        """Delete ``obj`` for good; the DELETED event carries its last state, a new rv."""
        self._rv += 1
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        meta = gone["metadata"]
        self._objects[self._key(spec, meta.get("namespace"), meta["name"])].delete()
        self._emit(_Change(self._rv, spec.key, "DELETED", gone, None))
        self._namespace_emptied(meta.get("namespace"))
        answer = copy.deepcopy(answer if answer is not None else gone)
        answer["metadata"]["resourceVersion"] = str(self._rv)
        return answer

    def _emit(self, change: _Change) -> None:
        self._changes.append(change)
        for watcher in self._watchers:
            event = watcher.event(change)
            if event is not None:
                watcher.queue.put_nowait(event)

    # --- verbs

    def _fetch(self, spec: ResourceSpec, ns: str | None, name: str) -> Obj:
        obj = self.current(spec, ns, name)
        if obj is None:
            raise not_found(spec, name)
        return obj

    def _list(self, spec: ResourceSpec, ns: str | None, query: Any) -> Obj:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = FieldSelector.parse(query.get("fieldSelector"), spec)
        items = [
            o
            for o in self.objects_of(spec, ns)
            if labels.matches(o["metadata"].get("labels") or {}) and fields.matches(o)
        ]
        meta: Obj = {"resourceVersion": str(self._rv)}
        if query.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(query["continue"]))
            except ValueError as e:
                raise KubeError(400, "BadRequest", "invalid continue token") from e
            items = [o for o in items if _sort_key(o) > tuple(after)]
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as e:
            raise bad_request(f"invalid limit {query['limit']!r}") from e
        if 0 < limit < len(items):
            token = json.dumps(list(_sort_key(items[limit - 1]))).encode()
            meta["continue"] = base64.urlsafe_b64encode(token).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if not spec.custom:  # built-in lists carry no kind/apiVersion per item, as on a real server
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return {
            "kind": f"{spec.kind}List",
            "apiVersion": spec.api_version,
            "metadata": meta,
            "items": items,
        }

    def create_object(
        self,
        spec: ResourceSpec,
        ns: str | None,
        body: Obj,
        *,
        dry_run: bool = False,
        keep: bool = False,
    ) -> Obj:
        """POST semantics; ``keep`` (for helpers) keeps a given uid, timestamp and status."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if obj.get("kind", spec.kind) != spec.kind or obj.get("apiVersion", spec.api_version) != (
            spec.api_version
        ):
            raise bad_request(f"the object is not a {spec.api_version} {spec.kind}")
        obj = _typed(spec, obj)
        meta = obj["metadata"]
        if spec.namespaced:
            if ns and meta.get("namespace", ns) != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the "
                    "namespace sent on the request"
                )
            meta["namespace"] = ns = ns or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    spec, "", "metadata.name: Required value: name or generateName is required"
                )
            while not meta.get("name") or self.current(spec, ns, meta["name"]) is not None:
                suffix = "".join(random.choices(_NAME_CHARS, k=5))
                meta["name"] = meta["generateName"] + suffix
        name = meta["name"]
        validate_metadata(spec, meta)
        if self.current(spec, ns, name) is not None:
            raise KubeError(
                409,
                "AlreadyExists",
                f'{spec.qualified} "{name}" already exists',
                _details(spec, name),
            )
        if spec.namespaced and ns:
            self._ensure_namespace(ns, dry_run=dry_run)
        for server_field in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ):
            meta.pop(server_field, None)
        if not keep:
            meta["uid"], meta["creationTimestamp"] = str(uuid.uuid4()), _now()
            if spec.has_status:  # status is the controllers' to write, via /status
                obj.pop("status", None)
                if spec.key == "v1/pods":
                    obj["status"] = {"phase": "Pending"}
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["generation"] = 1
        _defaults(spec, obj)
        _tidy(meta)
        if dry_run:
            return obj
        return self._commit(spec, None, obj)

    def update_object(
        self,
        spec: ResourceSpec,
        ns: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        keep_status: bool | None = None,
    ) -> Obj:
        """PUT and every PATCH: ``change`` turns the current object into the wanted one."""
        cur = self.current(spec, ns, name)
        if cur is None:
            raise not_found(spec, name)
        wanted = change(copy.deepcopy(cur))
        if not isinstance(wanted, dict) or not isinstance(wanted.get("metadata", {}), dict):
            raise bad_request("the object must be a JSON object with object metadata")
        wanted_meta = wanted.setdefault("metadata", {})
        cur_meta = cur["metadata"]
        if wanted_meta.get("resourceVersion") not in (None, "", cur_meta["resourceVersion"]):
            raise conflict(spec, name)
        if wanted_meta.get("uid") not in (None, "", cur_meta["uid"]):
            raise conflict(
                spec,
                name,
                f"Precondition failed: UID in precondition: "
                f"{wanted_meta['uid']}, UID in object meta: {cur_meta['uid']}",
            )
        if subresource == "status":
            new = copy.deepcopy(cur)
            new.pop("status", None)
            if "status" in wanted:
                new["status"] = wanted["status"]
        else:
            new = self._main_update(spec, cur, wanted, keep_status=keep_status)
        if new == cur:
            return cur  # a no-op writes nothing: no new resourceVersion, no watch event
        if dry_run:
            return new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            # as a real server: the update is not written, the object is deleted (one DELETED)
            return self._remove(spec, cur, answer=new)
        return self._commit(spec, cur, new)

    def _main_update(
        self, spec: ResourceSpec, cur: Obj, wanted: Obj, *, keep_status: bool | None
    ) -> Obj:
        new = _typed(spec, copy.deepcopy(wanted))
        meta, cur_meta = new["metadata"], cur["metadata"]
        name = cur_meta["name"]
        if meta.get("name", name) != name or meta.get("namespace", cur_meta.get("namespace")) != (
            cur_meta.get("namespace")
        ):
            raise invalid(spec, name, "metadata.name, metadata.namespace: field is immutable")
        for kept in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            meta.pop(kept, None)
            if kept in cur_meta:
                meta[kept] = cur_meta[kept]
        if spec.has_status if keep_status is None else keep_status:
            new.pop("status", None)
            if "status" in cur:
                new["status"] = cur["status"]
        validate_metadata(spec, meta)
        if cur_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
            if added:
                raise invalid(
                    spec,
                    name,
                    f"metadata.finalizers: Forbidden: no new finalizers can "
                    f"be added if the object is being deleted, found {sorted(added)}",
                )
        _defaults(spec, new)
        _tidy(meta)
        if _body_of(new) != _body_of(cur):
            meta["generation"] = cur_meta.get("generation", 1) + 1
        return new

    def delete_object(
        self,
        spec: ResourceSpec,
        ns: str | None,
        name: str,
        options: Obj | None = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE: finalizers hold the object (``deletionTimestamp``) until they are gone."""
        cur = self.current(spec, ns, name)
        if cur is None:
            raise not_found(spec, name)
        pre = (options or {}).get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if pre.get(field_name) not in (None, cur["metadata"].get(field_name)):
                raise conflict(
                    spec,
                    name,
                    f"Precondition failed: {field_name} in precondition: "
                    f"{pre[field_name]}, {field_name} in object meta: "
                    f"{cur['metadata'].get(field_name)}",
                )
        if spec.key == "v1/namespaces":
            return self._delete_namespace(cur, dry_run=dry_run)
        meta = cur["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp") or dry_run:
                return cur
            new = copy.deepcopy(cur)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["metadata"]["generation"] = meta.get("generation", 1) + 1  # as a real server does
            return self._commit(spec, cur, new)
        if not dry_run:
            self._remove(spec, cur)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": _details(spec, name) | {"uid": meta.get("uid")},
        }

    def _delete_collection(
        self, spec: ResourceSpec, ns: str | None, query: Any, *, dry_run: bool
    ) -> Obj:
        listed = self._list(spec, ns, {k: v for k, v in query.items() if k != "limit"})
        for item in listed["items"]:
            meta = item["metadata"]
            self.delete_object(spec, meta.get("namespace"), meta["name"], dry_run=dry_run)
        return listed

    # --- namespaces: one per namespace with objects; deleting one deletes what is in it

    def _ensure_namespace(self, ns: str, *, dry_run: bool) -> None:
        spec = self.spec("v1/namespaces")
        found = self.current(spec, None, ns)
        if found is not None and found["metadata"].get("deletionTimestamp"):
            raise KubeError(403, "Forbidden", f'namespace "{ns}" is being terminated')
        if found is None:
            if not self.auto_namespaces:
                raise not_found(spec, ns)
            if not dry_run:
                self.create_object(spec, None, {"metadata": {"name": ns}})

    def _delete_namespace(self, cur: Obj, *, dry_run: bool) -> Obj:
        spec, ns = self.spec("v1/namespaces"), cur["metadata"]["name"]
        if dry_run or cur["metadata"].get("deletionTimestamp"):
            return cur
        new = copy.deepcopy(cur)
        new["metadata"]["deletionTimestamp"] = _now()
        new["status"] = {"phase": "Terminating"}
        result = self._commit(spec, cur, new)
        for other in list(self._specs.values()):
            if other.namespaced:
                for obj in list(self.objects_of(other, ns)):
                    self.delete_object(other, ns, obj["metadata"]["name"])
        self._namespace_emptied(ns)
        return result

    def _namespace_emptied(self, ns: str | None) -> None:
        spec = self.spec("v1/namespaces")
        found = self.current(spec, None, ns) if ns else None
        if found is None or not found["metadata"].get("deletionTimestamp"):
            return
        if not any(obj_ns == ns and not o.deleted for (_, obj_ns, _), o in self._objects.items()):
            self._remove(spec, found)

    # --- helpers' writes: as the controllers would (status included, no preconditions)

    def put_object(self, spec: ResourceSpec, obj: Obj) -> Obj:
        """Create or replace, status included; a given uid and creationTimestamp are kept."""
        meta = obj.get("metadata", {})
        ns = meta.get("namespace") if spec.namespaced else None
        cur = self.current(spec, ns, meta["name"])
        if cur is not None and meta.get("uid") not in (None, cur["metadata"]["uid"]):
            self._remove(spec, cur)  # another uid: the old object is gone, a new one is here
            cur = None
        if cur is None:
            return self.create_object(spec, ns, obj, keep=True)

        def replace(_: Obj) -> Obj:
            new = copy.deepcopy(obj)
            new["metadata"] = {**new["metadata"], "resourceVersion": None, "uid": None}
            return new

        return self.update_object(spec, ns, meta["name"], replace, keep_status=False)

    # --- watches

    async def _watch(
        self, request: rendering.Request, spec: ResourceSpec
    ) -> aiohttp.web.StreamResponse:
        query = request.params
        fields = query.get("fieldSelector", "")
        if request.name:  # the old style: a watch on one object's URL
            fields = ",".join(filter(None, [fields, f"metadata.name={request.name}"]))
        watcher = _Watcher(
            spec,
            request.namespace,
            LabelSelector.parse(query.get("labelSelector")),
            FieldSelector.parse(fields, spec),
        )
        since = query.get("resourceVersion") or "0"
        try:
            since_rv = int(since)
        except ValueError as e:
            raise bad_request(f"invalid resourceVersion {since!r}") from e
        timeout = float(query.get("timeoutSeconds") or 0)
        events: list[Obj | None]
        if since_rv == 0:  # no resourceVersion: the current objects first, as ADDED
            events = [
                {"type": "ADDED", "object": o}
                for o in self.objects_of(spec, request.namespace)
                if watcher._selects(o)
            ]
            if query.get("sendInitialEvents") == "true":
                mark = {
                    "kind": spec.kind,
                    "apiVersion": spec.api_version,
                    "metadata": {
                        "resourceVersion": str(self._rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                events.append({"type": "BOOKMARK", "object": mark})
        elif since_rv < self._compacted_rv:
            error = KubeError(
                410, "Expired", f"too old resource version: {since_rv} ({self._compacted_rv})"
            ).body()
            events = [{"type": "ERROR", "object": error}, None]
        else:
            events = [e for c in self._changes if c.rv > since_rv for e in [watcher.event(c)] if e]
        for event in events:
            watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(request._raw_request)
            await self._stream(response, watcher, timeout)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client went away
        finally:
            self._watchers.discard(watcher)
        return response

    async def _stream(
        self, response: aiohttp.web.StreamResponse, watcher: _Watcher, timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return
            try:
                event = await asyncio.wait_for(watcher.queue.get(), left)
            except TimeoutError:
                return
            if event is None:  # the server is stopping, or the stream has said its last
                return
            await response.write(json.dumps(event).encode() + b"\n")

    def end_watches(self) -> None:
        """End every watch stream (as a server restart would); clients reconnect."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget past changes: a watch from an older resourceVersion is told 410 Gone."""
        self._changes.clear()
        self._compacted_rv = self._rv + 1


def _sort_key(obj: Obj) -> tuple[str, str]:
    return (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


# ----------------------------------------------------------------------------- the thread


class KubeEmulator:
    """The emulator on a real port, in a thread and event loop of its own.

    Use as a context manager; ``url`` is its address, ``kubeconfig(path)`` writes a file
    pointing at it. Helpers are thread-safe; ``resource`` is written ``v1/pods``,
    ``apps/v1/deployments``, ``unthrottle.io/v1alpha1/throttlepolicies``; ``namespace`` is
    None for cluster-scoped resources. Objects returned are copies.
    """

    def __init__(
        self,
        *,
        vpa: bool = False,
        resources: Iterable[ResourceSpec] = (),
        auto_namespaces: bool = True,
        port: int | None = None,
    ) -> None:
        self._vpa, self._resources = vpa, tuple(resources)
        self._auto_namespaces = auto_namespaces
        self._port = port
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self.api: KubeApi | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="kube-emulator")

    @property
    def emulator(self) -> KubeApi:
        """The kmock emulator itself (``emulator.objects[...]`` keeps every version)."""
        assert self.api is not None, "not started"
        return self.api

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as e:
            self._failure = e
            self._ready.set()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        api = KubeApi(vpa=self._vpa, extra_resources=self._resources,
                      auto_namespaces=self._auto_namespaces)  # fmt: skip
        async with api, kmock.Server(api, port=self._port) as server:
            self.api = api
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
            api.end_watches()
            await asyncio.sleep(0.05)  # let the streams say their last

    def __enter__(self) -> KubeEmulator:
        self._thread.start()
        if not self._ready.wait(10) or self._failure is not None:
            raise RuntimeError(f"the kube emulator did not start: {self._failure!r}")
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
        errors = self.api.internal_errors if self.api is not None else []
        if errors and exc_type is None:
            raise AssertionError("the kube emulator failed internally:\n" + "\n".join(errors))

    def _call(self, fn: Callable[[KubeApi], T]) -> T:
        async def run() -> T:
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    # --- clients

    def kubeconfig(self, path: Path, *, namespace: str | None = None) -> Path:
        """A kubeconfig file pointing at the emulator (a token user; no TLS)."""
        context = (
            f"{{cluster: emulator, user: test{', namespace: ' + namespace if namespace else ''}}}"
        )
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: emulator\n"
            f"clusters: [{{name: emulator, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: test, user: {token: test}}]\n"
            f"contexts: [{{name: emulator, context: {context}}}]\n"
        )
        return path

    def api_client(self, kubeconfig: Path) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from ``kubeconfig`` (not $KUBECONFIG)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        return client.ApiClient(configuration)

    # --- objects

    def put(self, resource: str, obj: Obj) -> Obj:
        """Create or replace an object, status included (a given uid is kept)."""
        return self._call(lambda api: api.put_object(api.spec(resource), obj))

    def create(self, resource: str, obj: Obj) -> Obj:
        """Create as a POST would (409 AlreadyExists raises KubeError)."""
        ns = obj.get("metadata", {}).get("namespace")
        return self._call(lambda api: api.create_object(api.spec(resource), ns, obj))

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """The object now, or None."""
        return self._call(lambda api: api.current(api.spec(resource), namespace, name))

    def list(
        self, resource: str, namespace: str | None = None, *, labels: str | None = None
    ) -> list[Obj]:
        """The objects now, sorted by namespace and name, optionally by a label selector."""
        selector = LabelSelector.parse(labels)
        return self._call(
            lambda api: [
                o
                for o in api.objects_of(api.spec(resource), namespace)
                if selector.matches(o["metadata"].get("labels") or {})
            ]
        )

    def patch(self, resource: str, namespace: str | None, name: str, patch: Obj) -> Obj:
        """A merge patch of the main object (status excepted where it is a subresource)."""
        return self._call(
            lambda api: api.update_object(
                api.spec(resource), namespace, name, lambda cur: merge_patch(cur, patch)
            )
        )

    def patch_status(self, resource: str, namespace: str | None, name: str, status: Obj) -> Obj:
        """A merge patch of ``status``, as a controller writes it through ``/status``."""
        return self._call(
            lambda api: api.update_object(
                api.spec(resource),
                namespace,
                name,
                lambda cur: merge_patch(cur, {"status": status}),
                subresource="status",
            )
        )

    def delete(
        self, resource: str, namespace: str | None, name: str, *, force: bool = False
    ) -> None:
        """Delete as a DELETE would; ``force`` drops the finalizers first (no operator needed)."""

        def run(api: KubeApi) -> None:
            spec = api.spec(resource)
            if force and api.current(spec, namespace, name) is not None:
                api.update_object(
                    spec,
                    namespace,
                    name,
                    lambda c: merge_patch(c, {"metadata": {"finalizers": None}}),
                )
            if api.current(spec, namespace, name) is not None:
                api.delete_object(spec, namespace, name)

        self._call(run)

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        """A namespace (namespaces also appear with their first object)."""
        return self.put("v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})

    def wait_for(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        check: Callable[[Obj | None], bool],
        *,
        timeout: float = 20.0,
    ) -> Obj | None:
        """Poll until ``check(object or None)`` holds; the object then, or AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(resource, namespace, name)
            if check(obj):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(f"{resource} {namespace}/{name} never matched; now: {obj}")
            time.sleep(0.1)

    # --- playing the Deployment controller

    def complete_rollout(self, namespace: str, name: str) -> Obj:
        """Status of a finished rollout: observedGeneration caught up, all replicas available."""
        deployment = self._deployment(namespace, name)
        replicas = deployment["spec"].get("replicas", 1)
        now = _now()
        return self.patch_status(
            "apps/v1/deployments",
            namespace,
            name,
            {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "unavailableReplicas": None,
                "conditions": [
                    _condition(
                        "Available",
                        "True",
                        "MinimumReplicasAvailable",
                        "Deployment has minimum availability.",
                        now,
                    ),
                    _condition(
                        "Progressing",
                        "True",
                        "NewReplicaSetAvailable",
                        f'ReplicaSet "{name}" has successfully progressed.',
                        now,
                    ),
                ],
            },
        )

    def fail_rollout(self, namespace: str, name: str) -> Obj:
        """Status of a stuck rollout: one new pod never ready, the progress deadline exceeded."""
        deployment = self._deployment(namespace, name)
        replicas = deployment["spec"].get("replicas", 1)
        now = _now()
        return self.patch_status(
            "apps/v1/deployments",
            namespace,
            name,
            {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas + 1,
                "updatedReplicas": 1,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "unavailableReplicas": 1,
                "conditions": [
                    _condition(
                        "Available",
                        "True",
                        "MinimumReplicasAvailable",
                        "Deployment has minimum availability.",
                        now,
                    ),
                    _condition(
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        f'ReplicaSet "{name}" has timed out progressing.',
                        now,
                    ),
                ],
            },
        )

    def _deployment(self, namespace: str, name: str) -> Obj:
        found = self.get("apps/v1/deployments", namespace, name)
        if found is None:
            raise KeyError(f"no Deployment {namespace}/{name}")
        return found

    # --- requests and faults

    def requests(
        self, method: str | None = None, path: str | None = None
    ) -> builtins.list[SeenRequest]:
        """The requests received so far, optionally by method and path (a regex, searched)."""

        def seen(api: KubeApi) -> list[SeenRequest]:
            found = []
            for r in api._requests:
                if method is not None and r.method.value != method.upper():
                    continue
                if path is not None and not re.search(path, r.url.path):
                    continue
                body = r.data if r.data is not None else (r.text or None)
                found.append(
                    SeenRequest(
                        r.method.value,
                        r.url.path,
                        dict(r.params),
                        body,
                        r.headers.get("Content-Type", ""),
                    )
                )
            return found

        return self._call(seen)

    def clear_requests(self) -> None:
        self._call(lambda api: api._requests.clear())

    def fail_next(
        self,
        method: str | None,
        path: str,
        status: int | None = 500,
        count: int = 1,
        *,
        delay: float = 0.0,
        disconnect: bool = False,
    ) -> Fault:
        """The next ``count`` matching requests wait ``delay`` s, then answer ``status`` with a
        Status body (None: served normally, only late), or lose the connection (``disconnect``).
        A client that gives up waiting cancels its request: nothing is then written."""
        fault = Fault(method, path, status, count, delay, disconnect)
        self._call(lambda api: api.faults.append(fault))
        return fault

    def compact(self) -> None:
        """Forget the change history: watches from older resourceVersions get 410 Gone."""
        self._call(lambda api: api.compact())

    def end_watches(self) -> None:
        """Close every open watch stream (clients reconnect with their resourceVersion)."""
        self._call(lambda api: api.end_watches())

    @property
    def resource_version(self) -> str:
        """The cluster-wide resourceVersion now."""
        return str(self._call(lambda api: api.resource_version))


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> Obj:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


@contextlib.contextmanager
def running(**options: Any) -> Iterator[KubeEmulator]:
    """``with running() as kube:`` — a started emulator (a shortcut for fixtures)."""
    with KubeEmulator(**options) as kube:
        yield kube
