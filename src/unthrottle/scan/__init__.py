"""One scan pipeline for every front-end: select workloads → evidence → recommend → result.

``unthrottle recommend`` and the operator both call it. It neither prints nor exits:
problems come back in the result (:class:`Problem`) or as exceptions
(:class:`ScanError`, :class:`~unthrottle.metrics.source.MetricsError`).

Front-ends reach the evidence through it alone (an import-linter contract): the keys and
containers' evidence, a batch fetched for a check after a patch (:func:`fetch_evidence`), a
canary pod's ratios (:func:`canary_ratios`).
"""

from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.evidence.fetching import fetch as fetch_evidence
from unthrottle.evidence.pods import canary_ratios
from unthrottle.scan.pipeline import (
    ClusterError,
    ScanError,
    Selection,
    assess,
    current_of,
    gather,
    kinds_text,
    scan,
    select,
    where,
)
from unthrottle.scan.request import History, ScanRequest, engine_policy
from unthrottle.scan.result import (
    FATAL,
    ContainerResult,
    Problem,
    ProblemKind,
    ScanResult,
    WorkloadResult,
)
from unthrottle.scan.reuse import EngineCache, ReuseSettings
from unthrottle.scan.series import PLOTTED, plotted, with_series

__all__ = [
    "FATAL",
    "PLOTTED",
    "ClusterError",
    "ContainerEvidence",
    "ContainerResult",
    "EngineCache",
    "History",
    "Problem",
    "ProblemKind",
    "ReuseSettings",
    "ScanError",
    "ScanRequest",
    "ScanResult",
    "Selection",
    "Slot",
    "WorkloadKey",
    "WorkloadResult",
    "assess",
    "canary_ratios",
    "current_of",
    "engine_policy",
    "fetch_evidence",
    "gather",
    "kinds_text",
    "plotted",
    "scan",
    "select",
    "where",
    "with_series",
]
