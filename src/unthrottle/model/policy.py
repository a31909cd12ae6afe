"""The ThrottlePolicy custom resource's spec, as pydantic models (its status: ``status.py``).

One source of truth: the CRD's schema (``unthrottle crd``, :mod:`unthrottle.model.crd`)
and the reference in ``docs/throttlepolicy.md`` are generated from these models,
descriptions included. Field names are the resource's (camelCase aliases);
Python attributes are snake_case.

The operator validates every spec itself with :func:`parse_spec`, defaults
included: a cluster may hold policies stored under an older CRD, and the schema cannot
say everything the model does (a window of at least 5 minutes in ``d`` and ``w``
units, for one). A bad spec is a :class:`SpecError`
naming the field (``limits.min``, ``selector.matchExpressions[0].operator``) and
the fix, for a status condition and an event.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from unthrottle.model.durations import DURATION_PATTERN, MAX_LENGTH, format_duration
from unthrottle.model.durations import parse_duration as _parse_duration
from unthrottle.model.selector import _KEY, _VALUE, Requirement, Selector
from unthrottle.model.status import (
    Condition,
    ContainerStatus,
    CurrentSettings,
    RecommendedSettings,
    Summary,
    ThrottlePolicyStatus,
    WorkloadStatus,
)
from unthrottle.units import format_cpu, parse_cpu

__all__ = [
    "ApplySpec",
    "BurstSpec",
    "Condition",
    "ContainerStatus",
    "CurrentSettings",
    "LabelSelectorSpec",
    "LimitsSpec",
    "ProcessorsSpec",
    "RecommendedSettings",
    "SelectorRequirement",
    "SpecError",
    "Summary",
    "ThrottlePolicySpec",
    "ThrottlePolicyStatus",
    "WorkloadKind",
    "WorkloadStatus",
    "parse_spec",
]

MIN_WINDOW_S = 300
"""A window shorter than 5 minutes holds too few scrapes to size a limit on."""
MIN_INTERVAL_S = 30
"""Evaluating more often than every 30 s only loads Prometheus: its data move no faster."""
MIN_VERIFY_S = 60
"""Verifying a change over less than a minute sees too few scrapes to compare ratios."""
CPU_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)m?$"
"""The CPU quantities :func:`unthrottle.units.parse_cpu` reads (cores or millicores)."""
CONTAINER_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A container name: an RFC 1123 label, as the API server requires."""

WorkloadKind = Literal["Deployment", "StatefulSet", "DaemonSet"]
"""The kinds of workload a policy can cover. Anything else (CronJob, Job, ReplicaSet, a
custom resource) is refused: the schema's enum, and :func:`parse_spec` naming ``kinds``."""


class SpecError(ValueError):
    """A ThrottlePolicy spec the operator cannot run; ``field`` is its dotted camelCase path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _FieldProblem(ValueError):
    """Raised by a validator about one of the model's own fields (``field``, camelCase)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# --- field types ---------------------------------------------------------------------------


def _at_least(seconds: int) -> AfterValidator:
    def check(text: str) -> str:
        if _parse_duration(text) < seconds:
            raise ValueError(f"{text!r} is shorter than {format_duration(seconds)}: use at least "
                             f"{format_duration(seconds)}")  # fmt: skip
        return text

    return AfterValidator(check)


def _duration(text: str) -> str:
    _parse_duration(text)
    return text


def _number_as_text(value: object) -> object:
    """``max: 8`` in YAML is a number: read it as the quantity ``"8"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(Decimal(repr(value)), "f")
    return value


def _positive_cpu(text: str) -> str:
    if not re.fullmatch(CPU_PATTERN, text):
        raise ValueError(f"{text!r} is not a CPU quantity: use cores or millicores, "
                         "e.g. 100m, 0.5 or 2")  # fmt: skip
    if parse_cpu(text) <= 0:
        raise ValueError(f"{text!r} is not a positive CPU quantity: use e.g. 100m, 0.5 or 2")
    return text


def _label_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a label key: an optional DNS-subdomain prefix and '/', "
                         "then up to 63 letters, digits, '-', '_' or '.', starting and ending "
                         "with a letter or digit")  # fmt: skip
    return key


def _label_value(value: str) -> str:
    if not _VALUE.fullmatch(value):
        raise ValueError(f"{value!r} is not a label value: empty, or up to 63 letters, digits, "
                         "'-', '_' or '.', starting and ending with a letter or digit")  # fmt: skip
    return value


def _container_name(name: str) -> str:
    if len(name) > 63 or not re.fullmatch(CONTAINER_PATTERN, name):
        raise ValueError(f"{name!r} is not a container name: up to 63 lower-case letters, "
                         "digits or '-', starting and ending with a letter or digit")  # fmt: skip
    return name


Duration = Annotated[
    str,
    AfterValidator(_duration),
    Field(json_schema_extra={"pattern": DURATION_PATTERN, "minLength": 2, "maxLength": MAX_LENGTH}),
]
"""``30s``, ``5m``, ``1h30m``, ``24h``, ``7d``: see :mod:`unthrottle.model.durations`."""

_QUANTITY_RULES = [
    {
        "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
        "message": "must be a positive CPU quantity, e.g. 100m, 0.5 or 2",
    }
]
CpuQuantity = Annotated[
    str,
    BeforeValidator(_number_as_text),
    AfterValidator(_positive_cpu),
    Field(
        json_schema_extra={
            "pattern": CPU_PATTERN,
            "maxLength": MAX_LENGTH,
            "x-kubernetes-validations": _QUANTITY_RULES,
        }
    ),
]
"""A Kubernetes CPU quantity kept as written (``"100m"``, ``"8"``); numbers become strings."""

LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[
    str, AfterValidator(_label_value), Field(json_schema_extra={"pattern": _VALUE.pattern})
]
ContainerName = Annotated[
    str,
    AfterValidator(_container_name),
    Field(json_schema_extra={"pattern": CONTAINER_PATTERN, "maxLength": 63}),
]


class _Spec(BaseModel):
    """The spec's models: camelCase, strict (as JSON arrives), unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
    )


def _section(model: type[_Spec], description: str) -> Any:
    """A nested object: absent means all its defaults (``default: {}`` in the CRD)."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


# --- the spec ------------------------------------------------------------------------------

_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


class SelectorRequirement(_Spec):
    """One requirement on a label: key, operator and, for In and NotIn, values."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['In', 'NotIn'] ? "
                    "(has(self.values) && size(self.values) > 0) : "
                    "(!has(self.values) || size(self.values) == 0)",
                    "message": "In and NotIn need values; Exists and DoesNotExist take none",
                }
            ]
        }
    )

    key: LabelKey = Field(
        description="The label key, e.g. app or app.kubernetes.io/name.",
        json_schema_extra={"pattern": _KEY.pattern},
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In: the label has one of the values; NotIn: it is missing or has none of "
        "them; Exists, DoesNotExist: the key is there, or not."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        description="The values for In and NotIn (at least one); empty for Exists and "
        "DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        if self.operator in {"In", "NotIn"} and not self.values:
            raise _FieldProblem("values", f"{self.operator} needs at least one value")
        if self.operator in {"Exists", "DoesNotExist"} and self.values:
            raise _FieldProblem("values", f"{self.operator} takes no values: remove them")
        return self

    def requirement(self) -> Requirement:
        """The same requirement for :class:`unthrottle.model.selector.Selector`."""
        return Requirement(self.key, _OPERATORS[self.operator], frozenset(self.values))


class LabelSelectorSpec(_Spec):
    """A standard Kubernetes label selector over the Deployments in the policy's namespace."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="Labels a Deployment must have, with these values (key: value).",
    )
    match_expressions: list[SelectorRequirement] = Field(
        default_factory=list,
        max_length=32,
        description="Requirements a Deployment's labels must all meet (at most 32).",
    )

    def to_selector(self) -> Selector:
        """matchLabels ``k: v`` is ``k in (v)``; an empty selector matches every Deployment."""
        labels = [Requirement(k, "in", frozenset({v})) for k, v in self.match_labels.items()]
        return Selector((*labels, *(e.requirement() for e in self.match_expressions)))


class LimitsSpec(_Spec):
    """Bounds on every recommended CPU limit, and on how far one change may move it."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # has(): the API server checks the rule on the default ({}) too, before
                    # the fields' own defaults fill it in (the CRD was refused without it)
                    "rule": "!has(self.min) || !has(self.max) || !isQuantity(self.min) || "
                    "!isQuantity(self.max) || "
                    "quantity(self.min).compareTo(quantity(self.max)) <= 0",
                    "message": "limits.min must not be above limits.max",
                }
            ]
        }
    )

    min: CpuQuantity = Field("100m", description="Never recommend a CPU limit below this.")
    max: CpuQuantity = Field("8", description="Never recommend a CPU limit above this.")
    max_step_up: float = Field(
        2.0, ge=1, description="One change raises a limit to at most this many times today's."
    )
    max_step_down: float = Field(
        0.8, gt=0, le=1, description="One change lowers a limit to no less than this share of it."
    )

    @property
    def min_millicores(self) -> int:
        """``min`` in millicores."""
        return parse_cpu(self.min)

    @property
    def max_millicores(self) -> int:
        """``max`` in millicores."""
        return parse_cpu(self.max)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> LimitsSpec:
        low, high = self.min_millicores, self.max_millicores
        if low > high:
            message = f"{format_cpu(low)} is above limits.max ({format_cpu(high)})"
            raise _FieldProblem("min", f"{message}: lower limits.min or raise limits.max")
        return self


class BurstSpec(_Spec):
    """CFS burst (cpu.max.burst): unused quota saved for short peaks."""

    enabled: bool = Field(
        True,
        description="Recommend a burst where it helps. false: limits only, as if strategy "
        "were LimitOnly.",
    )


class ProcessorsSpec(_Spec):
    """Processor counts that runtimes size their thread pools by."""

    enabled: bool = Field(
        True,
        description="Also recommend GOMAXPROCS (Go) and -XX:ActiveProcessorCount (JVM) to "
        "match the recommended limit.",
    )


class ApplySpec(_Spec):
    """How changes are applied in mode Apply, verified, and rolled back."""

    cooldown: Duration = Field(
        "30m", description="Wait at least this long after a change before changing a Deployment "
        "again (0s: no wait)."
    )  # fmt: skip
    verify_for: Annotated[Duration, _at_least(MIN_VERIFY_S)] = Field(
        "15m",
        description="Watch a changed Deployment this long before calling the change good "
        f"(at least {format_duration(MIN_VERIFY_S)}).",
    )
    rollback_if_worse: bool = Field(
        True, description="Undo a change whose throttle ratio came out worse than before."
    )
    max_concurrent: int = Field(
        1,
        ge=1,
        description="At most this many Deployments of the policy changing at a time "
        "(InPlace: also the pods of one resized at a time after its canary).",
    )
    dry_run: bool = Field(
        False, description="Compute and report the patches, but send them to nobody."
    )
    git_ops: Literal["Skip", "Patch"] = Field(
        "Skip",
        description="Deployments managed by GitOps (Argo CD, Flux): Skip leaves them alone; "
        "Patch changes them anyway.",
    )
    method: Literal["Rollout", "InPlace", "InPlaceOrRollout"] = Field(
        "Rollout",
        description="Rollout: patch the Deployment's pod template (every pod restarts). "
        "InPlace: resize the running pods through their resize subresource (Kubernetes 1.33+), "
        "one canary pod first, verified, then the rest, maxConcurrent pods at a time; no pod "
        "restarts. InPlaceOrRollout: InPlace, and a rollout where a pod cannot be resized "
        "(Infeasible, refused, or no resize subresource).",
    )

    @property
    def cooldown_s(self) -> int:
        """``cooldown`` in seconds."""
        return _parse_duration(self.cooldown)

    @property
    def verify_for_s(self) -> int:
        """``verifyFor`` in seconds."""
        return _parse_duration(self.verify_for)


class ThrottlePolicySpec(_Spec):
    """Which Deployments to right-size against CFS throttling, to what target, and how.

    There is deliberately no Prometheus address: the operator's own configuration
    names it, so a namespace's users cannot point the operator at a URL.
    """

    selector: LabelSelectorSpec = _section(
        LabelSelectorSpec,
        "The workloads (of its kinds) of the policy's namespace it manages; empty or absent: "
        "all of them.",
    )
    kinds: list[WorkloadKind] = Field(
        # Deployment only: a policy written before this field covers what it covered then,
        # and covers more only when its author says so
        ["Deployment"],
        min_length=1,
        description="Which kinds of workload the policy covers (at least one, each once). "
        "Pods owned directly by a StatefulSet or a DaemonSet are recognised from their owner "
        "references (kube-state-metrics' kube_pod_owner, without cluster access). Apply "
        "changes each kind, by Rollout or InPlace.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    mode: Literal["Recommend", "Apply"] = Field(
        "Recommend",
        description="Recommend: only report in the status; Apply: also change the Deployments.",
    )
    target_throttle_ratio: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Share of a container's active CFS periods allowed to be throttled "
        "(0.05 = 5 %).",
    )
    window: Annotated[Duration, _at_least(MIN_WINDOW_S)] = Field(
        "24h",
        description="How much history each recommendation is based on "
        f"(at least {format_duration(MIN_WINDOW_S)}).",
    )
    strategy: Literal["Auto", "LimitOnly", "BurstPreferred"] = Field(
        "Auto",
        description="LimitOnly: only change the limit; BurstPreferred: the smallest limit that "
        "a burst makes meet the target; Auto: a burst only when the limit covers the long-run "
        "average, else a larger limit.",
    )
    headroom: float = Field(
        0.1, ge=0, le=10, description="Added to the limit the evidence needs (0.1 = +10 %)."
    )
    limits: LimitsSpec = _section(LimitsSpec, "Bounds and step limits on recommended limits.")
    burst: BurstSpec = _section(BurstSpec, "CFS burst.")
    processors: ProcessorsSpec = _section(ProcessorsSpec, "GOMAXPROCS and JVM processor counts.")
    containers: list[ContainerName] = Field(
        default_factory=list,
        description="Names of the containers to manage; empty or absent: every container.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    apply: ApplySpec = _section(ApplySpec, "Applying, verifying and rolling back (mode Apply).")
    interval: Annotated[Duration, _at_least(MIN_INTERVAL_S)] = Field(
        "5m",
        description="How often the policy is evaluated "
        f"(at least {format_duration(MIN_INTERVAL_S)}).",
    )

    @model_validator(mode="after")
    def _listed_once(self) -> ThrottlePolicySpec:
        for field, names in (("kinds", self.kinds), ("containers", self.containers)):
            seen: set[str] = set()
            for index, name in enumerate(names):
                if name in seen:
                    raise _FieldProblem(f"{field}[{index}]", f"{name!r} is listed twice")
                seen.add(name)
        return self

    @property
    def window_s(self) -> int:
        """``window`` in seconds."""
        return _parse_duration(self.window)

    @property
    def interval_s(self) -> int:
        """``interval`` in seconds."""
        return _parse_duration(self.interval)

    @property
    def min_millicores(self) -> int:
        """``limits.min`` in millicores."""
        return self.limits.min_millicores

    @property
    def max_millicores(self) -> int:
        """``limits.max`` in millicores."""
        return self.limits.max_millicores

    def label_selector(self) -> Selector:
        """The Deployments this policy selects, as a :class:`~.selector.Selector`."""
        return self.selector.to_selector()


# --- turning pydantic's errors into SpecError ----------------------------------------------


def _plain(value: object) -> object:
    """Mappings and sequences (a kopf body, a tuple) as the dicts and lists strict mode takes."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the object at ``loc`` (for "unknown field" messages)."""
    model: type[BaseModel] = ThrottlePolicySpec
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {info.alias or name: info for name, info in model.model_fields.items()}
        inner = _model_in(fields[part].annotation) if part in fields else None
        if inner is None:
            return []
        model = inner
    return [info.alias or name for name, info in model.model_fields.items()]


def _path(loc: tuple[int | str, ...]) -> tuple[str, str]:
    """The dotted camelCase path, and the matchLabels key the error is about (if any)."""
    path = ""
    for index, part in enumerate(loc):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
        if part == "matchLabels" and index + 1 < len(loc):  # the rest is a label key
            rest = loc[index + 1 :]
            return path, "" if rest[-1] == "[key]" else str(rest[0])
    return path or "spec", ""


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", "≥"),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "≤"),
}


def _message(problem: ErrorDetails) -> str:
    kind, value, ctx = problem["type"], problem.get("input"), problem.get("ctx") or {}
    loc = problem["loc"]
    if kind == "extra_forbidden":
        known = ", ".join(_fields_at(loc[:-1]))
        hint = ""
        if "prometheus" in str(loc[-1]).lower():
            hint = (" (a policy cannot name a Prometheus: the operator's own configuration does,"
                    " so that a namespace's users cannot point it at a URL)")  # fmt: skip
        return f"unknown field{hint}; remove it (the fields here are: {known})"
    if kind == "missing":
        return "is missing: add it"
    if kind in {"model_type", "model_attributes_type", "dict_type"}:
        known = ", ".join(_fields_at(loc)) or "key: value pairs"
        return f"{value!r} is not an object: write its fields ({known})"
    if kind == "value_error":
        return str(ctx.get("error", problem["msg"]))
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        same = [c for c in choices if isinstance(value, str) and c.lower() == value.lower()]
        hint = f" (names are case-sensitive: {same[0]!r})" if same else ""
        return f"{value!r} is not one of {', '.join(choices)}{hint}"
    if kind == "too_short":
        least = ctx.get("min_length")
        return f"{value!r} has too few items: list at least {least}"
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        return f"{value!r} is out of range: use a value {sign} {ctx.get(key):g}"
    text = problem["msg"]
    return f"{value!r} is not valid: {text[:1].lower()}{text[1:]}"


def _spec_error(problem: ErrorDetails) -> SpecError:
    loc = problem["loc"]
    cause = (problem.get("ctx") or {}).get("error")
    path, label = _path(loc)
    if isinstance(cause, _FieldProblem):
        path = cause.field if path == "spec" else f"{path}.{cause.field}"
    message = _message(problem)
    if label:
        message = f"the value of {label!r}: {message}"
    return SpecError(path, message)


def parse_spec(raw: object) -> ThrottlePolicySpec:
    """A ThrottlePolicy's ``spec`` (``None``: none given) validated, with every default applied.

    :class:`SpecError` names the first field at fault and how to fix it.
    """
    raw = {} if raw is None else _plain(raw)
    if not isinstance(raw, dict):
        raise SpecError("spec", f"must be an object of fields, not {type(raw).__name__}")
    try:
        return ThrottlePolicySpec.model_validate(raw)
    except ValidationError as error:
        raise _spec_error(error.errors()[0]) from None
