"""Where a reconcile's evidence comes from: the whole window, or what is new since last time."""

from __future__ import annotations

import base64
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from unthrottle.evidence.aggregates import CheckpointError
from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import fetch
from unthrottle.evidence.incremental import fetch_slots
from unthrottle.evidence.sliding import Read, SlidingEvidence
from unthrottle.kube.objects import NotOwnedError, ObjectStore, owned_by
from unthrottle.metrics.source import MetricsSource
from unthrottle.scan import EngineCache, Problem, ScanRequest, Selection, gather

_log = logging.getLogger("unthrottle.operator")


@dataclass
class PolicyMemory:
    """What the operator keeps per policy between reconciles (rebuilt from the checkpoint
    after a restart)."""

    cache: EngineCache = field(default_factory=EngineCache)
    aggregates: Any = None
    """The folded evidence (``unthrottle.evidence.sliding.SlidingEvidence``), if any."""
    failures: int = 0
    last_fault: str | None = None
    last_signature: str | None = None
    """The decisions of the last summary event (an event only when they change)."""
    report_signature: str | None = None
    """The decisions the report ConfigMap was last written with, and when."""
    report_at: float = 0.0
    warned_generation: int | None = None
    not_owned: dict[str, str] = field(default_factory=dict)
    """ConfigMap name → why the policy left it untouched (one of its name that it does not
    own); an entry goes when that ConfigMap is written again."""
    not_owned_said: frozenset[str] = frozenset()
    """The refusals the last ConfigMapNotOwned event named (an event only when they change)."""


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


CHECKPOINT_LABEL = "unthrottle.io/checkpoint-of"


class IncrementalReader:
    """Reads the window once, then only what is new (and what aged out), and keeps the
    result checkpointed in ConfigMaps owned by the policy (``<policy>-evidence``, and
    ``-evidence-1`` … when it passes one ConfigMap's size), so a restarted operator reads
    only the gap. Raw series only: incremental reads are a few minutes of samples, which
    recording rules would not make cheaper."""

    def __init__(self, metrics: MetricsSource, objects: ObjectStore, *, concurrency: int = 3,
                 max_bytes: int = 900 * 1024) -> None:  # fmt: skip
        """Reads happen at the request's clock (``ScanRequest.now``), never this process's."""
        self.metrics = metrics
        self.objects = objects
        self.concurrency = concurrency
        self.max_bytes = max_bytes
        self.reads: list[Read] = []
        """The reads of the last call (for logs and the benchmark)."""

    def read(
        self, memory: PolicyMemory, request: ScanRequest, selection: Selection,
        *, policy: dict[str, Any],
    ) -> tuple[dict[WorkloadKey, ContainerEvidence], list[Problem]]:  # fmt: skip
        state = memory.aggregates
        if not isinstance(state, SlidingEvidence) or state.window_s != request.window_s:
            state = self._restore(policy, request.window_s)
        now = request.now
        namespaces = list(request.namespaces)
        self.reads = state.plan(now)
        if not self.reads:  # nothing new to read: still, say so when Prometheus is down
            self.metrics.instant("vector(1)", now)
        for read in self.reads:
            if read.kind == "head":
                slots = fetch_slots(self.metrics, namespaces, read.start, read.end,
                                    slot_s=state.slot_s, owners=selection.owners,
                                    concurrency=self.concurrency)  # fmt: skip
            else:
                span = max(1, math.floor(read.end - read.start))
                found = fetch(self.metrics, namespaces, span, at=read.start + span,
                              owners=selection.owners, concurrency=self.concurrency)  # fmt: skip
                slots = [Slot(read.start, read.start + span, found)]
            state.fold(read, slots)
        memory.aggregates = state
        self._checkpoint(policy, state, memory)
        return state.evidence(now), []

    def _names(self, policy: dict[str, Any], count: int) -> list[str]:
        base = f"{policy['metadata']['name']}-evidence"
        return [base if i == 0 else f"{base}-{i}" for i in range(count)]

    def _restore(self, policy: dict[str, Any], window_s: int) -> SlidingEvidence:
        """The checkpoint, when there is one for this window; else a fresh start."""
        namespace = policy["metadata"]["namespace"]
        chunks: list[bytes] = []
        for name in self._names(policy, 64):
            found = self.objects.configmap(namespace, name)
            if found is None or not owned_by(found, policy):  # never another's data
                break
            data = (found.get("binaryData") or {}).get("checkpoint")
            if data is None:
                break
            chunks.append(base64.b64decode(data))
        if not chunks:
            return SlidingEvidence(window_s)
        try:
            state = SlidingEvidence.from_bytes(b"".join(chunks))
        except CheckpointError as error:
            _log.warning("policy %s/%s: the evidence checkpoint is unusable (%s): reading the "
                         "whole window", namespace, policy["metadata"]["name"], error)  # fmt: skip
            return SlidingEvidence(window_s)
        return state if state.window_s == window_s else SlidingEvidence(window_s)

    def _checkpoint(self, policy: dict[str, Any], state: SlidingEvidence,
                    memory: PolicyMemory) -> None:  # fmt: skip
        """Write the checkpoint's pieces; at a piece of another's name, stop there (the
        evidence stays in memory, and the policy says which ConfigMap is in the way)."""
        meta = policy["metadata"]
        data = state.to_bytes()
        chunks = [data[i : i + self.max_bytes] for i in range(0, len(data), self.max_bytes)]
        names = self._names(policy, len(chunks) + 1)
        for name, chunk in zip(names, chunks, strict=False):
            try:
                self.objects.put_configmap(
                    meta["namespace"], name, owner=policy,
                    binary_data={"checkpoint": base64.b64encode(chunk).decode()},
                    labels={CHECKPOINT_LABEL: meta["name"],
                            "app.kubernetes.io/managed-by": "unthrottle"},
                )  # fmt: skip
            except NotOwnedError as error:
                memory.not_owned[name] = str(error)
                return
            memory.not_owned.pop(name, None)
        # a shorter checkpoint than last time: the next piece, if any, must not be read back
        found = self.objects.configmap(meta["namespace"], names[-1])
        if found is not None and owned_by(found, policy):
            self.objects.put_configmap(meta["namespace"], names[-1], owner=policy,
                                       labels={CHECKPOINT_LABEL: meta["name"]})  # fmt: skip
