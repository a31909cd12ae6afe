"""Lab scenario files: one workload and the CPU settings to run it under.

The format is defined in ``scenarios/README.md``. A file is validated whole
before anything runs; an error names the file and the field
(``runs[2].burst_ms: 60 ms is above the quota of 50 ms``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from unthrottle.cfs.settings import MAX_PERIOD_US, MIN_PERIOD_US, MIN_QUOTA_US, Bandwidth
from unthrottle.cfs.workload import Kind, Workload


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the field."""


PositiveMs = Annotated[float, Field(gt=0)]


class WorkloadSpec(BaseModel):
    """What each task costs and how tasks arrive."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["serial", "batch", "open"] = Field(description="How tasks reach the workers.")
    task_cpu_ms: PositiveMs = Field(description="CPU time each task burns, ms.")
    workers: int = Field(1, ge=1, le=256, description="Processes (serial, batch) or pool size.")
    tasks: int = Field(
        100, ge=1, le=100_000, description="Tasks per worker (serial), rounds, or requests."
    )
    think_ms: float = Field(0, ge=0, description="serial: idle time between a worker's tasks, ms.")
    rate_per_s: float | None = Field(
        None, gt=0, description="open: Poisson arrival rate, requests per second."
    )
    seed: int = Field(1, description="open: seed of the arrival sequence.")

    @model_validator(mode="after")
    def _open_needs_rate(self) -> WorkloadSpec:
        if self.kind == "open" and self.rate_per_s is None:
            raise ValueError("rate_per_s: an open workload needs an arrival rate")
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


class RunSpec(BaseModel):
    """One run's CPU settings; ``{}`` is no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(None, gt=0, description="Limit in CPUs; quota = cpus × period.")
    period_ms: float = Field(
        100, ge=MIN_PERIOD_US / 1000, le=MAX_PERIOD_US / 1000, description="CFS period, ms."
    )
    burst_ms: float = Field(0, ge=0, description="CFS burst, ms; at most the quota.")

    @model_validator(mode="after")
    def _kernel_accepts(self) -> RunSpec:
        if self.cpus is None:
            if self.burst_ms:
                raise ValueError("burst_ms: a burst needs a limit (cpus)")
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
        return self

    def bandwidth(self) -> Bandwidth:
        """The kernel settings this run asks for (integers, µs)."""
        period_us = round(self.period_ms * 1000)
        if self.cpus is None:
            return Bandwidth(None, period_us)
        quota_us = round(self.cpus * period_us)
        return Bandwidth(quota_us, period_us, min(round(self.burst_ms * 1000), quota_us))

    def as_given(self) -> dict[str, float]:
        """The settings exactly as the file gave them (for the output's ``limit``)."""
        return {k: v for k, v in self.model_dump(exclude_unset=True).items()}

    def label(self) -> str:
        """A short human label: ``no limit``, ``0.5 CPU, 10 ms period``."""
        if self.cpus is None:
            return "no limit"
        parts = [f"{self.cpus:g} CPU"]
        if self.period_ms != 100:
            parts.append(f"{self.period_ms:g} ms period")
        if self.burst_ms:
            parts.append(f"{self.burst_ms:g} ms burst")
        return ", ".join(parts)


class Scenario(BaseModel):
    """A named workload and the runs to measure it under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Short name, used in tables.")
    workload: WorkloadSpec
    runs: list[RunSpec] = Field(min_length=1, description="One entry per run.")


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a scenario given as plain data; errors name the field."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        lines = []
        for problem in err.errors():
            path = _field_path(problem["loc"])
            message = problem["msg"].removeprefix("Value error, ")
            if message.split(":", 1)[0].strip() in {"rate_per_s", "cpus", "burst_ms"}:
                # Our own messages already start with the field's name.
                where = path.rsplit(".", 1)[0] if "." in path or path else ""
                lines.append(f"{where + '.' if where else ''}{message}")
            elif path:
                lines.append(f"{path}: {message}")
            else:
                lines.append(message)
        raise ScenarioError(f"{source}: " + "; ".join(lines)) from None


def load_scenario(path: Path) -> Scenario:
    """Read and validate one scenario file."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {err}") from None
    return parse_scenario(data, str(path))
