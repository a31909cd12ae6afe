"""Where a reconcile's evidence comes from: the whole window, or what is new since last time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from unthrottle.metrics.evidence import ContainerEvidence, WorkloadKey
from unthrottle.metrics.source import MetricsSource
from unthrottle.scan import EngineCache, Problem, ScanRequest, Selection, gather


@dataclass
class PolicyMemory:
    """What the operator keeps per policy between reconciles (rebuilt from the checkpoint
    after a restart)."""

    cache: EngineCache = field(default_factory=EngineCache)
    aggregates: Any = None
    """The folded evidence (``unthrottle.metrics.aggregates.WindowAggregates``), if any."""
    window_s: int | None = None
    failures: int = 0
    last_fault: str | None = None
    last_signature: object = None
    warned_generation: int | None = None
    samples_read: int = 0


class EvidenceReader(Protocol):
    """Reads a policy's evidence for one reconcile."""

    def read(
        self, memory: PolicyMemory, request: ScanRequest, selection: Selection,
        *, policy: dict[str, Any],
    ) -> tuple[dict[WorkloadKey, ContainerEvidence], list[Problem]]:  # fmt: skip
        """The window's evidence for the selection, and notes on it."""
        ...


class FullWindowReader:
    """Reads the whole window every time, as ``unthrottle recommend`` does."""

    def __init__(self, metrics: MetricsSource) -> None:
        self.metrics = metrics

    def read(
        self, memory: PolicyMemory, request: ScanRequest, selection: Selection,
        *, policy: dict[str, Any],
    ) -> tuple[dict[WorkloadKey, ContainerEvidence], list[Problem]]:  # fmt: skip
        return gather(request, self.metrics, selection)
