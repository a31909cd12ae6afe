"""Lab scenario files: one workload and the CPU settings to run it under.

The format, and every cap and bound below, is defined in ``scenarios/README.md``.
A file is validated whole before anything runs; an error is one line that names
the file and the field (``runs[2].burst_ms: 60 ms is above the quota of 50 ms``).

What a file may not do, because each once did harm:

- be bigger than :data:`MAX_FILE_BYTES` or hold more than :data:`MAX_RUNS` runs
  (it would hang the lab with no progress);
- give a key twice (YAML keeps the last one silently: ``{cpus: 0.5, cpus: 4}``
  would run at 4 CPUs);
- give a boolean, a string or an infinite number where a number goes
  (``cpus: true`` would be 1 CPU), or a number outside its bounds;
- give a field that does nothing for its workload's kind (``seed`` for a
  ``serial`` workload): it would be silently ignored.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from unthrottle.units import MAX_PERIOD_US, MIN_PERIOD_US, MIN_QUOTA_US, Bandwidth
from unthrottle_lab.sim.tasks import Sidecar
from unthrottle_lab.workload import Kind, Workload

MAX_FILE_BYTES = 64 * 1024
"""A scenario is a few hundred bytes; 64 KiB leaves room for comments, not for a runaway."""
MAX_RUNS = 200
"""Runs per file: each is seconds of lab time; 200 is an afternoon, not a hang."""
MAX_LATENCIES = 100_000
"""Tasks a run may time (serial: tasks × workers): the simulator's and the lab's memory."""
MAX_CPUS = 1024.0
"""The largest limit a run may ask for: more CPUs than any machine the lab runs on."""
MAX_TASK_CPU_MS = 10_000.0
"""10 s of CPU per task: beyond that a run takes hours."""
MAX_THINK_MS = 60_000.0
"""A minute of idle time between tasks or rounds."""
MAX_RATE_PER_S = 10_000.0
"""The lab's dispatcher keeps up with about this many arrivals per second."""
MAX_SEED = 2**32 - 1


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the field."""


# A number in a scenario is a real, finite number: not a boolean, not a string.
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Count = Annotated[int, Field(strict=True)]

_ONLY_FOR = {"think_ms": {"serial", "batch"}, "rate_per_s": {"open"}, "seed": {"open"}}
"""Fields that only some kinds use; given for another kind, they are refused, not ignored."""


class WorkloadSpec(BaseModel):
    """What each task costs and how tasks arrive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["serial", "batch", "open"] = Field(description="How tasks reach the workers.")
    task_cpu_ms: Number = Field(
        gt=0, le=MAX_TASK_CPU_MS, description="CPU time each task burns, ms."
    )
    workers: Count = Field(1, ge=1, le=256, description="Processes (serial, batch) or pool size.")
    tasks: Count = Field(
        100, ge=1, le=MAX_LATENCIES, description="Tasks per worker (serial), rounds, or requests."
    )
    think_ms: Number = Field(
        0,
        ge=0,
        le=MAX_THINK_MS,
        description="serial: idle time between a worker's tasks; batch: between rounds, ms "
        "(0: back to back).",
    )
    rate_per_s: Number | None = Field(
        None, gt=0, le=MAX_RATE_PER_S, description="open: Poisson arrival rate, per second."
    )
    seed: Count = Field(1, ge=0, le=MAX_SEED, description="open: seed of the arrival sequence.")

    @model_validator(mode="after")
    def _fits_the_kind(self) -> WorkloadSpec:
        for name, kinds in _ONLY_FOR.items():
            if name in self.model_fields_set and self.kind not in kinds:
                users = " and ".join(sorted(kinds)) + (" use" if len(kinds) > 1 else " uses")
                article = "an" if self.kind == "open" else "a"
                raise ValueError(
                    f"{name}: has no effect on {article} {self.kind} workload "
                    f"(only {users} it); remove it"
                )
        if self.kind == "open" and self.rate_per_s is None:
            raise ValueError("rate_per_s: an open workload needs an arrival rate")
        if self.kind == "serial" and self.tasks * self.workers > MAX_LATENCIES:
            raise ValueError(
                f"tasks: {self.tasks} tasks × {self.workers} workers is more than "
                f"{MAX_LATENCIES:,} tasks per run"
            )
        return self

    def to_workload(self) -> Workload:
        """The plain-data workload the lab and the model take (µs inside)."""
        return Workload(
            kind=Kind(self.kind),
            task_cpu_us=round(self.task_cpu_ms * 1000),
            workers=self.workers,
            tasks=self.tasks,
            think_us=round(self.think_ms * 1000),
            rate_per_s=self.rate_per_s or 10.0,
            seed=self.seed,
        )


class SidecarSpec(BaseModel):
    """A second container in the run's pod: its own workload, limit and burst, on the run's
    period. The pod's quota is the sum of the two containers' quotas (a kubelet's), and its
    burst the sum of their bursts, clamped to its quota (the agent's, ``agent/burst.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadSpec = Field(description="What the sidecar runs, beside the run's workload.")
    cpus: Number = Field(
        gt=0,
        le=MAX_CPUS,
        description="The sidecar's limit in CPUs; quota = cpus × the run's period.",
    )
    burst_ms: Number = Field(0, ge=0, description="The sidecar's CFS burst, ms; at most its quota.")


class RunSpec(BaseModel):
    """One run's CPU settings; ``{}`` is no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: Number | None = Field(
        None, gt=0, le=MAX_CPUS, description="Limit in CPUs; quota = cpus × period."
    )
    period_ms: Number = Field(
        100, ge=MIN_PERIOD_US / 1000, le=MAX_PERIOD_US / 1000, description="CFS period, ms."
    )
    burst_ms: Number = Field(0, ge=0, description="CFS burst, ms; at most the quota.")
    other_threads: int = Field(
        0,
        ge=0,
        le=256,
        strict=True,
        description="Busy threads of other processes on the machine during the run, outside "
        "the measured cgroup (contention): the lab starts them, the model shares the cores "
        "with them.",
    )
    pod_quota: bool = Field(
        False,
        strict=True,
        description="Run the workload in a container cgroup inside a pod cgroup whose quota is "
        "the run's limit, on the same period and with no burst, as a kubelet makes a "
        "one-container pod whose containers all have limits.",
    )
    sidecar: SidecarSpec | None = Field(
        None,
        description="A second container in the run's pod, with its own workload and limit: "
        "both run in container cgroups inside a pod cgroup whose quota is the sum of theirs "
        "(and whose burst is the sum of their bursts), as a kubelet and the agent make a "
        "two-container pod whose containers all have limits.",
    )
    ratio_tolerance: Number | None = Field(
        None,
        gt=0,
        lt=1,
        description="How far the model's throttle ratio may be from the kernel's for this run "
        "(default 0.05, absolute). Only for a run on a knife's edge, with the reason beside it.",
    )
    latency_tolerance: Number | None = Field(
        None,
        gt=0,
        lt=1,
        description="How far the model's p50 and p95 may be from the kernel's for this run, as a "
        "share of the measurement (default 0.15). Only for a run on a knife's edge, with the "
        "measured spread beside it.",
    )

    @model_validator(mode="after")
    def _kernel_accepts(self) -> RunSpec:
        if self.cpus is None:
            if self.burst_ms:
                raise ValueError("burst_ms: a burst needs a limit (cpus)")
            if self.pod_quota:
                raise ValueError("pod_quota: a pod quota is the run's limit; give cpus")
            if self.sidecar is not None:
                raise ValueError(
                    "sidecar: a pod's quota needs a limit on every container; give cpus"
                )
            return self
        quota_ms = self.cpus * self.period_ms
        if quota_ms * 1000 < MIN_QUOTA_US:
            raise ValueError(
                f"cpus: a quota of {quota_ms:g} ms (cpus × period_ms) is under the kernel's 1 ms"
            )
        if self.burst_ms > quota_ms + 1e-9:
            raise ValueError(
                f"burst_ms: {self.burst_ms:g} ms is above the quota of {quota_ms:g} ms"
            )
        if self.sidecar is not None:
            self._sidecar_accepted(self.sidecar)
        return self

    def _sidecar_accepted(self, sidecar: SidecarSpec) -> None:
        if "pod_quota" in self.model_fields_set and not self.pod_quota:
            raise ValueError("pod_quota: a run with a sidecar is a pod whose quota is the sum "
                             "of both limits; leave pod_quota out or true")  # fmt: skip
        quota_ms = sidecar.cpus * self.period_ms
        if quota_ms * 1000 < MIN_QUOTA_US:
            raise ValueError(f"sidecar: a quota of {quota_ms:g} ms (cpus × the run's period_ms) "
                             "is under the kernel's 1 ms")  # fmt: skip
        if sidecar.burst_ms > quota_ms + 1e-9:
            raise ValueError(f"sidecar: burst_ms {sidecar.burst_ms:g} ms is above its quota of "
                             f"{quota_ms:g} ms")  # fmt: skip

    def bandwidth(self) -> Bandwidth:
        """The kernel settings this run asks for (integers, µs)."""
        period_us = round(self.period_ms * 1000)
        if self.cpus is None:
            return Bandwidth(None, period_us)
        quota_us = round(self.cpus * period_us)
        return Bandwidth(quota_us, period_us, min(round(self.burst_ms * 1000), quota_us))

    @property
    def in_pod(self) -> bool:
        """Whether the run's workers go into a pod cgroup with a quota (``pod_quota`` or a
        ``sidecar``)."""
        return self.pod_quota or self.sidecar is not None

    def sidecar_bandwidth(self) -> Bandwidth | None:
        """The sidecar's settings on the run's period (integers, µs); None without one."""
        if self.sidecar is None:
            return None
        period_us = round(self.period_ms * 1000)
        quota_us = round(self.sidecar.cpus * period_us)
        return Bandwidth(quota_us, period_us, min(round(self.sidecar.burst_ms * 1000), quota_us))

    def sidecar_as_given(self) -> dict[str, float]:
        """The sidecar's settings as the file gave them, without its workload (its figures'
        ``limit``); empty without one."""
        if self.sidecar is None:
            return {}
        return self.sidecar.model_dump(exclude_unset=True, exclude={"workload"})

    def task_sidecar(self) -> Sidecar | None:
        """The sidecar as the task model takes it (``simulate_tasks(…, sidecar=)``); None
        without one."""
        bandwidth = self.sidecar_bandwidth()
        if self.sidecar is None or bandwidth is None:
            return None
        workload = self.sidecar.workload.to_workload()
        return Sidecar(workload, bandwidth, limit=self.sidecar_as_given())

    def pod_bandwidth(self) -> Bandwidth | None:
        """The pod cgroup's settings: the sum of its containers' quotas on the run's period
        (a kubelet's); with a sidecar, the sum of the two bursts clamped to that quota (the
        agent's), and with one container (``pod_quota``) no burst (the kubelet writes none).
        None when the run has no pod quota."""
        if not self.in_pod:
            return None
        own = self.bandwidth()
        assert own.quota_us is not None
        side = self.sidecar_bandwidth()
        if side is None:
            return Bandwidth(own.quota_us, own.period_us)
        assert side.quota_us is not None
        quota_us = own.quota_us + side.quota_us
        return Bandwidth(quota_us, own.period_us, min(own.burst_us + side.burst_us, quota_us))

    def as_given(self) -> dict[str, float]:
        """The settings exactly as the file gave them (for the output's ``limit``)."""
        return self.model_dump(exclude_unset=True, exclude={"ratio_tolerance", "latency_tolerance"})

    def label(self) -> str:
        """A short human label: ``no limit``, ``0.5 CPU, 10 ms period``."""
        parts = [f"{self.cpus:g} CPU" if self.cpus is not None else "no limit"]
        if self.cpus is not None and self.period_ms != 100:
            parts.append(f"{self.period_ms:g} ms period")
        if self.burst_ms:
            parts.append(f"{self.burst_ms:g} ms burst")
        if self.sidecar is not None:
            side = f"sidecar {self.sidecar.cpus:g} CPU"
            if self.sidecar.burst_ms:
                side += f" ({self.sidecar.burst_ms:g} ms burst)"
            parts.append(side)
        if self.in_pod:
            parts.append("pod quota")
        if self.other_threads:
            parts.append(f"{self.other_threads} other busy thread{'s' * (self.other_threads > 1)}")
        return ", ".join(parts)


class Scenario(BaseModel):
    """A named workload and the runs to measure it under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        strict=True,
        min_length=1,
        max_length=100,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Short name, used in tables (one line).",
    )
    workload: WorkloadSpec
    runs: list[RunSpec] = Field(min_length=1, max_length=MAX_RUNS, description="One entry per run.")


_OWN_FIELDS = (
    set(WorkloadSpec.model_fields) | set(RunSpec.model_fields) | set(SidecarSpec.model_fields)
)
"""Our validators' messages start with the field's name (``cpus: …``)."""
_PLAIN = {
    "float_type": "is not a number",
    "bool_type": "is not true or false",
    "int_type": "is not a whole number",
    "int_from_float": "is not a whole number",
    "string_type": "is not text",
    "finite_number": "is not a finite number",
    "dict_type": "is not a mapping",
    "model_type": "is not a mapping",
    "list_type": "is not a list",
}
"""Pydantic's type errors, in words that say what the file gave."""
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", "≥"),
           "less_than": ("lt", "<"), "less_than_equal": ("le", "≤")}  # fmt: skip


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _shown(value: Any) -> str:
    """A value as the file wrote it (YAML's true, null, .inf), cut short."""
    if isinstance(value, float) and math.isnan(value):
        text = ".nan"
    elif isinstance(value, float) and value in (float("inf"), float("-inf")):
        text = "-.inf" if value < 0 else ".inf"
    elif isinstance(value, bool | int | float | str) or value is None:
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "…"


def _problem(problem: Any) -> str:
    path = _field_path(problem["loc"])
    message = problem["msg"].removeprefix("Value error, ")
    head = message.split(":", 1)[0].strip()
    if head in _OWN_FIELDS:
        # the model whose validator spoke: the path, less the field if the path ends in it
        where = path.removesuffix(f".{head}") if path != head else ""
        return f"{where + '.' if where else ''}{message}"
    if problem["type"] in _PLAIN:
        message = f"{_shown(problem['input'])} {_PLAIN[problem['type']]}"
    elif problem["type"] in _BOUNDS:
        key, sign = _BOUNDS[problem["type"]]
        bound = problem["ctx"][key]
        message = f"{_shown(problem['input'])} is out of bounds (it must be {sign} {bound:g})"
    elif problem["type"] == "string_pattern_mismatch":
        message = "must be one line of text (no control characters)"
    elif problem["type"] == "too_long" and path == "runs":
        message = f"{len(problem['input'])} runs; a file holds at most {MAX_RUNS}"
    return f"{path}: {message}" if path else message


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a scenario given as plain data; errors name the field."""
    if data is None:
        raise ScenarioError(f"{source}: the file is empty (it needs name, workload and runs)")
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{source}: the file holds {_shown(data)}, not a mapping of name, workload and runs"
        )
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        lines = [_problem(problem) for problem in err.errors()]
        raise ScenarioError(f"{source}: " + "; ".join(lines)) from None


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping; ``1e3`` is a number
    (as in YAML 1.2 and JSON; YAML 1.1 reads it as text)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges on purpose; its keys may be overridden
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                first = seen[key].line + 1
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"{key!s} is given twice (first on line {first}); give each field once",
                    key_node.start_mark,
                )  # fmt: skip
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_reason(err: yaml.YAMLError) -> str:
    """The parser's own reason and where, on one line."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        reason = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
        if err.context:
            reason += f" ({err.context})"
    else:
        reason = str(err)
    return " ".join(reason.split())


def load_scenario(path: Path) -> Scenario:
    """Read and validate one scenario file (UTF-8 YAML, at most :data:`MAX_FILE_BYTES`)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read: {err.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(
            f"{path}: bigger than {MAX_FILE_BYTES // 1024} KiB; a scenario file is a few lines"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ScenarioError(
            f"{path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})"
        ) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {_yaml_reason(err)}") from None
    return parse_scenario(data, str(path))
