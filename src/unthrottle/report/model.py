"""The report model: one scan result and its provenance, as every renderer reads it.

The model *is* the JSON document of ``recommend --format json`` (the operator's
``report.json``): :meth:`Report.from_scan` builds that document from a
:class:`~unthrottle.scan.ScanResult` and validates it, :meth:`Report.from_json`
validates one read back (a report ConfigMap), so both paths meet in one place and
every renderer shows the numbers the JSON carries. Fields beyond
``ScanResult.to_json`` (runtime, labels, state …) have defaults and are written
only when they differ from them, so a plain scan document round-trips unchanged.

Figures derived from the document (harm, what changes, the totals) are computed
here, once, and never by a renderer. Pure: no I/O.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from unthrottle.model.owners import DEPLOYMENT, ref
from unthrottle.scan import ScanResult
from unthrottle.units import DEFAULT_PERIOD_US


class ReportError(ValueError):
    """A document that is not an unthrottle report; the message names the field at fault."""


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Current(_Doc):
    """A container's settings today."""

    limit_millicores: int | None = Field(ge=0, description="CPU limit; None: no limit.")
    request_millicores: int = Field(ge=0, description="CPU request.")
    burst_us: int = Field(ge=0, description="CFS burst the pod annotation gives, µs.")
    gomaxprocs: int | None = Field(ge=1, description="An explicit GOMAXPROCS; None: unset.")


class Demand(_Doc):
    """CPU wanted per 100 ms window (usage + throttled time), over the window."""

    p50_millicores: int = Field(ge=0, description="Median window.")
    p99_millicores: int = Field(ge=0, description="99th percentile window.")
    max_millicores: int = Field(ge=0, description="The largest window.")


class Advice(_Doc):
    """What to set (``Recommendation.to_json``)."""

    limit_millicores: int | None = Field(ge=0, description="CPU limit; None: leave it.")
    burst_us: int = Field(ge=0, description="CFS burst, µs.")
    gomaxprocs: int | None = Field(ge=1, description="GOMAXPROCS to set; None: leave it.")
    jvm_processors: int | None = Field(ge=1, description="-XX:ActiveProcessorCount to set.")
    expected_throttle_ratio: float | None = Field(
        ge=0, description="The model's ratio under the recommendation; None: counters only."
    )
    expected_throttle_ratio_range: tuple[float, float] | None = Field(
        None,
        description="The expected ratio as a range over the demand on a shared node: beside "
        "the same neighbours (usage + throttled time) and if the node goes quiet (usage + "
        "wait, the end the limit is sized to); equal ends on a quiet node; None: counters.",
    )
    confidence: float = Field(ge=0, le=1, description="0–1: how much evidence, how fine.")
    reasons: tuple[str, ...] = Field(description="The estimator chain, step by step.")
    uncapped_limit_millicores: int | None = Field(
        None, ge=0, description="What the evidence asks for before bounds and step limits."
    )
    lower_limit_millicores: int | None = Field(
        None,
        ge=0,
        description="Set when made from throttled data: the limit is then an upper bound, and "
        "the limit the demand itself asks for lies between this and it.",
    )

    def expected_range(self) -> tuple[float, float] | None:
        """(beside the same neighbours, if the node goes quiet) when they differ, else None."""
        span = self.expected_throttle_ratio_range
        return span if span is not None and span[0] < span[1] else None

    def limit_range(self) -> tuple[int, int] | None:
        """(lower, upper) when the limit is the top of a range, else None."""
        low, high = self.lower_limit_millicores, self.limit_millicores
        return (low, high) if low is not None and high is not None and low < high else None


class Bucket(_Doc):
    """One bucket of the agent's cumulative per-window demand histogram."""

    le: float = Field(ge=0, description="Upper bound, cores; inf (``+Inf`` in JSON) last.")
    windows: float = Field(ge=0, description="Windows at or below ``le`` (cumulative).")

    @field_validator("le", mode="before")
    @classmethod
    def _inf(cls, value: Any) -> Any:
        return math.inf if value in {"+Inf", "Inf", "inf"} else value

    @field_serializer("le")
    def _le(self, value: float) -> float | str:
        return "+Inf" if math.isinf(value) else value

    @field_serializer("windows")
    def _windows(self, value: float) -> float | int:
        return int(value) if value.is_integer() else value


class Point(_Doc):
    """The throttle ratio over one step of the window."""

    t: float = Field(description="Unix time, seconds (the step's end).")
    ratio: float = Field(ge=0, description="Throttled periods over periods in the step.")


class Usage(_Doc):
    """CPU used over one step of the window, per pod."""

    t: float = Field(description="Unix time, seconds (the step's end).")
    cores: float = Field(ge=0, description="Mean over the pods, cores.")
    peak: float = Field(ge=0, description="The busiest pod's, cores.")


class Settings(_Doc):
    """A container's settings on one side of a change Apply made."""

    limit_millicores: int | None = Field(ge=0, description="CPU limit; None: no limit.")
    burst_us: int = Field(ge=0, description="CFS burst, µs.")
    gomaxprocs: int | None = Field(ge=1, description="GOMAXPROCS; None: unset.")


class AppliedContainer(_Doc):
    """One container Apply changed, and its throttling on each side of the change."""

    name: str
    before: Settings
    after: Settings
    expected_ratio: float | None = Field(None, ge=0, description="The model's, when applied.")
    verified_ratio: float | None = Field(
        None, ge=0, description="What the verification measured (an in-place canary's own)."
    )
    span_s: int = Field(0, ge=0, description="Length of each side, s; 0: not in the window.")
    ratio_before: float | None = Field(None, ge=0, description="From the counters, before.")
    ratio_after: float | None = Field(None, ge=0, description="… and after, as long a time.")
    after_from: float | None = Field(None, description="When the after side starts, Unix s.")


class Applied(_Doc):
    """What Apply changed on a Deployment (its ``unthrottle.io/last-applied`` record), when,
    and the verdict."""

    at: float = Field(description="When the change was made, Unix seconds.")
    policy: str
    method: str = Field("Rollout", description="Rollout or InPlace.")
    verdict: str = Field(description="kept, rolled back, still verifying or superseded.")
    verdict_at: float | None = None
    reason: str = Field("", description="Why the verdict is what it is.")
    canary: str | None = Field(None, description="InPlace: the pod resized and verified first.")
    containers: tuple[AppliedContainer, ...] = ()


@dataclass(frozen=True, slots=True)
class Change:
    """What a container's recommendation changes: (today, recommended) for each field that
    differs, None for the fields it leaves."""

    limit: tuple[int | None, int] | None
    burst_us: tuple[int, int] | None
    gomaxprocs: tuple[int | None, int] | None

    def __bool__(self) -> bool:
        return any(x is not None for x in (self.limit, self.burst_us, self.gomaxprocs))


NO_CHANGE = Change(None, None, None)


class BurstUsed(_Doc):
    """How much of its burst a container used over the window (cAdvisor's
    ``container_cpu_cfs_burst_{periods,seconds}_total``, or the agent's copies)."""

    periods: int = Field(ge=0, description="Periods that ran above the quota on the burst.")
    seconds: float = Field(ge=0, description="CPU time used above the quota, s.")


class Container(_Doc):
    """One container (``ContainerResult.to_json`` and the report's extras)."""

    name: str
    current: Current
    throttle_ratio: float | None = Field(ge=0, description="Periods throttled, today.")
    demand: Demand | None
    evidence: str = Field(description="period (agent windows), counters (cAdvisor) or none.")
    pods: int = Field(ge=0)
    recommendation: Advice | None
    runtime: str = Field("unknown", description="go, jvm, other or unknown.")
    managed: bool = Field(True, description="False: the policy leaves it out (never changed).")
    period_us: int = Field(DEFAULT_PERIOD_US, ge=1000, description="CFS period, µs.")
    histogram: tuple[Bucket, ...] = Field((), description="Cumulative, bounds ascending.")
    throttle_series: tuple[Point, ...] = Field((), description="Ratio over the window.")
    usage_series: tuple[Usage, ...] = Field((), description="CPU used over the window.")
    series_step_s: int | None = Field(None, ge=1, description="The series' step, s.")
    burst_used: BurstUsed | None = Field(
        None, description="Burst used over the window; absent where not exported."
    )

    def burst_note(self) -> str | None:
        """What the burst counters say of today's burst (None: no burst, or no counters)."""
        used, burst_us = self.burst_used, self.current.burst_us
        if used is None or not burst_us:
            return None
        if used.periods == 0:
            return (f"today's burst ({burst_us / 1000:g} ms) was never used in the window: "
                    "a burst that is never used was not needed")  # fmt: skip
        return (f"today's burst ({burst_us / 1000:g} ms) was used in {used.periods} periods, "
                f"{used.seconds:.1f} s of CPU above the quota")  # fmt: skip

    def notes(self) -> tuple[str, ...]:
        """The recommendation's reasons, then what the burst counters say."""
        reasons = self.recommendation.reasons if self.recommendation else ()
        note = self.burst_note()
        return (*reasons, note) if note else reasons

    @model_serializer(mode="wrap")
    def _always_histogram(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        data.setdefault("histogram", [])  # a field of ScanResult.to_json, even when empty
        return data

    def harm(self, target: float) -> float:
        """Throttling × how far over the target (``ContainerResult.harm``)."""
        ratio = self.throttle_ratio or 0.0
        return ratio * max(0.0, ratio - target)

    def over(self, target: float) -> bool:
        """More periods throttled than the target allows?"""
        return (self.throttle_ratio or 0.0) > target

    def change(self) -> Change:
        """What applying the recommendation would change (nothing for an unmanaged one)."""
        rec, now = self.recommendation, self.current
        if rec is None or not self.managed:
            return NO_CHANGE
        limit = rec.limit_millicores
        return Change(
            limit=(now.limit_millicores, limit)
            if limit is not None and limit != now.limit_millicores
            else None,
            burst_us=(now.burst_us, rec.burst_us) if rec.burst_us != now.burst_us else None,
            gomaxprocs=(now.gomaxprocs, rec.gomaxprocs)
            if rec.gomaxprocs is not None and rec.gomaxprocs != now.gomaxprocs
            else None,
        )

    def why_not(self, state: str | None) -> str | None:
        """Why there is no recommendation (None when there is one)."""
        if self.recommendation is not None:
            return None
        if state == "Skipped":
            return "skipped by the policy: opted out, or kept by an older policy"
        if not self.managed:
            return "left out by the policy's containers list"
        if self.evidence == "none":
            return "no CPU series in the window: idle, new, or not scraped"
        return "not enough evidence in the window for a recommendation"

    def shares(self) -> tuple[tuple[float, float, float], ...]:
        """The histogram as (lower bound, upper bound, share of windows) per bucket; the last
        (unbounded) bucket gets an upper bound a step past the last finite one."""
        total = self.histogram[-1].windows if self.histogram else 0.0
        if total <= 0:
            return ()
        out, low, before = [], 0.0, 0.0
        for bucket in self.histogram:
            high = bucket.le if math.isfinite(bucket.le) else max(low * 1.25, low + 0.25)
            out.append((low, high, max(0.0, bucket.windows - before) / total))
            low, before = high, bucket.windows
        return tuple(out)


class Workload(_Doc):
    """One workload: a Deployment, a StatefulSet or a DaemonSet. A report of an earlier
    version names only its ``deployment``: that is a Deployment's name."""

    namespace: str
    kind: Literal["Deployment", "StatefulSet", "DaemonSet"] = Field(
        description="The workload's kind (an earlier report has none: Deployment)."
    )
    name: str = Field(min_length=1, description="The workload's name.")
    deployment: str | None = Field(None, description="The name again, for a Deployment alone "
                                   "(the field earlier readers know).")  # fmt: skip
    containers: tuple[Container, ...]
    state: str | None = Field(None, description="The operator's: Recommended, UpToDate …")
    labels: dict[str, str] = Field(default_factory=dict, description="The Deployment's labels.")
    applied: Applied | None = Field(None, description="What Apply changed, and the verdict.")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        """``deployment`` alone (an earlier report) is a Deployment's name; a Deployment's
        ``name`` is its ``deployment`` too."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data.setdefault("kind", DEPLOYMENT)
        if not data.get("name") and data.get("deployment"):
            data["name"] = data["deployment"]
        if data.get("kind", DEPLOYMENT) == DEPLOYMENT and data.get("name"):
            data.setdefault("deployment", data["name"])
        return data

    @property
    def ref(self) -> str:
        """Its reference (:func:`~unthrottle.model.owners.ref`): ``web``, ``statefulset/db``."""
        return ref(self.kind, self.name)

    @property
    def shown(self) -> str:
        """``web`` for a Deployment, ``StatefulSet db`` else: how people read it."""
        return self.name if self.kind == DEPLOYMENT else f"{self.kind} {self.name}"

    @property
    def key(self) -> str:
        """``namespace/deployment``, ``namespace/statefulset/db``."""
        return f"{self.namespace}/{self.ref}"

    def harm(self, target: float) -> float:
        """Its most harmed container's."""
        return max((c.harm(target) for c in self.containers), default=0.0)

    def has_evidence(self) -> bool:
        """Does any container have a recommendation?"""
        return any(c.recommendation is not None for c in self.containers)

    def why_not(self) -> str:
        """Why a Deployment without recommendations has none."""
        if not self.containers:
            return "no containers found in Prometheus for it"
        whys = {c.why_not(self.state) for c in self.containers} - {None}
        return "; ".join(sorted(w for w in whys if w))


class PolicyRef(_Doc):
    """The ThrottlePolicy a report belongs to."""

    namespace: str
    name: str


class Truncation(_Doc):
    """A report cut to fit (a ConfigMap's 1 MiB, or ``--top``)."""

    shown: int = Field(ge=0)
    left_out: int = Field(ge=0)


@dataclass(frozen=True, slots=True)
class Offender:
    """A container over target, for the summary."""

    workload: Workload
    container: Container
    harm: float


@dataclass(frozen=True, slots=True)
class Summary:
    """Totals over the Deployments a report shows."""

    deployments: int
    containers: int
    with_evidence: int
    """Deployments with at least one recommendation."""
    over_target: int
    """Containers throttled in more periods than the target."""
    to_change: int
    """Containers whose recommendation changes a limit, burst or GOMAXPROCS."""
    added_millicores: int
    """CPU limit added, summed over the containers whose limit goes up."""
    raised: int
    freed_millicores: int
    """CPU limit freed, summed over the containers whose limit goes down."""
    lowered: int
    newly_limited: int
    """Containers without a limit today that get one."""
    worst: tuple[Offender, ...]
    """The containers over target, most harmed first (at most ``Report.summary``'s n)."""


class Report(_Doc):
    """A scan's result and where it comes from; most harmful Deployment first."""

    generated_at: str = Field(description="When the window ends, RFC 3339.")
    window: str = Field(description="The history read, as the user wrote it (7d).")
    target: float = Field(gt=0, lt=1, description="Throttle ratio to stay under.")
    workloads: tuple[Workload, ...]
    policy: PolicyRef | None = None
    truncated: Truncation | None = None
    prometheus: str | None = Field(None, description="Where the evidence was read.")
    notes: tuple[str, ...] = Field((), description="What the scan noted (counters only …).")

    @field_validator("prometheus")
    @classmethod
    def _no_secrets(cls, url: str | None) -> str | None:
        """Credentials in a URL (user:password@, ?token=) never reach a report."""
        if url is None:
            return None
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    # -- constructors ------------------------------------------------------------------

    @classmethod
    def from_json(cls, doc: Any) -> Self:
        """A report read back (``report.json``, ``recommend --format json``); a document
        that is not one raises :class:`ReportError` naming the first field at fault."""
        try:
            return cls.model_validate(doc)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the document"
            raise ReportError(f"not an unthrottle report: {where}: {first['msg']}") from None

    @classmethod
    def from_scan(
        cls,
        result: ScanResult,
        *,
        window: str | None = None,
        prometheus: str | None = None,
        policy: tuple[str, str] | None = None,
        states: dict[str, str] | None = None,
    ) -> Self:
        """The report of a scan: ``result.to_json`` and what only the result knows
        (runtimes, periods, labels), plus provenance and the operator's states."""
        doc = result.to_json(window or window_text(result.window_s))
        for w_doc, w in zip(doc["workloads"], result.workloads, strict=True):
            w_doc["labels"] = dict(w.labels)
            if states is not None:
                w_doc["state"] = states.get(w.deployment)  # by reference
            for c_doc, c in zip(w_doc["containers"], w.containers, strict=True):
                c_doc["runtime"] = c.runtime.value
                c_doc["managed"] = c.managed
                if c.recommendation is not None:
                    c_doc["period_us"] = c.recommendation.period_us
        if prometheus is not None:
            doc["prometheus"] = prometheus
        doc["notes"] = [p.message for p in result.problems]
        if policy is not None:
            doc["policy"] = {"namespace": policy[0], "name": policy[1]}
        return cls.from_json(doc)

    # -- views -------------------------------------------------------------------------

    @property
    def noun(self) -> str:
        """``Deployment`` for a report of Deployments alone, else ``workload``: what its
        pages call the rows' workloads."""
        return DEPLOYMENT if all(w.kind == DEPLOYMENT for w in self.workloads) else "workload"

    def to_json(self) -> dict[str, Any]:
        """The JSON document: ``ScanResult.to_json``'s fields, then the extras that differ
        from their defaults."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def top(self, n: int | None) -> Report:
        """The ``n`` most harmful Deployments (all for None), noting how many were left out."""
        if n is None or n >= len(self.workloads):
            return self
        before = self.truncated.left_out if self.truncated else 0
        cut = Truncation(shown=n, left_out=before + len(self.workloads) - n)
        return self.model_copy(update={"workloads": self.workloads[:n], "truncated": cut})

    def summary(self, worst: int = 5) -> Summary:
        """Totals, and the ``worst`` most harmed containers over target."""
        containers = [(w, c) for w in self.workloads for c in w.containers]
        changes = [(c, c.change()) for _, c in containers]
        limits = [ch.limit for _, ch in changes if ch.limit is not None]
        deltas = [new - old for old, new in limits if old is not None]
        over = [Offender(w, c, c.harm(self.target)) for w, c in containers if c.over(self.target)]
        over.sort(key=lambda o: -o.harm)
        return Summary(
            deployments=len(self.workloads),
            containers=len(containers),
            with_evidence=sum(1 for w in self.workloads if w.has_evidence()),
            over_target=len(over),
            to_change=sum(1 for _, ch in changes if ch),
            added_millicores=sum(d for d in deltas if d > 0),
            raised=sum(1 for d in deltas if d > 0),
            freed_millicores=-sum(d for d in deltas if d < 0),
            lowered=sum(1 for d in deltas if d < 0),
            newly_limited=sum(1 for old, _ in limits if old is None),
            worst=tuple(over[:worst]),
        )

    def applied(self) -> list[Workload]:
        """The Deployments Apply changed, the latest change first."""
        found = [w for w in self.workloads if w.applied is not None]
        return sorted(found, key=lambda w: -(w.applied.at if w.applied else 0.0))

    def over_target(self) -> list[tuple[Workload, Container]]:
        """Every container over target, most harmed first (the ones plots are drawn for)."""
        found = [(w, c) for w in self.workloads for c in w.containers if c.over(self.target)]
        return sorted(found, key=lambda wc: -wc[1].harm(self.target))

    def title(self) -> str:
        """The default title: the policy's, or the command's."""
        if self.policy is not None:
            return f"unthrottle: policy {self.policy.namespace}/{self.policy.name}"
        return "unthrottle recommend"


def window_text(seconds: int) -> str:
    """A window in seconds as a duration: 604800 → ``7d``, 5400 → ``90m``, 90 → ``90s``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
