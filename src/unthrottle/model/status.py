"""The ThrottlePolicy custom resource's status, as pydantic models.

Written by the operator alone, declared in the CRD (generated from these
models, like the spec) so that a structural schema prunes none of it. Field
names are the resource's (camelCase aliases); ``model_dump(by_alias=True)``
gives the status exactly as it is patched, timestamps as ``2026-12-01T10:00:00Z``.
Reading a status back ignores fields it does not know (an older or newer operator's).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Timestamp = Annotated[AwareDatetime, PlainSerializer(_rfc3339, return_type=str)]
"""A time with its zone; written as Kubernetes does, ``2026-12-01T10:00:00Z``."""


class _Status(BaseModel):
    """The status's models: camelCase; unknown fields (an older or newer operator's) ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="ignore"
    )


class Summary(_Status):
    """Totals over the policy's workloads at the last run."""

    deployments: int = Field(
        0, ge=0, description="Workloads the policy selects, of every kind it covers "
        "(the field keeps the name it had when only Deployments were covered).")  # fmt: skip
    containers: int = Field(0, ge=0, description="Containers managed in them.")
    over_target: int = Field(
        0, ge=0, description="Containers throttled more than targetThrottleRatio."
    )
    worst_throttle_ratio: float | None = Field(
        None, ge=0, le=1, description="The highest throttle ratio of any container; null: no data."
    )
    left_out: int = Field(
        0, ge=0, description="Deployments selected but left out of workloads (status size)."
    )


class CurrentSettings(_Status):
    """A container's CPU settings today."""

    cpu_limit: str | None = Field(None, description="The CPU limit; null: none.")
    cpu_request: str | None = Field(None, description="The CPU request; null: none.")
    burst: str | None = Field(None, description="The CFS burst, e.g. 0ms; null: unknown.")
    gomaxprocs: int | None = Field(None, description="An explicit GOMAXPROCS; null: not set.")


class RecommendedSettings(_Status):
    """What the operator recommends (or applied) for a container."""

    cpu_limit: str | None = Field(None, description="The CPU limit to set; null: leave it.")
    cpu_limit_lower_bound: str | None = Field(
        None,
        description="Set when made from throttled data: cpuLimit is then an upper bound, and the "
        "limit the demand itself asks for lies between this and it (refined once applied).",
    )
    burst: str | None = Field(None, description="The CFS burst to set, e.g. 20ms; null: leave it.")
    gomaxprocs: int | None = Field(None, description="The GOMAXPROCS to set; null: leave it.")


class ContainerStatus(_Status):
    """One container of a Deployment: its settings, its throttling, and the recommendation."""

    name: str = Field(description="The container's name.")
    current: CurrentSettings = Field(description="Its settings today.")
    recommended: RecommendedSettings | None = Field(
        None, description="The recommendation; null: none (no data, or up to date)."
    )
    throttle_ratio: float | None = Field(
        None, ge=0, le=1, description="Throttled share of active periods over the window."
    )
    expected_throttle_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="The model's ratio under the recommendation; null: counters only.",
    )
    expected_throttle_ratio_range: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="[beside the same neighbours, if the node goes quiet]: the expected ratio "
        "over the demand on a shared node, from usage + throttled time to usage + wait (the "
        "end the limit is sized to); equal ends on a quiet node; null: counters only.",
    )
    confidence: float = Field(0.0, ge=0, le=1, description="0-1: how much evidence there was.")
    evidence: Literal["period", "counters", "none"] = Field(
        "none",
        description="period: per-period demand from the node agent; counters: cAdvisor "
        "counters only; none: no data.",
    )
    reason: str = Field("", description="Why this recommendation, for people.")


class WorkloadStatus(_Status):
    """One workload the policy selects: a Deployment, a StatefulSet or a DaemonSet."""

    deployment: str = Field(
        description="The workload's reference, the list's key: a Deployment's name, or "
        "statefulset/<name>, daemonset/<name>.")  # fmt: skip
    kind: Literal["Deployment", "StatefulSet", "DaemonSet"] = Field(
        "Deployment", description="The workload's kind.")  # fmt: skip
    name: str = Field("", description="The workload's name.")
    state: Literal[
        "Recommended", "UpToDate", "NoData", "Skipped", "Applied", "Verifying", "RolledBack"
    ] = Field(description="Where the Deployment stands; see docs/throttlepolicy.md.")
    message: str = Field("", description="The state, explained for people.")
    containers: list[ContainerStatus] = Field(
        default_factory=list,
        description="Its managed containers.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class Condition(_Status):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(max_length=316, description="The condition's type in CamelCase, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Why, in CamelCase, for programs.",
    )
    message: str = Field("", max_length=32768, description="Why, for people.")
    last_transition_time: Timestamp = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        None, ge=0, description="The spec's generation the condition was set for."
    )


class ThrottlePolicyStatus(_Status):
    """What the operator found and did, written by the operator alone."""

    observed_generation: int | None = Field(
        None, ge=0, description="The spec's generation the last run used."
    )
    last_run: Timestamp | None = Field(None, description="When the policy was last evaluated.")
    last_good_run: Timestamp | None = Field(None, description="When an evaluation last succeeded.")
    summary: Summary = Field(default_factory=Summary, description="Totals.")
    workloads: list[WorkloadStatus] = Field(
        default_factory=list,
        description="The selected workloads; those left out to keep the status small are "
        "counted in summary.leftOut.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["deployment"],
        },
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions; Ready says whether the last run succeeded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
