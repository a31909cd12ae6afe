"""One scan pipeline for every front-end: select Deployments → evidence → recommend → result.

``unthrottle recommend`` and the operator both call it. It neither prints nor exits:
problems come back in the result (:class:`Problem`) or as exceptions
(:class:`ScanError`, :class:`~unthrottle.metrics.source.MetricsError`).
"""

from unthrottle.scan.pipeline import (
    ClusterError,
    ScanError,
    Selection,
    assess,
    current_of,
    gather,
    scan,
    select,
    where,
)
from unthrottle.scan.request import History, ScanRequest
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
    "WorkloadResult",
    "assess",
    "current_of",
    "gather",
    "plotted",
    "scan",
    "select",
    "where",
    "with_series",
]
